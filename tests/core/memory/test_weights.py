"""The weights' bytes as bitsandbytes stores them (the planner's exact counts on real models: test_planner.py)."""

from __future__ import annotations

import pytest

from app.core.memory.weights import nf4_weight_bytes


def test_nf4_bits_per_weight_follow_bitsandbytes_storage() -> None:
    weights = 4096 * 4096
    assert nf4_weight_bytes(weights, double_quant=False) * 8 / weights == pytest.approx(4.5, abs=0.001)
    assert nf4_weight_bytes(weights, double_quant=True) * 8 / weights == pytest.approx(4.127, abs=0.002)
    # Repacked on an AVX512-BF16 CPU: a bf16 absmax per 64 weights, with or without double quant.
    assert nf4_weight_bytes(weights, False, repacked=True) * 8 / weights == pytest.approx(4.25, abs=0.001)
    assert nf4_weight_bytes(weights, True, repacked=True) * 8 / weights == pytest.approx(4.25, abs=0.001)


def test_nf4_bytes_of_one_weight_by_hand() -> None:
    elements = 1536 * 576  # SmolLM2's gate_proj: 13,824 blocks of 64, 54 double-quant blocks of 256
    data, code = elements // 2, 16 * 4
    assert nf4_weight_bytes(elements, double_quant=False) == data + code + 13_824 * 4
    assert nf4_weight_bytes(elements, double_quant=True) == data + code + 13_824 + 54 * 4 + 256 * 4 + 4
    assert nf4_weight_bytes(elements, False, repacked=True) == data + code + 13_824 * 2
    assert nf4_weight_bytes(elements, True, repacked=True) == data + code + 13_824 * 2 + 4  # the offset stays
