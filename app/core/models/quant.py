"""The weights' precision: the names a user can pick, what `auto` becomes on each device, and what each name means
to the loader (bitsandbytes or a plain dtype) and to the memory planner.

Every place that lists, checks or explains the names reads them here: settings, the command line's choices and
help, the window's combo boxes and tooltips, the loader and the planner. Torch-free at import (the window imports
it); only `quantization_kwargs` reaches for torch and transformers, when a model is really loaded or planned.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, cast, get_args

from app.core.errors import QuantizationError

if TYPE_CHECKING:
    import torch

# What the loader stores: bitsandbytes 4-bit NormalFloat (with or without double quant), LLM.int8, or a plain dtype.
Precision = Literal["nf4", "nf4-nodq", "int8", "q4", "bf16", "fp16", "fp32"]
# What a user picks: a precision, or `auto` (resolved per device by `resolve_quantization`).
Quantization = Literal["auto", "nf4", "nf4-nodq", "int8", "q4", "bf16", "fp16", "fp32"]

QUANTIZATIONS: tuple[Quantization, ...] = get_args(Quantization)
PRECISIONS: tuple[Precision, ...] = get_args(Precision)
BNB_4BIT: tuple[Precision, ...] = ("nf4", "nf4-nodq")
BITSANDBYTES: tuple[Precision, ...] = (*BNB_4BIT, "int8")

DESCRIPTIONS: dict[Precision, str] = {
    "nf4": "4-bit NormalFloat, double-quantized (bitsandbytes)",
    "nf4-nodq": "4-bit NormalFloat without double quantization (bitsandbytes)",
    "int8": "8-bit LLM.int8 (bitsandbytes)",
    "q4": "4-bit Q4_1 blocks held once for the CPU's fused decode step (prefill dequantizes a layer at a time)",
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp32": "float32",
}

# The device kinds `auto` is resolved for, as the user reads them, in the order help texts list them.
_DEVICE_KINDS = (("cpu", "the CPU"), ("cuda", "a CUDA GPU"), ("mps", "Apple MPS"))


def auto_precision(device: str) -> Precision:
    """What `auto` loads on a resolved torch device ("cpu", "cuda:0", "mps")."""
    if device == "mps":
        return "fp16"  # bitsandbytes has no MPS kernels; Metal's bf16 support is patchy
    if device.startswith("cpu"):
        # Decode on the CPU runs the fused C step over Q4_1 copies whatever the loaded precision (app.core.fastpath;
        # bf16 and nf4 both ~145 tok/s on SmolLM2-135M, bench/engine.py). q4 holds those copies as the only weights
        # and prefills from them (app.core.fastpath.packed): a 1B model peaks at 1.3 GiB instead of 3.1 with bf16
        # (bench/peer.py). Where the fused step can't run, the loader holds bf16 instead, with a notice.
        return "q4"
    return "nf4"


def auto_summary() -> str:
    """What `auto` means, per device, for help texts and tooltips: "bf16 on the CPU, nf4 on a CUDA GPU, ..."."""
    return ", ".join(f"{auto_precision(device)} on {label}" for device, label in _DEVICE_KINDS)


def parse_quantization(text: str) -> Quantization:
    """A user's choice (a settings value, a combo box's text) as the typed name; QuantizationError if unknown."""
    if text not in QUANTIZATIONS:
        raise QuantizationError(f"Unknown quantization {text!r}: use {_listed(QUANTIZATIONS)}.")
    return text


def resolve_quantization(choice: str, device: str) -> Precision:
    """The precision to load for a choice on a resolved torch device; QuantizationError for an unknown name or
    a bitsandbytes precision on Apple MPS."""
    chosen = parse_quantization(choice)
    if chosen == "auto":
        return auto_precision(device)
    if chosen == "q4" and not device.startswith("cpu"):
        raise QuantizationError(
            f"q4 holds the weights for the CPU's fused decode step; on {device} use nf4, int8, bf16 or fp16."
        )
    if chosen in BITSANDBYTES and device == "mps":
        raise QuantizationError(f"{chosen} (bitsandbytes) is not supported on Apple MPS here; use fp16 or bf16.")
    return chosen


def is_bitsandbytes(precision: str) -> bool:
    return precision in BITSANDBYTES


def is_4bit(precision: str) -> bool:
    return precision in BNB_4BIT


def uses_double_quant(precision: str) -> bool:
    """Whether bitsandbytes also quantizes the 4-bit blocks' scales (nf4 does, nf4-nodq does not)."""
    return precision == "nf4"


def compute_dtype_name(device: str) -> Literal["bf16", "fp16"]:
    """The dtype bitsandbytes layers compute in (and 16-bit activations and the KV cache use) on a device."""
    return "fp16" if device == "mps" else "bf16"


def weights_dtype_name(precision: str, device: str) -> Literal["bf16", "fp16", "fp32"]:
    """The torch dtype everything bitsandbytes leaves alone (embeddings, norms, lm_head) is loaded in."""
    if is_bitsandbytes(precision):
        return compute_dtype_name(device)
    if precision == "q4":
        return "bf16"  # loaded as bf16 (mapped, not read), then held once as Q4_1 (app.core.fastpath.packed)
    if precision in ("bf16", "fp16", "fp32"):
        return cast(Literal["bf16", "fp16", "fp32"], precision)
    raise QuantizationError(f"Unknown quantization {precision!r}: use {_listed(PRECISIONS)}.")


# bitsandbytes' skip list replaces its default, so lm_head must be named to stay 16-bit.
BNB_SKIP_MODULES = ("lm_head",)


def torch_dtype(name: str) -> torch.dtype:
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def quantization_kwargs(precision: str, device: str) -> dict[str, Any]:
    """from_pretrained kwargs for a resolved precision (bnb's own defaults, fp4 and fp32 compute, are wrong here)."""
    dtype = torch_dtype(weights_dtype_name(precision, device))
    if not is_bitsandbytes(precision):
        return {"dtype": dtype}
    from transformers import BitsAndBytesConfig

    if is_4bit(precision):
        config = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=uses_double_quant(precision),
            bnb_4bit_compute_dtype=dtype,
            llm_int8_skip_modules=list(BNB_SKIP_MODULES),
        )
    else:
        config = BitsAndBytesConfig(load_in_8bit=True, llm_int8_skip_modules=list(BNB_SKIP_MODULES))
    return {"quantization_config": config, "dtype": dtype}


def _listed(names: tuple[str, ...]) -> str:
    return ", ".join(names[:-1]) + " or " + names[-1]
