"""Give memory the allocator keeps after a load back to the system (glibc's malloc_trim), and keep the kernel from
reading ahead in a mapped tensor read a row at a time (madvise MADV_RANDOM), where those exist.

glibc keeps freed memory in its arenas; after a load that freed transient buffers (a cold start's packing, the
tokenizer's parse) that memory stays in the process's RSS until reused. `malloc_trim(0)` returns what it can. Other C
libraries (macOS, Windows, musl) have no such call: nothing is done there.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import mmap
import sys
from functools import cache
from typing import Any

log = logging.getLogger(__name__)


@cache
def _glibc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # musl and others: no malloc_trim
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


MADV_RANDOM = 1  # Linux and macOS: "expect random page references" (no read-ahead around each fault)


@cache
def _madvise() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        advise = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    advise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    advise.restype = ctypes.c_int
    return advise


def read_rows_at_random(address: int, length: int) -> bool:
    """Tell the kernel a mapped range is read a row at a time (the embedding): a page fault then brings in that page,
    not the 128 KiB around it, so only the rows of tokens seen become resident. Whether it was applied."""
    advise = _madvise()
    if advise is None or length <= 0:
        return False
    page = mmap.PAGESIZE
    start = address // page * page
    return int(advise(start, length + address - start, MADV_RANDOM)) == 0


def release_freed_memory() -> bool:
    """Return freed heap memory to the system; whether this platform's allocator could be asked to."""
    trim = _glibc()
    if trim is None:
        return False
    trim(0)
    return True
