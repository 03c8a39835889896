"""Prefill once: a prompt's KV cache kept on disk in blocks of BLOCK_TOKENS tokens, so a document, a long system
prompt or a conversation pays its prefill one time, across restarts. Torch-free.

Keying: a block's name is a chained sha256 (block i's key hashes block i-1's key and its own token ids), started from
an identity digest of everything the cache's bits depend on: this format's version, the weights file's sha256
(memoised by path, size and modification time), the tokenizer's and the chat template's digests, the KV dtype and
layout, and RoPE's frequencies. The token ids are stored in the block and compared exactly on load, and the payload
carries its own sha256: a block from another model, quantization, tokenizer or template can never load, and a
truncated, flipped or hand-made file is moved aside (said once) instead of trusted.

Files: one folder, plain regular files opened without following links; written as a temp file, fsynced and renamed,
so a reader never sees half a block and two writers of the same block both leave a whole one. No pickle. Least
recently used blocks go first when the folder is over its byte budget.

Why it is exact: the runtime computes every token as a decode step does (app.core.fastpath.native's forward), so
a block's K/V are the same bits whoever computed them; restored blocks plus the prefill of the rest give the reply a
cold run gives.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import queue
import shutil
import stat
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from app.core.storage import staging

log = logging.getLogger(__name__)

BLOCK_TOKENS = 256
FORMAT = 1
MAGIC = b"HKVB"
# magic, format, block index, tokens, layers, kv heads, head dim, dtype (1: bf16), then 32 bytes of identity and 32
# of the payload's sha256
HEADER = struct.Struct("<4sIIIIIII32s32s")
DAMAGED_FOLDER = "damaged"
SUFFIX = ".kvb"


@dataclass(frozen=True)
class CacheShape:
    layers: int
    kv_heads: int
    head_dim: int

    @property
    def block_bytes(self) -> int:
        """A block's K and V payload: every layer's [kv_heads][BLOCK_TOKENS][head_dim] bf16 twice."""
        return 2 * self.layers * self.kv_heads * BLOCK_TOKENS * self.head_dim * 2


def file_sha256(path: Path, memo: Path) -> str:
    """The sha256 of a weights file, memoised in `memo` by its path, size and modification time (an 8B file takes
    seconds to hash; a replaced or rewritten one gets a new entry)."""
    info = path.stat()
    key = f"{path.resolve()}|{info.st_size}|{info.st_mtime_ns}"
    try:
        known = json.loads(memo.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict):
        known = {}
    digest = known.get(key)
    if isinstance(digest, str) and len(digest) == 64:
        return digest
    hasher = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(8 << 20):
            hasher.update(block)
    known[key] = digest = hasher.hexdigest()
    with contextlib.suppress(OSError):
        staging.write_atomically(memo, json.dumps(known).encode())
    return digest


def identity_digest(parts: dict[str, object]) -> bytes:
    """sha256 of every part a block's bits depend on, in a canonical JSON (sorted keys)."""
    return hashlib.sha256(json.dumps({"format": FORMAT, **parts}, sort_keys=True).encode()).digest()


def block_keys(identity: bytes, ids: Sequence[int], blocks: int) -> list[bytes]:
    """The chained keys of the first `blocks` whole blocks of `ids`."""
    keys, previous = [], identity
    for index in range(blocks):
        chunk = np.asarray(ids[index * BLOCK_TOKENS : (index + 1) * BLOCK_TOKENS], dtype="<u4").tobytes()
        previous = hashlib.sha256(previous + chunk).digest()
        keys.append(previous)
    return keys


class PrefixStore:
    """One folder of KV blocks for one model identity, under a byte budget."""

    def __init__(self, folder: Path, identity: bytes, shape: CacheShape, budget_bytes: int) -> None:
        self.folder = folder
        self.identity = identity
        self.shape = shape
        self.budget_bytes = budget_bytes
        self.notices: list[str] = []  # said once each, then taken by the engine
        self._said: set[str] = set()
        self._lock = threading.Lock()

    # -- reading
    def path_of(self, key: bytes) -> Path:
        return self.folder / f"{key.hex()}{SUFFIX}"

    def available(self, ids: Sequence[int]) -> int:
        """How many whole blocks from the start of `ids` (never its last token) are on disk, by name."""
        blocks = (len(ids) - 1) // BLOCK_TOKENS
        count = 0
        for key in block_keys(self.identity, ids, blocks):
            if not self.path_of(key).is_file():
                break
            count += 1
        return count

    def read_block(self, key: bytes, index: int, ids: Sequence[int]) -> npt.NDArray[np.uint16] | None:
        """Block `index`'s payload as [2, layers, kv_heads, BLOCK_TOKENS, head_dim] bf16 bits, checked to the byte;
        None (the file moved aside, said once) when it is not exactly what it must be."""
        path = self.path_of(key)
        try:
            data = _read_regular(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._damaged(path, f"it could not be read ({exc.strerror or exc})")
            return None
        shape = self.shape
        expected = HEADER.size + 4 * BLOCK_TOKENS + shape.block_bytes
        if len(data) != expected:
            self._damaged(path, f"it has {len(data):,} bytes, not {expected:,}")
            return None
        magic, version, block, tokens, layers, kv_heads, head_dim, dtype, identity, checksum = HEADER.unpack_from(data)
        if magic != MAGIC or version != FORMAT or dtype != 1:
            self._damaged(path, "it is not a Hearth KV block of this format")
            return None
        if (block, tokens, layers, kv_heads, head_dim) != (
            index,
            BLOCK_TOKENS,
            *(shape.layers, shape.kv_heads, shape.head_dim),
        ):
            self._damaged(path, "its shape or position is not this model's")
            return None
        stored = np.frombuffer(data, dtype="<u4", count=BLOCK_TOKENS, offset=HEADER.size)
        wanted = np.asarray(ids[index * BLOCK_TOKENS : (index + 1) * BLOCK_TOKENS], dtype="<u4")
        payload = memoryview(data)[HEADER.size + 4 * BLOCK_TOKENS :]
        if identity != self.identity or not np.array_equal(stored, wanted):
            self._damaged(path, "its model identity or token ids do not match its name")
            return None
        if hashlib.sha256(payload).digest() != checksum:
            self._damaged(path, "its checksum does not match its contents")
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used
        return np.frombuffer(payload, dtype="<u2").reshape(
            2, shape.layers, shape.kv_heads, BLOCK_TOKENS, shape.head_dim
        )

    # -- writing
    def write_block(self, key: bytes, index: int, ids: Sequence[int], payload: npt.NDArray[np.uint16]) -> bool:
        """Write one block atomically; False (said once) when the disk is full or the folder unwritable."""
        path = self.path_of(key)
        if path.is_file():
            return True
        body = np.ascontiguousarray(payload, dtype="<u2").tobytes()
        token_bytes = np.asarray(ids[index * BLOCK_TOKENS : (index + 1) * BLOCK_TOKENS], dtype="<u4").tobytes()
        header = HEADER.pack(
            MAGIC, FORMAT, index, BLOCK_TOKENS, self.shape.layers, self.shape.kv_heads, self.shape.head_dim, 1,
            self.identity, hashlib.sha256(body).digest(),
        )  # fmt: skip
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            staging.write_atomically(path, header + token_bytes + body)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                free = shutil.disk_usage(self.folder).free
                self._say(
                    f"The prompt cache in {self.folder} was not saved: the disk is full ({free:,} bytes free). "
                    "Replies go on; prompts will be prefilled again."
                )
            else:
                self._say(f"The prompt cache in {self.folder} could not be written ({exc.strerror or exc}).")
            return False
        return True

    def evict(self) -> int:
        """Remove the least recently used blocks until the folder is within its budget; bytes removed."""
        with self._lock:
            entries = []
            for path in self.folder.glob(f"*{SUFFIX}"):
                try:
                    info = path.lstat()
                except OSError:
                    continue
                if stat.S_ISREG(info.st_mode):
                    entries.append((info.st_mtime_ns, info.st_size, path))
            total = sum(size for _, size, _ in entries)
            removed = 0
            for _, size, path in sorted(entries):
                if total - removed <= self.budget_bytes:
                    break
                with contextlib.suppress(OSError):
                    path.unlink()
                    removed += size
            return removed

    # -- notices
    def take_notices(self) -> list[str]:
        with self._lock:
            taken, self.notices = self.notices, []
            return taken

    def _say(self, message: str) -> None:
        log.warning("%s", message)
        with self._lock:
            if message not in self._said:
                self._said.add(message)
                self.notices.append(message)

    def _damaged(self, path: Path, why: str) -> None:
        moved = path.parent / DAMAGED_FOLDER / path.name
        try:
            moved.parent.mkdir(exist_ok=True)
            os.replace(path, moved)
        except OSError:
            with contextlib.suppress(OSError):
                path.unlink()
        self._say(f"A saved prompt block ({path.name}) was damaged ({why}): it was moved aside and is recomputed.")


def _read_regular(path: Path) -> bytes:
    """A regular file's bytes, never through a symbolic link (O_NOFOLLOW)."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
    descriptor = os.open(path, flags)
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        with os.fdopen(descriptor, "rb", closefd=False) as handle:
            return handle.read()
    finally:
        os.close(descriptor)


def folder_usage(folder: Path) -> tuple[int, int]:
    """(blocks, bytes) the store's folder holds."""
    blocks = size = 0
    for path in folder.glob(f"*{SUFFIX}") if folder.is_dir() else ():
        with contextlib.suppress(OSError):
            info = path.lstat()
            if stat.S_ISREG(info.st_mode):
                blocks, size = blocks + 1, size + info.st_size
    return blocks, size


def budget_for(folder: Path, setting_bytes: int) -> int:
    """The store's byte budget: the setting, never more than a quarter of the disk's free space now."""
    try:
        free = shutil.disk_usage(folder if folder.exists() else folder.parent).free
    except OSError:
        free = 0
    return max(0, min(setting_bytes, free // 4))


class PrefixCache:
    """An engine's use of a PrefixStore: restore a prompt's stored blocks before its prefill, and after a reply keep
    the prompt's new whole blocks (copied and written by one background thread, while the user reads). `lock` is
    held while a reply writes the cache (the engine's inference), so a block is never copied half-written."""

    def __init__(self, store: PrefixStore) -> None:
        self.store = store
        self.lock = threading.Lock()
        self._jobs: queue.Queue[tuple[list[int], Any, list[bytes], list[int]] | None] = queue.Queue()
        self._writer: threading.Thread | None = None

    def restore(self, ids: Sequence[int], cache: Any, reused: int) -> int:
        """Read the stored blocks of `ids` past the first `reused` positions into `cache` (a LiteCache), each one
        checked whole before it is copied in; the cache's new length. A block that fails stops the restore there:
        what the cache held stays as it was."""
        with self.lock:
            blocks = self.store.available(ids)
            if blocks * BLOCK_TOKENS <= reused:
                return reused
            keys = block_keys(self.store.identity, ids, blocks)
            length = reused
            for index in range(reused // BLOCK_TOKENS, blocks):
                payload = self.store.read_block(keys[index], index, ids)
                if payload is None:
                    break
                start, end = index * BLOCK_TOKENS, (index + 1) * BLOCK_TOKENS
                cache.reserve(end)
                for layer in range(self.store.shape.layers):
                    cache.keys[layer][:, start:end] = payload[0, layer]
                    cache.values[layer][:, start:end] = payload[1, layer]
                cache.length, cache.ids[:] = end, list(ids[:end])  # so a later reserve() keeps this block
                length = end
            return length

    def save_later(self, ids: Sequence[int], cache: Any) -> None:
        """Queue the whole blocks of `ids` (a prompt the cache now holds) that are not stored yet."""
        blocks = len(ids) // BLOCK_TOKENS
        if blocks == 0:
            return
        keys = block_keys(self.store.identity, ids, blocks)
        missing = [index for index in range(blocks) if not self.store.path_of(keys[index]).is_file()]
        if not missing:
            return
        self._jobs.put((list(ids), cache, keys, missing))
        if self._writer is None or not self._writer.is_alive():
            self._writer = threading.Thread(target=self._write, name="hearth-prompt-cache", daemon=True)
            self._writer.start()

    def _write(self) -> None:
        while (job := self._jobs.get()) is not None:
            ids, cache, keys, missing = job
            for index in missing:
                end = (index + 1) * BLOCK_TOKENS
                with self.lock:  # the cache still holds these tokens (a later reply may have moved on)?
                    if cache.length < end or cache.ids[:end] != ids[:end]:
                        break
                    start = index * BLOCK_TOKENS
                    payload = np.stack(
                        [
                            np.stack([slab[:, start:end] for slab in cache.keys]),
                            np.stack([slab[:, start:end] for slab in cache.values]),
                        ]
                    )
                if not self.store.write_block(keys[index], index, ids, payload):
                    break
            self.store.evict()
            self._jobs.task_done()

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every queued block is written (tests, and a clean close)."""
        deadline = time.monotonic() + timeout
        while self._jobs.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)

    def close(self) -> None:
        self.flush()
        self._jobs.put(None)
