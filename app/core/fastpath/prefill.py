"""Prefill on CPUs without native bf16 matrix multiply: bf16 weights, fp32 GEMMs.

On an AVX2 CPU (no AVX512-BF16/AMX) torch's bf16 GEMM converts as it goes and runs ~7x slower than MKL's fp32 sgemm
(measured: a 512x576 @ 576x1536 product, 48 ms vs 6.9 ms; SmolLM2-135M prefills 512 tokens in 5.8 s vs 0.93 s). So
multi-row calls of a bf16 model's linear layers upcast the activations and the weight to fp32 for the product and
cast the result back: the weights stay bf16 in memory (the fp32 copy lives for one call), and single-token steps,
which such a copy would slow down, keep the plain bf16 kernel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

MIN_ROWS = 8  # below this, converting the weight costs more than the faster GEMM saves (measured: equal at 8)


class UpcastLinear(nn.Linear):
    """nn.Linear whose multi-row calls run in fp32 (installed by swapping an instance's class)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if input.dtype != torch.bfloat16 or input.numel() < MIN_ROWS * input.shape[-1]:
            return F.linear(input, self.weight, self.bias)
        bias = self.bias.float() if self.bias is not None else None
        return F.linear(input.float(), self.weight.float(), bias).to(input.dtype)


def gemm_dtype() -> torch.dtype:
    """The dtype q4's prefill dequantizes its matrices into and multiplies in here: bf16 where that GEMM is native,
    else fp32."""
    return torch.bfloat16 if native_bf16_gemm() else torch.float32


def native_bf16_gemm() -> bool:
    """Whether torch runs bf16 GEMMs through oneDNN here (AVX-512 / AVX512-BF16 / AMX), detected at run time.

    That route is fast (this session's AVX512-BF16 EPYC: 512x576 @ 576x1536 in 10 ms vs 55 ms with oneDNN off) but
    not row-invariant: a 6-row and a 1-row product may round differently. Without it (AVX2 CPUs, or oneDNN turned
    off with torch.backends.mkldnn) torch's own bf16 kernel converts as it goes: slow, and each row rounds alike.
    """
    if not torch.backends.mkldnn.is_available() or not torch.backends.mkldnn.enabled:
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def apply_prefill_upcast(model: nn.Module, device: str, quantization: str) -> int:
    """Swap a bf16 CPU model's plain linear layers to UpcastLinear where bf16 GEMM is not native; returns how many."""
    if quantization != "bf16" or not str(device).startswith("cpu") or native_bf16_gemm():
        return 0
    swapped = 0
    for module in model.modules():
        if type(module) is nn.Linear and module.weight.dtype == torch.bfloat16:
            module.__class__ = UpcastLinear
            swapped += 1
    return swapped


def uses_upcast(model: nn.Module) -> bool:
    return any(type(module) is UpcastLinear for module in model.modules())
