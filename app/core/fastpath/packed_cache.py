"""Where a model's packed copy (the fused step's Q4_1 or int8 matrices) is cached: one name for the torch path that
writes it and the torch-free runtime (app.core.engines.lite) that reads it. Torch-free."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from functools import cache
from pathlib import Path

from app.core.storage.paths import cache_dir

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
    """The cache file for `folder`'s weights packed as `kind` from `quantization` values; None where the folder's
    weight files can't be listed (nothing is cached then)."""
    try:
        files = sorted(folder.resolve().glob("*.safetensors"))
        stamp = [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    except OSError:
        return None
    if not files:
        return None
    identity = json.dumps([CACHE_FORMAT, kind, str(folder.resolve()), stamp, quantization, torch_version()])
    digest = hashlib.sha256(identity.encode()).hexdigest()[:24]
    return cache_dir() / kind / f"{folder.name[:40]}-{quantization}-{digest}.safetensors"
