"""Anonymous memory on 2 MiB pages where the system gives them, for the weights' in-memory layouts: every decode step
reads them whole. Torch-free.

Why: on 4 KiB pages a step that streams the weights misses the TLB every 4 KiB (a 1B Q4_K_M file: ~200,000 misses
a token), and each miss walks the page tables, in a virtual machine twice (the guest's tables, then the host's).
The walks take the place of the loads the loop waits for. numpy asks for huge pages only for arrays of 4 MiB or more,
so one array per matrix left every 135M matrix and a 1B model's attention on 4 KiB pages. Measured on the 2-core KVM
guest (2026-12-06, alternating processes, the same bits), one array per matrix against this arena: a 135M Q4_1
decode step 3.26-3.36 against 2.73-2.93 ms, 1B Q4_K_M 37.3-38.5 against 35.2-36.1 ms.

Linux backs a range advised MADV_HUGEPAGE with 2 MiB pages when transparent huge pages are "madvise" (the usual
default) or "always"; with "never" the advice is taken and nothing changes. macOS and Windows get ordinary pages
(Windows' large pages need a privilege a desktop user does not hold).
"""

from __future__ import annotations

import mmap
import re
import sys
from pathlib import Path

import numpy as np
import numpy.typing as npt

HUGE_PAGE_BYTES = 2 << 20
ALIGN = 64  # each piece of an arena starts on a cache line (the kernel's vector loads)
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def huge_pages_setting(setting: Path | None = None) -> str | None:
    """The system's transparent huge page mode ("always", "madvise", "never"); None where there is none to read
    (not Linux, or a kernel without them)."""
    try:
        text = (setting or THP_SETTING).read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    chosen = re.search(r"\[(\w+)\]", text)
    return chosen.group(1) if chosen else None


def huge_pages_offered(setting: Path | None = None) -> bool:
    """Whether advised memory may get 2 MiB pages here."""
    return hasattr(mmap, "MADV_HUGEPAGE") and huge_pages_setting(setting) in ("always", "madvise")


def arena_on_huge_pages(sizes: list[int], setting: Path | None = None) -> bool:
    """Whether an arena of pieces of `sizes` asks for 2 MiB pages: where they are offered, and it fills one."""
    return huge_pages_offered(setting) and sum(sizes) >= HUGE_PAGE_BYTES


def piece_bytes(size: int) -> int:
    """The room a piece of `size` bytes takes in an arena: the next piece starts on a cache line."""
    return -(-size // ALIGN) * ALIGN


def arena_bytes(sizes: list[int], huge: bool) -> int:
    """The bytes an arena holding pieces of `sizes` takes in memory once written: each piece's room, and on huge
    pages the last page whole (the kernel backs it with one 2 MiB page however little of it is used)."""
    total = sum(piece_bytes(size) for size in sizes)
    return -(-total // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES if huge and total else total


class PageArena:
    """One block of memory cut into pieces (`take`), on 2 MiB pages where the system gives them (`huge`). Pages are
    only backed as they are first written; the memory goes when the arena and every piece are gone."""

    def __init__(self, sizes: list[int], setting: Path | None = None) -> None:
        self.huge = arena_on_huge_pages(sizes, setting)
        self.nbytes = arena_bytes(sizes, self.huge)
        memory = self._advised() if self.huge else None
        if memory is None:  # ordinary pages: not offered, too small, or the advice refused
            self.huge = False
            whole = np.empty(self.nbytes + ALIGN, dtype=np.uint8)
            start = -whole.ctypes.data % ALIGN
            memory = whole[start : start + self.nbytes]
        self.memory: npt.NDArray[np.uint8] = memory
        self._used = 0

    def _advised(self) -> npt.NDArray[np.uint8] | None:
        """The arena on a 2 MiB boundary of an anonymous map advised MADV_HUGEPAGE (mapped one page longer so that
        it can start there); None where the system refuses the map or the advice (a kernel built without them)."""
        try:
            self._map = mmap.mmap(-1, self.nbytes + HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            whole = np.frombuffer(self._map, dtype=np.uint8)
            start = -whole.ctypes.data % HUGE_PAGE_BYTES
            self._map.madvise(mmap.MADV_HUGEPAGE, start, self.nbytes)
        except (OSError, AttributeError):  # AttributeError: a platform without private anonymous maps
            return None
        return whole[start : start + self.nbytes]

    def take(self, size: int) -> npt.NDArray[np.uint8]:
        """The next `size` bytes of the arena (uninitialised)."""
        start = self._used
        if start + size > self.nbytes:
            raise ValueError(f"the arena has {self.nbytes - start} bytes left, not {size}")
        self._used = start + piece_bytes(size)
        return self.memory[start : start + size]

    def huge_bytes(self) -> int | None:
        """How many of the arena's bytes the kernel now backs with 2 MiB pages (Linux's /proc/self/smaps); None where
        that cannot be read."""
        found = huge_bytes_at(self.memory.ctypes.data, self.nbytes)
        return None if found is None else min(found, self.nbytes)  # a neighbouring arena's mapping may be merged in


def huge_bytes_at(address: int, size: int) -> int | None:
    """The AnonHugePages of the mappings overlapping [address, address + size), from /proc/self/smaps (Linux)."""
    if not sys.platform.startswith("linux") or size <= 0:
        return None
    total, inside = 0, False
    try:
        with open("/proc/self/smaps", encoding="ascii", errors="replace") as smaps:
            for line in smaps:
                head = line.split(maxsplit=1)[0] if line.strip() else ""
                if "-" in head and not head.endswith(":"):
                    low, _, high = head.partition("-")
                    inside = int(low, 16) < address + size and address < int(high, 16)
                elif inside and head == "AnonHugePages:":
                    total += int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return total
