"""Embedding rows read from the weight file with positioned reads, so the table never becomes resident.

q4 keeps the input embedding in the weight file (it is read a row per token). Read through the file's memory map,
each row's page fault maps the pages around it too (Linux's fault-around: 64 KiB, which `MADV_RANDOM` does not turn
off): a 500-token prompt made a 1B model's RSS grow by 33 MiB for 4 MiB of rows. `RowFile` reads exactly the rows
asked for into a buffer instead. It is found by matching the mapped tensor against the folder's safetensors headers
and checked against the map's own bytes; where that fails, the map is read with read-around switched off
(`advise_random_access`).
"""

from __future__ import annotations

import ctypes
import io
import logging
import mmap
import sys
import threading
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import torch

from app.core.fastpath.positioned import RowReadError, read_exactly_at
from app.core.models.dtypes import FLOAT_DTYPES
from app.core.models.safetensors_header import StoredTensor, read_header

log = logging.getLogger(__name__)


@dataclass
class RowFile:
    """A [rows, cols] tensor stored row-major at `offset` of `path`, read a row at a time."""

    path: Path
    offset: int
    rows: int
    cols: int
    dtype: torch.dtype
    handle: io.BufferedReader = field(repr=False)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def row_bytes(self) -> int:
        return self.cols * self.dtype.itemsize

    def read_row_into(self, row: int, out: memoryview) -> None:
        """Row `row` into the first `row_bytes` of `out` (a byte view: see `byte_view`)."""
        if not 0 <= row < self.rows:
            raise IndexError(f"row {row} is outside the table's {self.rows} rows")
        self._read_at(self.offset + row * self.row_bytes, out[: self.row_bytes])

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """The rows of `ids` (any shape): ids.shape + [cols], in this file's dtype; each distinct row read once."""
        distinct, where = torch.unique(ids.reshape(-1), return_inverse=True)
        table = torch.empty(len(distinct), self.cols, dtype=self.dtype)
        view, size = byte_view(table), self.row_bytes
        for slot, row in enumerate(distinct.tolist()):
            self.read_row_into(row, view[slot * size : (slot + 1) * size])
        return table[where].reshape(*ids.shape, self.cols)

    def _read_at(self, offset: int, view: memoryview) -> None:
        read_exactly_at(self.handle, self.lock, self.path, offset, view)


def byte_view(tensor: torch.Tensor) -> memoryview:
    """A writable byte view of a contiguous CPU tensor's memory (any dtype)."""
    return memoryview(tensor.reshape(-1).view(torch.uint8).numpy())  # type: ignore[arg-type]


def locate(folder: Path | None, weight: torch.Tensor) -> RowFile | None:
    """The stored tensor in `folder`'s safetensors files whose bytes `weight` (a 2-D view of its map) holds, opened
    for row reads; None where none matches exactly (its first, middle and last rows are compared)."""
    if folder is None or weight.dim() != 2 or not weight.is_contiguous() or weight.device.type != "cpu":
        return None
    rows, cols = (int(n) for n in weight.shape)
    for path in sorted(folder.glob("*.safetensors")):
        try:
            candidates = [t for t in read_header(path) if _same_layout(t, weight)]
        except (OSError, ValueError):
            continue
        for stored in candidates:
            try:
                handle = path.open("rb")
            except OSError:
                continue
            found = RowFile(path, stored.start, rows, cols, weight.dtype, handle)
            if _matches(found, weight):
                return found
            handle.close()
    return None


def _same_layout(stored: StoredTensor, weight: torch.Tensor) -> bool:
    return (
        FLOAT_DTYPES.get(stored.dtype) == weight.dtype
        and stored.shape == tuple(weight.shape)
        and stored.end - stored.start == weight.numel() * weight.element_size()
    )


def _matches(found: RowFile, weight: torch.Tensor) -> bool:
    row = torch.empty(found.cols, dtype=found.dtype)
    try:
        for index in sorted({0, found.rows // 2, found.rows - 1}):
            found.read_row_into(index, byte_view(row))
            if not torch.equal(row.view(torch.uint8), weight[index].view(torch.uint8)):
                return False
    except RowReadError:
        return False
    return True


# The same value on Linux and macOS (POSIX_MADV_RANDOM is 1 on both).
MADV_RANDOM = 1
MADV_PAGEOUT = 21  # Linux 5.4+: reclaim the range now; clean file pages are dropped (re-read if touched again)


def release_file_pages(tensor: torch.Tensor) -> bool:
    """Give back the resident pages of a tensor that is a view of a mapped file (a 16-bit matrix q4 has packed and
    never reads again): the packing read every page, and they would otherwise stay in the process's RSS for the whole
    session (a 1B model's first load: 2 GiB). Only a range inside a file mapping is touched (Linux; elsewhere, or on
    an older kernel, nothing happens); whether the kernel took the advice."""
    if not sys.platform.startswith("linux") or tensor.numel() == 0:
        return False
    advise = _madvise()
    start, size = page_span(tensor.data_ptr(), tensor.numel() * tensor.element_size())
    if advise is None or not _in_file_mapping(start, start + size):
        return False
    if advise(start, size, MADV_PAGEOUT) != 0:
        log.debug("madvise(MADV_PAGEOUT) refused: errno %d", ctypes.get_errno())
        return False
    return True


def _in_file_mapping(start: int, end: int) -> bool:
    """Whether [start, end) lies inside one mapping of a regular file (/proc/self/maps)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                low, _, high = fields[0].partition("-")
                if int(low, 16) <= start and end <= int(high, 16):
                    path = fields[5].strip() if len(fields) > 5 else ""
                    return path.startswith("/") and not path.endswith(" (deleted)")
    except (OSError, ValueError, IndexError):
        pass
    return False


@cache
def _madvise() -> Any:
    if not (sys.platform.startswith("linux") or sys.platform == "darwin"):
        return None  # Windows: no madvise
    try:
        advise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    advise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    advise.restype = ctypes.c_int
    return advise


def page_span(address: int, length: int, page: int = mmap.PAGESIZE) -> tuple[int, int]:
    """The whole pages that hold [address, address + length): (first page's address, bytes)."""
    start = address - address % page
    end = -(-(address + length) // page) * page
    return start, end - start


def advise_random_access(address: int, length: int) -> bool:
    """Ask the kernel to read only the faulting pages of this range (a mapped table read row by row: Linux then maps
    64 KiB of fault-around per row instead of 244 KiB of read-around); whether it took the advice. Memory that is not
    a file mapping is unaffected."""
    advise = _madvise()
    if advise is None or length <= 0:
        return False
    start, size = page_span(address, length)
    if advise(start, size, MADV_RANDOM) != 0:
        log.debug("madvise(MADV_RANDOM) refused: errno %d", ctypes.get_errno())
        return False
    return True
