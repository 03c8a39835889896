"""The weights' arena (app.core.fastpath.huge_pages): its sizes, its pieces, and the pages the system gives it."""

from __future__ import annotations

import mmap
import sys
from pathlib import Path

import numpy as np
import pytest

from app.core.fastpath.huge_pages import (
    ALIGN,
    HUGE_PAGE_BYTES,
    PageArena,
    arena_bytes,
    arena_on_huge_pages,
    huge_bytes_at,
    huge_pages_offered,
    huge_pages_setting,
)

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps is Linux's")


def setting_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "enabled"
    path.write_text(text, encoding="ascii")
    return path


def test_the_setting_is_the_bracketed_mode_and_none_where_there_is_none(tmp_path: Path) -> None:
    assert huge_pages_setting(setting_file(tmp_path, "always [madvise] never\n")) == "madvise"
    assert huge_pages_setting(setting_file(tmp_path, "[always] madvise never\n")) == "always"
    assert huge_pages_setting(setting_file(tmp_path, "garbled")) is None
    assert huge_pages_setting(tmp_path / "missing") is None
    assert not huge_pages_offered(setting_file(tmp_path, "always madvise [never]\n"))
    assert not huge_pages_offered(tmp_path / "missing")
    assert huge_pages_offered(setting_file(tmp_path, "always [madvise] never\n")) == hasattr(mmap, "MADV_HUGEPAGE")


def test_an_arena_counts_each_piece_on_a_cache_line_and_on_huge_pages_its_last_page_whole() -> None:
    assert arena_bytes([100, 64, 1], huge=False) == 128 + 64 + 64
    assert arena_bytes([100, 64, 1], huge=True) == HUGE_PAGE_BYTES
    assert arena_bytes([HUGE_PAGE_BYTES + 1], huge=True) == 2 * HUGE_PAGE_BYTES
    assert arena_bytes([], huge=True) == 0


def test_a_small_arena_or_one_where_huge_pages_are_off_is_ordinary_memory(tmp_path: Path) -> None:
    offered = setting_file(tmp_path, "always [madvise] never\n")
    assert not arena_on_huge_pages([HUGE_PAGE_BYTES - 1], offered)  # it would not fill one page
    never = PageArena([3 * HUGE_PAGE_BYTES], setting_file(tmp_path, "always madvise [never]\n"))
    assert not never.huge and never.nbytes == 3 * HUGE_PAGE_BYTES


def test_pieces_are_cut_in_order_on_cache_lines_and_never_past_the_end(tmp_path: Path) -> None:
    arena = PageArena([100, 200], setting_file(tmp_path, "always madvise [never]\n"))
    first, second = arena.take(100), arena.take(200)
    assert first.ctypes.data % ALIGN == 0 and second.ctypes.data == first.ctypes.data + 128
    first[:] = 1
    second[:] = 2
    assert int(first.sum()) == 100 and int(second.sum()) == 400  # the pieces do not overlap
    with pytest.raises(ValueError, match="bytes left, not 1"):
        arena.take(1)


def test_an_arena_whose_advice_the_system_refuses_is_ordinary_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Refusing:
        def __init__(self, *args: object, **kwargs: object) -> None:
            raise OSError(22, "Invalid argument")

    monkeypatch.setattr(mmap, "mmap", Refusing)
    monkeypatch.setattr(mmap, "MADV_HUGEPAGE", 14, raising=False)
    arena = PageArena([3 * HUGE_PAGE_BYTES], setting_file(tmp_path, "always [madvise] never\n"))
    assert not arena.huge and arena.nbytes == 3 * HUGE_PAGE_BYTES
    arena.take(3 * HUGE_PAGE_BYTES)[:] = 1
    assert int(arena.memory[-1]) == 1


@linux_only
@pytest.mark.skipif(not huge_pages_offered(), reason="this system gives no transparent huge pages")
def test_where_the_system_offers_huge_pages_a_written_arena_lies_on_them() -> None:
    arena = PageArena([3 * HUGE_PAGE_BYTES])
    assert arena.huge and arena.memory.ctypes.data % HUGE_PAGE_BYTES == 0
    assert arena.huge_bytes() == 0  # nothing is backed until written
    arena.take(3 * HUGE_PAGE_BYTES)[:] = 7
    assert arena.huge_bytes() == 3 * HUGE_PAGE_BYTES
    assert np.all(arena.memory == 7)


@linux_only
def test_a_range_with_nothing_mapped_reads_as_no_huge_pages_and_an_empty_one_as_unknown() -> None:
    assert huge_bytes_at(4096, 4096) == 0  # below the lowest address Linux maps
    assert huge_bytes_at(4096, 0) is None
