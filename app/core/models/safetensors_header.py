"""A safetensors file's header, read without the safetensors library: each tensor's dtype, shape and byte range."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

HEADER_LIMIT = 100 << 20  # safetensors' own limit on a header's size


@dataclass(frozen=True)
class StoredTensor:
    name: str
    dtype: str  # the file's name for it: "BF16", "F32", ...
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    end: int


def read_header(path: Path) -> list[StoredTensor]:
    """The file's tensors; ValueError for a header that is not safetensors', OSError where it can't be read."""
    with path.open("rb") as handle:
        size = int.from_bytes(handle.read(8), "little")
        if not 0 < size <= HEADER_LIMIT:
            raise ValueError(f"{path.name}: a header of {size} bytes is not a safetensors header")
        header = json.loads(handle.read(size))
    if not isinstance(header, dict):
        raise ValueError(f"{path.name}: the header is not a JSON object")
    data_start = 8 + size
    found = []
    for name, entry in header.items():
        if name == "__metadata__" or not isinstance(entry, dict):
            continue
        offsets, shape = entry.get("data_offsets"), entry.get("shape")
        if not (isinstance(offsets, list) and len(offsets) == 2 and isinstance(shape, list)):
            raise ValueError(f"{path.name}: tensor {name!r} has no valid data_offsets or shape")
        found.append(
            StoredTensor(
                name,
                str(entry.get("dtype")),
                tuple(int(n) for n in shape),
                data_start + int(offsets[0]),
                data_start + int(offsets[1]),
            )
        )
    return found
