"""What bitsandbytes stores for a 4-bit weight on the CPU, which depends on the CPU.

bitsandbytes 0.50 repacks a `Linear4bit` at its first inference forward on a CPU with AVX512-BF16, for its fused
4-bit kernel (`bitsandbytes.functional._convert_weight_packed_for_cpu`): the 4-bit data keeps its size ([N, K/2]
instead of [N*K/2, 1], nibbles reordered in blocks of 32 rows), the absmax becomes bf16 ([K/64, N]: 2 bytes per 64
weights), and with double quant the nested state (8-bit absmax, its fp32 absmax per 256 blocks and the 256-entry code
book) is dequantized away; the fp32 offset and the 16-entry NF4 code book stay. On any other CPU nothing changes.

`cpu_repacks_4bit()` is the one place that decides which kind of CPU this is (tests patch it to plan for the other
kind); a loaded module carries bnb's own per-module switch (`support_avx512bf16_for_cpu`), read by `will_repack`.
"""

from __future__ import annotations

from typing import Any

import torch

REPACK_BLOCK_N = 32  # rows per block of bnb's CPU packed layout (its `block_n`)


def cpu_repacks_4bit() -> bool:
    """Whether bitsandbytes repacks 4-bit weights at their first CPU forward here (its own AVX512-BF16 check)."""
    try:
        from bitsandbytes.nn import modules
    except ImportError:  # no bitsandbytes: nothing is ever 4-bit
        return False
    return bool(modules.has_avx512bf16())


def is_repacked(quant_state: Any) -> bool:
    return bool(getattr(quant_state, "packing_format_for_cpu", False))


def will_repack(module: torch.nn.Module) -> bool:
    """A CPU 4-bit layer bnb has not repacked yet but will at its next inference forward."""
    weight = getattr(module, "weight", None)
    state = getattr(weight, "quant_state", None)
    return (
        state is not None
        and isinstance(weight, torch.Tensor)
        and weight.device.type == "cpu"
        and bool(getattr(module, "support_avx512bf16_for_cpu", False))
        and not is_repacked(state)
    )


def unpack_repacked_codes(data: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """The [N, K] 4-bit code indices of a repacked weight (the first half of bnb's inverse, without touching state)."""
    rows, cols = shape
    packed = data.reshape(-1, REPACK_BLOCK_N)
    both = torch.cat([packed & 0xF, (packed >> 4) & 0xF], dim=-1)  # low nibbles hold the first 32 of each 64
    both = both.reshape(rows // REPACK_BLOCK_N, cols // 2, REPACK_BLOCK_N, 2).transpose(-3, -2)
    return both.reshape(rows, cols)


def dequantize_4bit(weight: torch.Tensor, quant_state: Any) -> torch.Tensor:
    """The dense weight of a bnb 4-bit layer in either layout.

    bnb's own `dequantize_4bit` reads a repacked weight as if it were not repacked and returns wrong values (no
    error), so a repacked one is decoded here: code[q] x its bf16 absmax, the values bnb's fused kernel multiplies by.
    """
    if not is_repacked(quant_state):
        import bitsandbytes.functional as bnb_functional

        dense: torch.Tensor = bnb_functional.dequantize_4bit(weight, quant_state)
        return dense
    rows, cols = (int(n) for n in quant_state.shape)
    codes = unpack_repacked_codes(weight, (rows, cols)).long()
    scale = quant_state.absmax.float().t().repeat_interleave(quant_state.blocksize, dim=1)  # [N, K]
    values = quant_state.code.float()[codes] * scale
    return values.to(getattr(quant_state, "original_dtype", quant_state.dtype))
