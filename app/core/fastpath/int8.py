"""Weight-only int8 for single-token steps: torch's own `_weight_int8pack_mm` CPU kernel (AVX2/AVX-512 vectorized).

Each linear layer gets a per-output-channel symmetric int8 copy of its weight (scale = max|w| / 127). The layer's
forward is patched on the instance: one row in -> the int8 kernel with bf16 activations; more rows (prefill) -> the
original weights, unchanged. `remove` restores the class forward and frees the copies.

The patch is inert unless the calling thread is inside `active()`: the engine turns it on around its own decode
steps, so anything else that runs the same model (a reference `generate`, another engine with the plain path) gets
the original weights.
"""

from __future__ import annotations

import threading
import types
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from app.core.fastpath.prefill import UpcastLinear

KERNEL_DTYPE = torch.bfloat16  # the kernel's fp32-activation variant is ~8x slower on AVX2 (measured)
KERNEL_NAME = "_weight_int8pack_mm"
PATCH_ATTR = "_hearth_decode_patch"
_state = threading.local()


@contextmanager
def active() -> Iterator[None]:
    """Run patched layers' single-token calls through the int8 kernel in this thread, for the block's duration."""
    previous = getattr(_state, "on", False)
    _state.on = True
    try:
        yield
    finally:
        _state.on = previous


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8: w ≈ q * scale[:, None], scale = max|row| / 127 (fp32)."""
    full = weight.detach().float()
    scale = full.abs().amax(dim=1).clamp(min=1e-8) / 127.0
    q = torch.round(full / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q.contiguous(), scale.contiguous()


class PackedInt8:
    """An int8 weight [N, K] and its per-row scales, ready for `_weight_int8pack_mm`."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.qweight, scale = quantize_rows(weight)
        self.scale = scale.to(KERNEL_DTYPE).contiguous()

    @classmethod
    def from_tensors(cls, qweight: torch.Tensor, scale: torch.Tensor) -> PackedInt8:
        packed = cls.__new__(cls)
        packed.qweight = qweight.contiguous()
        packed.scale = scale.to(KERNEL_DTYPE).contiguous()
        return packed

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).to(KERNEL_DTYPE)
        out = getattr(torch.ops.aten, KERNEL_NAME)(rows, self.qweight, self.scale)
        return out.reshape(*x.shape[:-1], self.qweight.shape[0])

    def dequantized(self) -> torch.Tensor:
        return self.qweight.float() * self.scale.float()[:, None]

    @property
    def nbytes(self) -> int:
        return self.qweight.numel() + self.scale.numel() * self.scale.element_size()


def int8_kernel_available() -> str:
    """Empty when the kernel runs and agrees with F.linear on a probe matrix, else the reason it can't be used."""
    if getattr(torch.ops.aten, KERNEL_NAME, None) is None:
        return f"torch {torch.__version__} has no {KERNEL_NAME} kernel"
    try:
        generator = torch.Generator().manual_seed(0)
        weight = torch.randn(64, 96, generator=generator)
        x = torch.randn(1, 96, generator=generator)
        packed = PackedInt8(weight)
        got = packed.matmul(x).float()
        want = F.linear(x, packed.dequantized())
    except (RuntimeError, NotImplementedError, TypeError) as exc:
        return f"the int8 kernel failed on a probe ({type(exc).__name__}: {exc})"
    error = float((got - want).abs().max() / want.abs().max())
    if error > 0.05:
        return f"the int8 kernel disagrees with F.linear on a probe (relative error {error:.3f})"
    return ""


def dense_weight(module: nn.Module) -> torch.Tensor | None:
    """The module's weight as a dense float tensor: plain Linear, or bitsandbytes 4-bit dequantized once."""
    from app.core.fastpath.packed import Q4Linear

    if isinstance(module, Q4Linear):  # held once as Q4_1 (q4): its dequantized values
        return module.dense(torch.float32).clone()
    weight = getattr(module, "weight", None)
    if type(module) in (nn.Linear, UpcastLinear) and isinstance(weight, torch.Tensor) and weight.is_floating_point():
        return weight
    quant_state = getattr(weight, "quant_state", None)
    if quant_state is not None and isinstance(module, nn.Linear) and isinstance(weight, torch.Tensor):
        from app.core.models import bnb_cpu  # bnb's own dequantize misreads a weight it repacked on an AVX512-BF16 CPU

        return bnb_cpu.dequantize_4bit(weight.data, quant_state)
    return None


@dataclass
class PatchResult:
    patched: int = 0
    added_bytes: int = 0
    reused: int = 0  # layers whose int8 copy came from `stored` (the on-disk cache), not packed now
    fresh: dict[str, torch.Tensor] = field(default_factory=dict)  # newly packed tensors, by "<module>.qweight|scale"


def patch_linears(model: nn.Module, skip: set[int], stored: Mapping[str, torch.Tensor] | None = None) -> PatchResult:
    """Patch every eligible linear layer not in `skip` (module ids), reusing `stored` int8 copies where they fit."""
    result = PatchResult()
    stored = stored or {}
    for name, module in model.named_modules():
        if id(module) in skip:
            continue
        if hasattr(module, PATCH_ATTR):  # another engine on the same model packed it already
            result.patched += 1
            continue
        weight = getattr(module, "weight", None)
        qweight, scale = stored.get(f"{name}.qweight"), stored.get(f"{name}.scale")
        if isinstance(module, nn.Linear) and qweight is not None and scale is not None and _fits(module, qweight):
            packed = PackedInt8.from_tensors(qweight, scale)
            result.reused += 1
        else:
            weight = dense_weight(module)
            if weight is None or weight.device.type != "cpu" or weight.dim() != 2:
                continue
            packed = PackedInt8(weight)
            result.fresh[f"{name}.qweight"] = packed.qweight
            result.fresh[f"{name}.scale"] = packed.scale
        setattr(module, PATCH_ATTR, packed)
        module.forward = types.MethodType(_make_forward(type(module).forward), module)
        result.patched += 1
        result.added_bytes += packed.nbytes
    return result


def _fits(module: nn.Linear, qweight: torch.Tensor) -> bool:
    weight = module.weight
    return (
        weight.device.type == "cpu"
        and qweight.dtype == torch.int8
        and tuple(qweight.shape) == (module.out_features, module.in_features)
    )


def unpatch_linears(model: nn.Module) -> int:
    restored = 0
    for module in model.modules():
        if hasattr(module, PATCH_ATTR):
            delattr(module, PATCH_ATTR)
            if "forward" in module.__dict__:
                del module.__dict__["forward"]
            restored += 1
    return restored


def _make_forward(plain_forward: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def forward(self: Any, x: torch.Tensor) -> torch.Tensor:
        packed: PackedInt8 | None = getattr(self, PATCH_ATTR, None)
        # Prefill, or a caller outside the engine's decode steps: the plain weights, exactly as before.
        if packed is None or x.numel() != x.shape[-1] or not getattr(_state, "on", False):
            return plain_forward(self, x)
        out = packed.matmul(x)
        bias = getattr(self, "bias", None)
        if bias is not None:
            out = out + bias.to(out.dtype)
        return out.to(x.dtype)

    return forward
