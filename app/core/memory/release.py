"""Give memory the allocator keeps after a load back to the system (glibc's malloc_trim), where that exists.

glibc keeps freed memory in its arenas; after a load that freed transient buffers (a cold start's packing, the
tokenizer's parse) that memory stays in the process's RSS until reused. `malloc_trim(0)` returns what it can. Other C
libraries (macOS, Windows, musl) have no such call: nothing is done there.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
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


def release_freed_memory() -> bool:
    """Return freed heap memory to the system; whether this platform's allocator could be asked to."""
    trim = _glibc()
    if trim is None:
        return False
    trim(0)
    return True
