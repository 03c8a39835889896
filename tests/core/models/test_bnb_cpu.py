"""bitsandbytes' CPU 4-bit layouts: reading a weight in either, and the fast paths on a model bnb already repacked.

The repacked layout is made here through bnb's own conversion (what its first forward calls on an AVX512-BF16 CPU),
so these run on any CPU; what needs bnb's fused kernel itself runs only where this CPU has it.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from app.core.engines.engine import Engine, KVState
from app.core.engines.loader import load_model
from app.core.models import bnb_cpu

needs_the_fused_4bit_kernel = pytest.mark.skipif(
    not bnb_cpu.cpu_repacks_4bit(), reason="bnb's fused CPU 4-bit kernel needs AVX512-BF16"
)


def _4bit_layers(model: torch.nn.Module) -> list[Any]:
    return [m for m in model.modules() if getattr(getattr(m, "weight", None), "quant_state", None) is not None]


def _repack(module: Any) -> None:
    from bitsandbytes.functional import _convert_weight_packed_for_cpu

    module.weight.data, module.weight.quant_state = _convert_weight_packed_for_cpu(
        module.weight.data, module.weight.quant_state
    )


@pytest.mark.parametrize("quant", ["nf4", "nf4-nodq"])
def test_dequantize_reads_the_repacked_layout(tiny_model_dir: Any, quant: str) -> None:
    loaded = load_model(str(tiny_model_dir("qwen2")), quantization=quant, device="cpu", ignore_fit=True)
    for layer in _4bit_layers(loaded.model):
        state = layer.weight.quant_state
        as_quantized = bnb_cpu.dequantize_4bit(layer.weight.data, state).float()
        _repack(layer)
        assert bnb_cpu.is_repacked(state) and layer.weight.data.shape == (layer.out_features, layer.in_features // 2)
        repacked = bnb_cpu.dequantize_4bit(layer.weight.data, layer.weight.quant_state)
        assert repacked.dtype == torch.bfloat16 and repacked.shape == as_quantized.shape
        # The same 4-bit codes; only the scale changed, to bf16 (8 significant bits): within 2^-7 of each weight.
        assert torch.allclose(repacked.float(), as_quantized, rtol=2**-7, atol=1e-6)


@needs_the_fused_4bit_kernel
def test_bnbs_fused_kernel_computes_with_the_weight_read_back(tiny_model_dir: Any) -> None:
    loaded = load_model(str(tiny_model_dir("qwen2")), quantization="nf4", device="cpu", ignore_fit=True)
    layer = _4bit_layers(loaded.model)[0]
    x = torch.randn(3, layer.in_features, generator=torch.Generator().manual_seed(0)).bfloat16()
    with torch.inference_mode():
        out = layer(x).float()  # the first forward repacks it
    assert bnb_cpu.is_repacked(layer.weight.quant_state)
    dense = bnb_cpu.dequantize_4bit(layer.weight.data, layer.weight.quant_state).float()
    want = F.linear(x.float(), dense, None if layer.bias is None else layer.bias.float())
    assert float((out - want).abs().max() / want.abs().max()) < 0.01


def test_fast_paths_read_the_weights_bnb_repacked(tiny_model_dir: Any) -> None:
    """An engine made after the model already ran (a second engine, a path switch) packs from repacked weights."""
    from app.core.fastpath import int8

    loaded = load_model(str(tiny_model_dir("llama")), quantization="nf4", device="cpu", ignore_fit=True)
    for layer in _4bit_layers(loaded.model):
        before = int8.dense_weight(layer)
        _repack(layer)
        after = int8.dense_weight(layer)
        assert before is not None and after is not None
        assert torch.allclose(after.float(), before.float(), rtol=2**-7, atol=1e-6)


@needs_the_fused_4bit_kernel
def test_int8_decode_made_after_the_first_reply_agrees_with_the_plain_path(tiny_model_dir: Any) -> None:
    loaded = load_model(str(tiny_model_dir("llama")), quantization="nf4", device="cpu", ignore_fit=True)
    plain = Engine(loaded, decode_path="eager")
    ids, tokens = [1, 504, 3458, 282, 4649, 30], [30, 1, 504, 282]
    plain_kv, fast_kv = KVState(), KVState()
    with torch.inference_mode():
        plain._forward(ids, plain_kv)  # bnb repacks every layer here
        assert all(bnb_cpu.is_repacked(m.weight.quant_state) for m in _4bit_layers(loaded.model))
        fast = Engine(loaded, decode_path="int8-decode")
        assert fast.decode_path == "int8-decode"
        fast._forward(ids, fast_kv)
        for token in tokens:
            want = plain._forward([token], plain_kv, decode_step=True)
            with fast.path.step():
                got = fast._forward([token], fast_kv, decode_step=True)
            assert float((got - want).abs().max() / want.abs().max()) < 0.05  # test_fastpath's LOGIT_ERROR_BOUND
