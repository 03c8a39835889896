"""Content hashes for the decode path's derived files (the compiled kernel library, the packed weight copies).

Each file is written with a sidecar `NAME.sha256` (JSON: sha256 and size) before it appears under its final name,
and verified before use: a file that does not match is moved to `NAME.damaged` and rebuilt, never loaded. So a cut-
short library can't be mapped into the process (a Bus error on every later run) and a flipped byte in a packed copy
can't turn into a garbage reply (which the response cache would then replay).
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from app.core.storage import staging

log = logging.getLogger(__name__)

SIDECAR_SUFFIX = ".sha256"
DAMAGED_SUFFIX = ".damaged"
# The sidecar's hash: sha256 over the sha256s of 16 MiB chunks, hashed on every core (hashlib drops the GIL). A plain
# sha256 of the 90 MiB default copy took 53 ms on one core of the 2-core machine; the chunks halve that there.
SCHEME = "sha256-of-16MiB-chunks"
CHUNK = 16 * 2**20


def sidecar(path: Path) -> Path:
    return path.with_name(path.name + SIDECAR_SUFFIX)


def sha256_file(path: Path) -> str:
    """A plain sha256 (what `sha256sum` prints): the prebuilt manifest's."""
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def digest_bytes(data: bytes | memoryview | mmap.mmap) -> str:
    """SCHEME's hash of `data`."""
    size = len(data)
    starts = range(0, size, CHUNK) if size else range(1)

    def part(start: int) -> bytes:
        with memoryview(data) as whole, whole[start : start + CHUNK] as piece:
            return hashlib.sha256(piece).digest()

    return _combined(part, starts)


def _combined(part: Callable[[int], bytes], starts: range) -> str:
    """The sha256 of the chunks' sha256s (`part(start)` hashes the chunk at `start`), hashed on every core."""
    workers = max(1, min(len(starts), os.cpu_count() or 1))
    if workers == 1:
        parts = [part(start) for start in starts]
    else:
        with ThreadPoolExecutor(workers) as pool:
            parts = list(pool.map(part, starts))
    return hashlib.sha256(b"".join(parts)).hexdigest()


def digest_pieces(pieces: Iterable[bytes | memoryview]) -> str:
    """SCHEME's hash of the pieces' concatenation (as digest_bytes of it), without ever joining them."""
    parts: list[bytes] = []
    chunk = hashlib.sha256()
    filled = 0
    for piece in pieces:
        with memoryview(piece) as view, view.cast("B") as flat:
            offset = 0
            while offset < len(flat):
                take = min(CHUNK - filled, len(flat) - offset)
                chunk.update(flat[offset : offset + take])
                filled += take
                offset += take
                if filled == CHUNK:
                    parts.append(chunk.digest())
                    chunk, filled = hashlib.sha256(), 0
    if filled or not parts:
        parts.append(chunk.digest())
    return hashlib.sha256(b"".join(parts)).hexdigest()


def digest_file(path: Path) -> str:
    """SCHEME's hash of a file, each chunk read into its own buffer: not mapped, so hashing a 775 MiB packed copy does
    not make it resident in the process (mapping it did, on top of the copy being written)."""
    size = path.stat().st_size
    starts = range(0, size, CHUNK) if size else range(1)

    def part(start: int) -> bytes:
        digest = hashlib.sha256()
        with path.open("rb") as handle:  # one handle per chunk: positioned reads on every OS, workers independent
            handle.seek(start)
            want = min(CHUNK, size - start) if size else 0
            while want > 0:
                data = handle.read(min(want, 2**20))
                if not data:
                    raise OSError(f"{path} was cut short while it was read")
                digest.update(data)
                want -= len(data)
        return digest.digest()

    return _combined(part, starts)


def identity(path: Path) -> tuple[int, int, int]:
    """(inode, size, mtime): a caller that reads the file again after verifying it checks this did not change."""
    stat = path.stat()
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


@dataclass(frozen=True)
class Verified:
    """A file whose bytes matched the hash written with it, and the identity it had when they were hashed."""

    path: Path
    sha256: str
    identity: tuple[int, int, int]


def _recorded(path: Path) -> tuple[str, int] | str:
    """(sha256, size) from the sidecar, or what is wrong with it."""
    try:
        record = json.loads(sidecar(path).read_text(encoding="utf-8"))
        digest, size = record["sha256"], record["bytes"]
    except FileNotFoundError:
        return "its checksum file is missing"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"its checksum file is unreadable ({type(exc).__name__})"
    if not isinstance(digest, str) or len(digest) != 64 or not isinstance(size, int):
        return "its checksum file is unreadable (wrong fields)"
    return digest, size


def verify(path: Path) -> Verified | str:
    """The file checked against its sidecar, or why it does not match (a sentence fragment for a notice)."""
    recorded = _recorded(path)
    if isinstance(recorded, str):
        return recorded
    digest, size = recorded
    try:
        before = identity(path)
        if before[1] != size:  # cut short or grown: no need to hash
            return f"it has {before[1]} bytes where {size} were written"
        actual = digest_file(path)
    except OSError as exc:
        return f"it could not be read ({exc.strerror or exc})"
    if actual != digest:
        return "its content does not match the sha256 written with it"
    return Verified(path, digest, before)


def write_sidecar(path: Path, digest: str, size: int) -> None:
    """Atomic, and done before the file itself is moved into place (a crash in between leaves a mismatch, which is
    rebuilt, never a file that looks verified)."""
    record = json.dumps({"sha256": digest, "bytes": size, "scheme": SCHEME}).encode()
    staging.write_atomically(sidecar(path), record)


def publish(partial: Path, final: Path) -> str:
    """Hash the finished `partial`, write the sidecar, then move it to `final`; returns the sha256."""
    digest = digest_file(partial)
    write_sidecar(final, digest, partial.stat().st_size)
    os.replace(partial, final)
    return digest


def write_bytes(final: Path, data: bytes, digest: str = "") -> str:
    """Write `data` (whose sha256 is `digest`, when the caller has it) to `final` atomically with its sidecar;
    returns the sha256."""
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = final.with_name(f"{final.name}.{os.getpid()}.partial")
    partial.write_bytes(data)
    digest = digest or digest_bytes(data)
    write_sidecar(final, digest, len(data))
    os.replace(partial, final)
    return digest


def quarantine(path: Path) -> Path:
    """Move a damaged file to `NAME.damaged` (replacing an older one) and drop its sidecar, so it is rebuilt."""
    damaged = path.with_name(path.name + DAMAGED_SUFFIX)
    damaged.unlink(missing_ok=True)
    os.replace(path, damaged)
    sidecar(path).unlink(missing_ok=True)
    return damaged


def check_or_quarantine(path: Path, what: str, rebuilt: str, notices: list[str]) -> Verified | None:
    """The verified file, or None when there is none to use: absent, or damaged and moved aside (with a line in
    `notices` naming `what` was damaged, where it went and that it is `rebuilt`, e.g. "compiled again")."""
    if not path.exists():
        sidecar(path).unlink(missing_ok=True)  # a sidecar left by a crash before the file was moved into place
        return None
    checked = verify(path)
    if isinstance(checked, Verified):
        return checked
    try:
        moved = quarantine(path)
    except OSError as exc:  # can't move it (read-only cache): still never used
        log.warning("%s %s is damaged (%s) and could not be moved aside: %s", what, path, checked, exc)
        notices.append(f"The {what} {path} was damaged ({checked}); it was not used and is {rebuilt} for this run.")
        return None
    log.info("%s %s damaged (%s); moved to %s", what, path, checked, moved)  # the notice is what the user sees
    notices.append(f"The {what} {path.name} was damaged ({checked}); it was moved to {moved} and {rebuilt}.")
    return None
