"""bench/gguf_files.py's description of a GGUF: block types, bytes per type, roles, bytes a decode step reads."""

from __future__ import annotations

from pathlib import Path

from bench.gguf_files import describe, histogram_lines, role
from tests.bench.test_quality import write_model


def test_gguf_description_counts_block_types_and_decode_bytes(tmp_path: Path) -> None:
    _, tied = write_model(tmp_path / "tied", True, None)
    info = describe(tied)
    assert info["types"] == {"F32": 5, "Q8_0": 15}  # 2 layers x (7 matrices + 2 norms) + output_norm; embedding
    assert info["type_bytes"]["Q8_0"] == (2 * (2 * 64 * 64 + 2 * 32 * 64 + 3 * 64 * 128) + 256 * 64) // 32 * 34
    assert info["roles"]["attn_q"] == {"Q8_0": 2} and info["roles"]["token_embd"] == {"Q8_0": 1}
    assert info["decode_bytes_per_token"] == sum(info["type_bytes"].values())  # tied: the embedding is the head
    _, untied = write_model(tmp_path / "untied", False, None)
    separate = describe(untied)
    embedding = 256 * 64 // 32 * 34
    assert separate["decode_bytes_per_token"] == sum(separate["type_bytes"].values()) - embedding
    assert any("Q8_0" in line and "tensors" in line for line in histogram_lines(info))
    assert role("blk.12.ffn_down.weight") == "ffn_down" and role("token_embd.weight") == "token_embd"
