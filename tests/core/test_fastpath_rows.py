"""Embedding rows read from the weight file by position (app/core/fastpath/rows.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file

from app.core.fastpath import positioned, rows


def _saved(folder: Path, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    tensors = {
        "model.norm.weight": torch.ones(16, dtype=dtype),
        "model.embed_tokens.weight": torch.randn(300, 16, generator=generator).to(dtype),
        "lm_head.weight": torch.randn(300, 16, generator=generator).to(dtype),  # same layout, other bytes
    }
    save_file(tensors, str(folder / "model.safetensors"))
    return tensors


def _mapped(folder: Path, name: str) -> torch.Tensor:
    with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
        return handle.get_tensor(name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_table_is_found_by_its_bytes_and_reads_the_rows_a_lookup_would(tmp_path: Path, dtype: torch.dtype) -> None:
    saved = _saved(tmp_path, dtype)
    weight = _mapped(tmp_path, "model.embed_tokens.weight")
    found = rows.locate(tmp_path, weight)
    assert found is not None and found.path == tmp_path / "model.safetensors"
    assert (found.rows, found.cols, found.dtype) == (300, 16, dtype)
    ids = torch.tensor([[5, 299, 0, 5], [7, 7, 1, 298]])
    assert torch.equal(found.lookup(ids), F.embedding(ids, saved["model.embed_tokens.weight"]))
    # The same-shaped lm_head is told apart by its bytes.
    head = rows.locate(tmp_path, _mapped(tmp_path, "lm_head.weight"))
    assert head is not None and head.offset != found.offset
    row = torch.empty(16, dtype=dtype)
    head.read_row_into(299, rows.byte_view(row))
    assert torch.equal(row, saved["lm_head.weight"][299])


def test_a_tensor_the_files_do_not_hold_is_read_from_memory_as_before(tmp_path: Path) -> None:
    _saved(tmp_path)
    other = torch.randn(300, 16)  # the right layout, other values
    assert rows.locate(tmp_path, other) is None
    assert rows.locate(None, other) is None
    assert rows.locate(tmp_path, other.t()) is None  # not contiguous rows
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 64)  # a damaged header is skipped, not raised
    assert rows.locate(tmp_path, _saved_elsewhere(tmp_path)) is None


def _saved_elsewhere(tmp_path: Path) -> torch.Tensor:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _saved(elsewhere)
    return _mapped(elsewhere, "model.embed_tokens.weight")


def test_a_weight_file_cut_short_while_loaded_says_so(tmp_path: Path) -> None:
    _saved(tmp_path)
    found = rows.locate(tmp_path, _mapped(tmp_path, "model.embed_tokens.weight"))
    assert found is not None
    path = tmp_path / "model.safetensors"
    with path.open("r+b") as handle:
        handle.truncate(found.offset + 10 * found.row_bytes)
    buffer = rows.byte_view(torch.empty(16))
    found.read_row_into(9, buffer)  # still there
    with pytest.raises(rows.RowReadError, match="was cut short while the model was loaded"):
        found.read_row_into(10, buffer)
    with pytest.raises(IndexError, match="row 300 is outside the table's 300 rows"):
        found.read_row_into(300, buffer)


def test_positioned_reads_work_without_preadv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    saved = _saved(tmp_path)
    found = rows.locate(tmp_path, _mapped(tmp_path, "model.embed_tokens.weight"))
    assert found is not None
    monkeypatch.delattr(positioned.os, "preadv", raising=False)  # Windows has no os.preadv
    ids = torch.tensor([3, 1, 3])
    assert torch.equal(found.lookup(ids), saved["model.embed_tokens.weight"][ids])


def test_page_span_covers_whole_pages() -> None:
    assert rows.page_span(4096, 1, page=4096) == (4096, 4096)
    assert rows.page_span(4095, 2, page=4096) == (0, 8192)
    assert rows.page_span(8192, 8192, page=4096) == (8192, 8192)


@pytest.mark.skipif(not sys.platform.startswith("linux") and sys.platform != "darwin", reason="no madvise")
def test_read_around_can_be_switched_off_for_a_mapped_table(tmp_path: Path) -> None:
    _saved(tmp_path)
    weight = _mapped(tmp_path, "model.embed_tokens.weight")
    assert rows.advise_random_access(weight.data_ptr(), weight.numel() * weight.element_size())
    assert not rows.advise_random_access(weight.data_ptr(), 0)
