"""Giving freed heap memory back to the system (app/core/memory/release.py): on glibc the process's resident memory
falls; elsewhere nothing is asked."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

from app.core.memory import release

GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"

# In a fresh process: 128 MiB of 32 KiB heap blocks (below glibc's mmap threshold), every other one freed. The freed
# blocks sit between live ones, so glibc's automatic trim of the heap's top cannot return them; malloc_trim can.
_PROBE = textwrap.dedent(
    """
    import ctypes, os
    from app.core.memory.release import release_freed_memory

    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    page = os.sysconf("SC_PAGE_SIZE")

    def resident() -> int:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * page

    blocks = [libc.malloc(32 << 10) for _ in range(4096)]
    for block in blocks:
        ctypes.memset(block, 1, 32 << 10)
    for block in blocks[::2]:
        libc.free(block)
    before = resident()
    asked = release_freed_memory()
    print(asked, before - resident())
    """
)


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc_trim; other C libraries have none (tested below)")
def test_freed_heap_memory_leaves_the_process_on_glibc() -> None:
    result = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True)
    asked, given_back = result.stdout.split()
    assert asked == "True"
    assert int(given_back) > 48 << 20, result.stdout  # of the 64 MiB freed


def test_nothing_is_asked_where_there_is_no_malloc_trim(monkeypatch: pytest.MonkeyPatch) -> None:
    release._glibc.cache_clear()
    monkeypatch.setattr(release.sys, "platform", "darwin")
    try:
        assert release.release_freed_memory() is False
    finally:
        release._glibc.cache_clear()
