"""The memory planner: what a model will need, before any weight is loaded.

The config comes from app.core.memory.model_config, the weights' bytes from app.core.memory.weights (the model built
on the meta device, each quantized layer at what its library stores). The KV cache follows the layer layout
transformers' DynamicCache builds from the config (GQA heads, sliding windows capped at `window - 1` tokens).
Overhead constants are measured, see app.core.memory.calibration.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import torch

from app.core.errors import DeviceUnavailableError
from app.core.memory import calibration
from app.core.memory.model_config import ModelShape, load_config, model_shape, weights_dtype_of
from app.core.memory.types import Fit, MemoryPlan, format_bytes
from app.core.memory.weights import PREFILL_CHUNK, WeightsEstimate, estimate_weights, meta_model, q4_unavailable
from app.core.models import bnb_cpu
from app.core.models.attention import attention_shape
from app.core.models.model_source import ModelSource
from app.core.models.quant import is_4bit, quantization_kwargs, resolve_quantization, weights_dtype_name


@dataclass(frozen=True)
class KVLayer:
    bytes_per_token: int
    window: int | None  # sliding window: the layer keeps at most window - 1 tokens


@dataclass(frozen=True)
class KVLayout:
    layers: tuple[KVLayer, ...]
    dtype_bytes: int
    unmodelled: tuple[str, ...] = ()  # layer types with constant-size state (recurrent, conv) not counted

    def bytes_at(self, tokens: int) -> int:
        return sum(
            layer.bytes_per_token * (min(tokens, layer.window - 1) if layer.window else tokens) for layer in self.layers
        )

    @property
    def bytes_per_token(self) -> int:
        return sum(layer.bytes_per_token for layer in self.layers)

    @property
    def bytes_per_token_long(self) -> int:
        return sum(layer.bytes_per_token for layer in self.layers if not layer.window)

    def largest_layer_at(self, tokens: int) -> int:
        return max(
            (
                layer.bytes_per_token * (min(tokens, layer.window - 1) if layer.window else tokens)
                for layer in self.layers
            ),
            default=0,
        )

    def tokens_until(self, start_tokens: int, budget_bytes: int) -> int | None:
        """The token count at which the cache, growing from start_tokens, has used budget_bytes more (None: never)."""
        if self.bytes_per_token_long == 0:
            # Every layer is windowed: the cache stops growing at the largest window.
            cap = max((layer.window or 0) for layer in self.layers) if self.layers else 0
            if self.bytes_at(cap) - self.bytes_at(start_tokens) <= budget_bytes:
                return None
        base = self.bytes_at(start_tokens)
        low, high = start_tokens, max(start_tokens + 1, start_tokens * 2)
        while self.bytes_at(high) - base <= budget_bytes:
            low, high = high, high * 2
        while high - low > 1:
            middle = (low + high) // 2
            if self.bytes_at(middle) - base <= budget_bytes:
                low = middle
            else:
                high = middle
        return low


# -- KV cache --------------------------------------------------------------------------------------------------
def kv_layout(config: Any, dtype_bytes: int) -> KVLayout:
    """Per layer KV bytes per token, as DynamicCache(config=...) lays the cache out: the one KV size function (the
    live accounting, the engine backend's fallback and the self-test read it too)."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    text = config.get_text_config(decoder=True)
    layer_types, layer_kwargs = get_layer_types_and_kwargs(text)
    per_layer = list(getattr(text, "per_layer_config", None) or [text] * len(layer_types))
    layers: list[KVLayer] = []
    unmodelled: list[str] = []
    for layer_type, kwargs, layer_config in zip(layer_types, layer_kwargs, per_layer, strict=False):
        if layer_type == "dummy":
            continue
        if layer_type not in ("full_attention", "sliding_attention", "chunked_attention"):
            unmodelled.append(layer_type)
            continue
        window = kwargs.get("sliding_window")
        per_token = attention_shape(layer_config).kv_bytes_per_token(dtype_bytes)
        layers.append(KVLayer(bytes_per_token=per_token, window=window or None))
    return KVLayout(tuple(layers), dtype_bytes, tuple(sorted(set(unmodelled))))


def repacks_4bit_on(device: str, quantization: str) -> bool:
    """Whether bnb will hold this plan's 4-bit weights in its repacked CPU layout (only on the CPU, this kind)."""
    return device.startswith("cpu") and is_4bit(quantization) and bnb_cpu.cpu_repacks_4bit()


# -- devices ---------------------------------------------------------------------------------------------------
def normalize_device(device: str) -> str:
    """A torch device string for planning; `auto` picks what the loader would (CUDA, then MPS, then the CPU)."""
    if device == "auto":
        if torch.cuda.is_available():
            return "cuda:0"
        mps = getattr(torch.backends, "mps", None)
        return "mps" if mps is not None and mps.is_available() else "cpu"
    if device == "cuda":
        return "cuda:0"
    if device in ("cpu", "mps") or (device.startswith("cuda:") and device[5:].isdigit()):
        return device
    raise DeviceUnavailableError(f"Unknown device {device!r}: use auto, cuda, cpu or mps.")


def device_free_bytes(device: str) -> tuple[int, int]:
    """(free, total) bytes on the device now: torch.cuda.mem_get_info on CUDA, psutil's available RAM otherwise."""
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise DeviceUnavailableError(
                "No CUDA GPU here to measure free memory on: state it with --free (e.g. --free 24GiB)."
            )
        free, total = torch.cuda.mem_get_info(torch.device(device))
        return int(free), int(total)
    memory = psutil.virtual_memory()
    return int(memory.available), int(memory.total)


def fused_decode_copy_bytes(meta: Any, quantization: str, device: str) -> int:
    """The copies the CPU's fused decode step adds under "auto" (app.core.fastpath): the lm_head as int8 rows (1 byte
    per weight + an fp32 scale per row), every decoder matrix in its format (Q4_1: 20 bytes per 32 weights; int8 like
    the lm_head), fp32 biases and norms; 0 where that path will not run."""
    from torch import nn

    from app.core.fastpath.native import head_bytes, packed_matrix_bytes, unsupported_reason
    from app.core.fastpath.select import AUTO_FUSED_FORMAT

    if (
        not device.startswith("cpu")
        or quantization not in AUTO_FUSED_FORMAT
        or unsupported_reason(meta, AUTO_FUSED_FORMAT[quantization])
    ):
        return 0
    head = meta.get_output_embeddings()
    # q4 holds the decoder matrices (and an untied lm_head's int8 rows) once, in the weights: the step adds the rest.
    held_once = quantization == "q4"
    total = 0
    for module in meta.modules():
        if isinstance(module, nn.Linear):
            if not held_once:  # q4 holds the matrices and the lm_head's int8 rows (tied or not) in the model
                if module is head:
                    total += head_bytes(module.out_features, module.in_features)
                else:
                    total += packed_matrix_bytes(
                        module.out_features, module.in_features, AUTO_FUSED_FORMAT[quantization]
                    )
            total += 4 * module.out_features if module.bias is not None else 0
        elif type(module).__name__.endswith("RMSNorm") and isinstance(getattr(module, "weight", None), torch.Tensor):
            total += 4 * module.weight.numel()
    return total


# -- overhead --------------------------------------------------------------------------------------------------
def overhead_parts(
    shape: ModelShape,
    kv: KVLayout,
    weights: WeightsEstimate,
    *,
    context: int,
    device: str,
    compute_bytes: int,
    free_stated: bool,
    resident_bytes: int,
    decode_copies: int = 0,
    quantized_from_map: bool = False,
) -> dict[str, int]:
    """Memory beyond weights and KV cache: the prefill peak, bnb's dequantized copy, logits and the runtime."""
    chunk = max(1, min(PREFILL_CHUNK, context))
    activations = (
        chunk
        * compute_bytes
        * int(
            calibration.ACTIVATION_HIDDEN_COPIES * shape.hidden_size
            + calibration.ACTIVATION_INTERMEDIATE_COPIES * shape.intermediate_size
        )
        + calibration.ACTIVATION_FLOOR_BYTES
    )
    parts = {
        "prefill_activations": activations,
        # torch.cat in DynamicLayer.update copies one layer's keys and values while the old ones are still alive.
        "kv_append": kv.largest_layer_at(context),
        # logits_to_keep=1: one row of logits, in the compute dtype, then as fp32.
        "logits": shape.vocab_size * (compute_bytes + 4),
        # bnb dequantizes a whole 4/8-bit weight to the compute dtype for a prefill matmul (and on the CPU always).
        "dequantized_weight": weights.largest_quantized_linear
        * (compute_bytes if device.startswith("cuda") else calibration.CPU_DEQUANT_BYTES_PER_WEIGHT),
    }
    if weights.scratch_bytes is not None:  # q4: a bounded chunk of rows, not a whole matrix
        parts["dequantized_weight"] = weights.scratch_bytes
    if weights.embedding_rows_bytes:
        # The table itself is never resident: rows are read from the file by position (a table the files do not
        # hold byte for byte is read through the map instead: 64 KiB of fault-around per sparse row, not counted).
        parts["embedding_rows"] = weights.embedding_rows_bytes
    if device.startswith("cuda"):
        parts["allocator_slack"] = max(
            calibration.CUDA_ALLOCATOR_SLACK_MIN_BYTES,
            int(calibration.CUDA_ALLOCATOR_SLACK_FRACTION * resident_bytes),
        )
        if free_stated:
            parts["cuda_context"] = calibration.CUDA_CONTEXT_BYTES
    else:
        parts["runtime"] = calibration.CPU_RUNTIME_BYTES
        if decode_copies:  # the fused decode step's packed copies (made after loading, so they can reuse staging)
            parts["decode_copies"] = decode_copies
        # Quantizing on the CPU leaves the 16-bit staging copies' memory in the allocator's arenas: the load peak.
        # The cache and activations reuse it later, so only what it exceeds them by is extra.
        staging = int(weights.quantized_parameters * compute_bytes * calibration.CPU_QUANTIZE_STAGING_FRACTION)
        if quantized_from_map:  # q4 packs from the mapped file one matrix at a time: no 16-bit staging copy
            staging = 0
        running = sum(parts.values()) - parts["runtime"] + kv.bytes_at(context)
        parts["load_staging"] = max(0, staging - running)
    return parts


# -- the plan --------------------------------------------------------------------------------------------------
def plan_memory(
    source: str | Path | ModelSource | Mapping[str, Any] | None,
    *,
    quantization: str,
    context: int | None = None,
    device: str = "auto",
    free_bytes: int | None = None,
    cpu_free_bytes: int | None = None,
    name: str | None = None,
) -> MemoryPlan:
    """Estimate what loading `source` as `quantization` and filling `context` tokens of KV cache needs on `device`.

    `free_bytes`: the device's free memory to plan against (default: measured now). `cpu_free_bytes`: the host's
    available memory for CPU offload on CUDA (default: measured now).
    """
    torch_device = normalize_device(device)
    config, found_name = load_config(source)
    name = name or found_name
    quant = resolve_quantization(quantization, torch_device)
    kwargs = quantization_kwargs(quant, torch_device)
    dtype: torch.dtype = kwargs["dtype"]
    bnb_config = kwargs.get("quantization_config")
    skip = list(getattr(bnb_config, "llm_int8_skip_modules", None) or [])
    compute_bytes = torch.tensor([], dtype=dtype).element_size()

    shape = model_shape(config, name)
    tokens = int(context) if context else shape.max_context
    if tokens < 1:
        raise ValueError("context must be at least one token")
    meta = meta_model(config, dtype)
    held_as_bf16 = q4_unavailable(meta) if quant == "q4" else ""
    if (
        held_as_bf16
    ):  # the loader holds such a model as bf16 (app.core.engines.loader._hold_once): plan what it will hold
        quant = "bf16"
    repacked = repacks_4bit_on(torch_device, quant)
    stored = weights_dtype_of(source, config)
    weights = estimate_weights(meta, quant, skip, dtype, repacked_4bit=repacked, stored_dtype=stored)
    kv = kv_layout(config, compute_bytes)
    decode_copies = fused_decode_copy_bytes(meta, quant, torch_device)

    stated = free_bytes is not None
    if free_bytes is None:
        free_bytes, _ = device_free_bytes(torch_device)
    notes: list[str] = []
    if held_as_bf16:
        notes.append(f"Planned as bf16: q4 needs the fused decode step ({held_as_bf16}).")
    if kv.unmodelled:
        notes.append(f"Layers of type {', '.join(kv.unmodelled)} keep a fixed-size state that is not counted.")
    if repacked:
        notes.append(
            "4-bit weights are counted as bitsandbytes keeps them after the first reply on this AVX512-BF16 CPU "
            "(repacked for its fused kernel: a bf16 scale per 64 weights)."
        )
    if tokens > shape.max_context:
        notes.append(f"The context {tokens:,} is beyond the model's maximum of {shape.max_context:,} tokens.")

    def overhead(at: int, resident: int) -> dict[str, int]:
        return overhead_parts(
            shape,
            kv,
            weights,
            context=at,
            device=torch_device,
            compute_bytes=compute_bytes,
            free_stated=stated,
            resident_bytes=resident,
            decode_copies=decode_copies,
            quantized_from_map=quant == "q4",
        )

    def need_on_device(at: int, weights_on_device: int) -> tuple[int, dict[str, int]]:
        kv_at = kv.bytes_at(at)
        parts = overhead(at, weights_on_device + kv_at)
        return weights_on_device + kv_at + sum(parts.values()), parts

    total, parts = need_on_device(tokens, weights.total_bytes)
    fits: Fit = "yes" if total <= free_bytes else "no"
    weights_by_device = {torch_device: weights.total_bytes}
    all_weights = weights.total_bytes
    host_free: int | None = None
    if fits == "no" and torch_device.startswith("cuda"):
        host_free = cpu_free_bytes if cpu_free_bytes is not None else device_free_bytes("cpu")[0]
        placed = _offload(weights, lambda w: need_on_device(tokens, w)[0], free_bytes, host_free)
        if placed is not None:
            on_gpu, on_cpu = placed
            fits = "offload"
            weights_by_device = {torch_device: on_gpu, "cpu": on_cpu}
            all_weights = on_gpu + on_cpu
            total, parts = need_on_device(tokens, on_gpu)
            notes.append(
                f"{format_bytes(on_cpu)} of layers would run from the CPU (kept 16-bit there by bitsandbytes): "
                "much slower. Hearth loads whole models onto one device today, so this is refused on load."
            )

    # max_context: with the whole model on the device (what the loader does), never with offloading.
    max_context = _largest_fitting(lambda at: need_on_device(at, weights.total_bytes)[0], free_bytes, shape.max_context)
    if not kv.layers:
        notes.append("No attention layers found: the KV cache is not modelled.")
    return MemoryPlan(
        model=name,
        model_type=str(config.model_type),
        quantization=quant,
        device=torch_device,
        context=tokens,
        model_max_context=shape.max_context,
        parameters=weights.parameters,
        quantized_parameters=weights.quantized_parameters,
        weights_bytes=all_weights,
        weights_by_device=weights_by_device,
        kv_bytes_per_token=kv.bytes_per_token,
        kv_bytes_per_token_long=kv.bytes_per_token_long,
        kv_bytes=kv.bytes_at(tokens),
        kv_dtype=weights_dtype_name(quant, torch_device),  # the cache is kept in the 16/32-bit dtype
        kv_layers=len(kv.layers),
        kv_sliding_layers=sum(1 for layer in kv.layers if layer.window),
        overhead_bytes=sum(parts.values()),
        overhead=parts,
        total_bytes=total,
        free_bytes=int(free_bytes),
        free_source="stated" if stated else "measured",
        free_after_bytes=int(free_bytes) - total,
        fits=fits,
        max_context=max_context,
        cpu_free_bytes=host_free,
        notes=tuple(notes),
    )


def _offload(weights: WeightsEstimate, need: Any, gpu_free: int, cpu_free: int) -> tuple[int, int] | None:
    """Keep as many decoder layers on the GPU as fit (the rest on the CPU at 16 bits); None if even that fails."""
    on_gpu = weights.total_bytes
    on_cpu = 0
    for index in range(len(weights.layer_bytes) - 1, -1, -1):
        if need(on_gpu) <= gpu_free:
            break
        on_gpu -= weights.layer_bytes[index]
        on_cpu += weights.layer_bytes_unquantized[index]
    if need(on_gpu) > gpu_free or on_cpu > cpu_free or on_cpu == 0:
        return None
    return on_gpu, on_cpu


def _largest_fitting(need: Any, free: int, limit: int) -> int:
    """The largest context in [1, limit] whose need fits in free (0 if none); need grows with the context."""
    if need(1) > free:
        return 0
    if need(limit) <= free:
        return limit
    low, high = 1, limit
    while high - low > 1:
        middle = (low + high) // 2
        if need(middle) <= free:
            low = middle
        else:
            high = middle
    return low
