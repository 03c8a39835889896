"""Where a model's packed copy (the fused step's Q4_1 or int8 matrices) is cached: one name for the torch path that
writes it and the torch-free runtime (app.core.engines.lite) that reads it. Torch-free."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
from collections.abc import Sequence
from functools import cache
from pathlib import Path

from app.core.fastpath import integrity
from app.core.storage import space, staging
from app.core.storage.paths import cache_dir

log = logging.getLogger(__name__)

# Bump when the packed layout, the quantization recipe or the file's checks change (3: sha256; 4: Q4_1 in groups of
# 16 rows).
CACHE_FORMAT = 4


@cache
def torch_version() -> str:
    """torch's version as its package metadata states it (the same string as torch.__version__), read without
    importing torch; "" where no metadata is installed (a frozen build that did not collect it)."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return ""


def packed_cache_file(folder: Path, quantization: str, kind: str = "decode-int8") -> Path | None:
    """The cache file for `folder`'s weights (or one GGUF file's) packed as `kind` from `quantization` values; None
    where the weight files can't be listed (nothing is cached then)."""
    try:
        files = [folder.resolve()] if folder.is_file() else sorted(folder.resolve().glob("*.safetensors"))
        stamp = [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    except OSError:
        return None
    if not files:
        return None
    identity = json.dumps([CACHE_FORMAT, kind, str(folder.resolve()), stamp, quantization, torch_version()])
    digest = hashlib.sha256(identity.encode()).hexdigest()[:24]
    return cache_dir() / kind / f"{folder.name[:40]}-{quantization}-{digest}.safetensors"


def write_packed_copy(cache_file: Path, pieces: Sequence[memoryview], notices: list[str]) -> str:
    """Write the packed copy (its safetensors `pieces`, in order) to `cache_file` atomically with its sha256 sidecar;
    returns the sha256. The space it needs is checked first. Without it (or when the disk fills anyway) nothing is
    left behind, one line in `notices` says needed against free, and the model runs on the copy in memory: the next
    load packs again. The partial file is named for this process (storage.staging), so a kill mid-write leaves
    nothing a later start does not remove."""
    needed = sum(piece.nbytes for piece in pieces)
    folder = cache_file.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        space.check_space(folder, needed, "the packed copy of the weights", spare=0)
        with staging.writing(cache_file) as partial:
            with partial.open("wb") as handle:
                for piece in pieces:
                    handle.write(piece)
            return integrity.publish(partial, cache_file)
    except space.DiskFullError as full:
        notices.append(_not_cached(full))
    except OSError as exc:
        if space.is_disk_full(exc):
            notices.append(_not_cached(space.DiskFullError(folder, "the packed copy of the weights", needed)))
        else:  # a read-only cache costs the next load a repack, nothing more
            log.warning("could not cache the packed weights in %s: %s", cache_file, exc)
    return integrity.digest_pieces(pieces)


def _not_cached(full: space.DiskFullError) -> str:
    need = space.format_size(full.needed or 0)
    free = space.format_size(full.free) if full.free is not None else "an unknown amount"
    return (
        f"The packed copy of the weights was not cached: it needs {need} and {full.folder} has {free} free. The "
        "model runs as packed in memory; the next load packs it again (free some space to keep it)."
    )
