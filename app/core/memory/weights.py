"""A model's weights in bytes, as each quantization stores them: bitsandbytes' NF4 (packed data and quant_state,
repacked or not), LLM.int8, the packed Q4 records, everything left alone at its real dtype; counted on the model
built on the meta device (shapes, no memory)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from app.core.errors import CorruptModelError, UnsupportedModelError
from app.core.models.quant import is_bitsandbytes, uses_double_quant

PREFILL_CHUNK = 512  # app.core.engines.generation.PREFILL_CHUNK (not imported: the engine pulls in the sampling stack)
NF4_BLOCKSIZE = 64  # bitsandbytes' 4-bit blocksize: one absmax per 64 weights
NF4_CODE_BYTES = 16 * 4  # the 16-entry fp32 NF4 code book, one per layer
DQ_BLOCKSIZE = 256  # double quant: absmax quantized to 8 bits in blocks of 256, one fp32 absmax each
DQ_CODE_BYTES = 256 * 4  # the 8-bit dynamic code book (fp32), one per layer
DQ_OFFSET_BYTES = 4  # the fp32 mean subtracted from the absmax before quantizing it
REPACKED_ABSMAX_BYTES = 2  # bf16 absmax per block in bnb's AVX512-BF16 CPU layout


@dataclass(frozen=True)
class WeightsEstimate:
    parameters: int
    quantized_parameters: int
    total_bytes: int
    other_bytes: int  # embeddings, final norm, lm_head, buffers: never offloaded
    layer_bytes: tuple[int, ...]  # each decoder layer as stored on the device
    layer_bytes_unquantized: tuple[int, ...]  # each decoder layer at the compute dtype (bnb's CPU offload)
    largest_quantized_linear: int  # elements of the biggest quantized weight (its dequantized copy is a transient)
    # q4: the embedding stays in the weight file and is read a row at a time (not in total_bytes: in the overhead,
    # `embedding_rows`, is what one prefill chunk's lookup holds), and the prefill scratch (a bounded chunk of
    # dequantized rows, plus the int8 lm_head's chunk at fp32), which replaces a whole dequantized matrix.
    embedding_rows_bytes: int = 0
    scratch_bytes: int | None = None


def nf4_weight_bytes(elements: int, double_quant: bool, repacked: bool = False) -> int:
    """Bytes bitsandbytes holds for one NF4 weight: packed 4-bit data + its quant_state (absmax, code book...).

    `repacked`: the layout bnb switches to at the first forward on an AVX512-BF16 CPU (app.core.models.bnb_cpu): a bf16
    absmax per block, the nested double-quant state dequantized away (its fp32 offset stays).
    """
    blocks = math.ceil(elements / NF4_BLOCKSIZE)
    size = math.ceil(elements / 2) + NF4_CODE_BYTES
    if repacked:
        return size + blocks * REPACKED_ABSMAX_BYTES + (DQ_OFFSET_BYTES if double_quant else 0)
    if double_quant:
        return size + blocks + math.ceil(blocks / DQ_BLOCKSIZE) * 4 + DQ_CODE_BYTES + DQ_OFFSET_BYTES
    return size + blocks * 4


def int8_weight_bytes(out_features: int, in_features: int) -> int:
    """LLM.int8: one int8 per weight plus one fp32 scale (SCB) per output row."""
    return out_features * in_features + out_features * 4


def meta_model(config: Any, dtype: torch.dtype) -> Any:
    """The model with every tensor on the meta device: shapes and dtypes, no memory, no weight files."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    try:
        with init_empty_weights(include_buffers=True):
            return AutoModelForCausalLM.from_config(config, dtype=dtype)
    except (ValueError, KeyError) as exc:
        raise UnsupportedModelError(
            f"{config.model_type}: transformers cannot build this model as a causal LM ({exc})."
        ) from exc
    except (AssertionError, TypeError, RuntimeError) as exc:
        raise CorruptModelError(f"The {config.model_type} config describes an impossible model ({exc}).") from exc


def estimate_weights(
    model: Any,
    quantization: str,
    skip_modules: list[str],
    dtype: torch.dtype,
    *,
    repacked_4bit: bool = False,
    stored_dtype: torch.dtype | None = None,
) -> WeightsEstimate:
    """Bytes per decoder layer and for the rest, for a meta-device model loaded as `quantization`.

    `repacked_4bit`: count 4-bit weights in the layout bnb keeps after its first forward on an AVX512-BF16 CPU.
    """
    from torch import nn
    from transformers.pytorch_utils import Conv1D
    from transformers.quantizers.base import HfQuantizer
    from transformers.quantizers.quantizers_utils import should_convert_module

    if quantization == "q4":
        return _estimate_q4_weights(model, dtype, stored_dtype)
    quantized = is_bitsandbytes(quantization)
    keep_fp32 = list(getattr(model, "_keep_in_fp32_modules", None) or []) + list(
        getattr(model, "_keep_in_fp32_modules_strict", None) or []
    )
    not_converted = HfQuantizer.get_modules_to_not_convert(model, skip_modules, keep_fp32) if quantized else []
    layer_names = _decoder_layer_names(model)
    layer_index = {name: i for i, name in enumerate(layer_names)}
    stored = [0] * len(layer_names)
    unquantized = [0] * len(layer_names)
    other = 0
    parameters = quantized_parameters = largest = 0
    seen: set[int] = set()
    compute_bytes = torch.tensor([], dtype=dtype).element_size()

    for module_name, module in model.named_modules():
        group = _group_of(module_name, layer_index)
        quantize_here = (
            quantized
            and (type(module) is nn.Linear or isinstance(module, Conv1D))
            and should_convert_module(module_name, not_converted)
        )
        tensors = [(n, t, True) for n, t in module.named_parameters(recurse=False)]
        tensors += [(n, t, False) for n, t in module.named_buffers(recurse=False)]
        for tensor_name, tensor, is_parameter in tensors:
            if id(tensor) in seen:
                continue  # tied weights live once
            seen.add(id(tensor))
            elements = tensor.numel()
            plain = elements * tensor.element_size()
            if is_parameter:
                parameters += elements
                if any(_matches(f"{module_name}.{tensor_name}", key) for key in keep_fp32):
                    plain = elements * 4
            size = plain
            if quantize_here and is_parameter and tensor_name == "weight":
                quantized_parameters += elements
                largest = max(largest, elements)
                if quantization == "int8":
                    out_features = tensor.shape[1] if isinstance(module, Conv1D) else tensor.shape[0]
                    size = int8_weight_bytes(out_features, elements // out_features)
                else:
                    size = nf4_weight_bytes(elements, uses_double_quant(quantization), repacked=repacked_4bit)
                plain = elements * compute_bytes
            if group is None:
                other += size
            else:
                stored[group] += size
                unquantized[group] += plain
    return WeightsEstimate(
        parameters=parameters,
        quantized_parameters=quantized_parameters,
        total_bytes=other + sum(stored),
        other_bytes=other,
        layer_bytes=tuple(stored),
        layer_bytes_unquantized=tuple(unquantized),
        largest_quantized_linear=largest,
    )


def _estimate_q4_weights(model: Any, dtype: torch.dtype, stored_dtype: torch.dtype | None = None) -> WeightsEstimate:
    """`q4` (CPU): every linear layer inside a decoder layer held once as Q4_1 (20 bytes per 32 weights), the lm_head
    (tied or not) as int8 rows + an fp32 scale per row (app.core.fastpath.packed), the embedding mapped from the weight
    file (`stored_dtype`) and read by row (`embedding_rows_bytes`: one prefill chunk's rows), everything else at
    `dtype`."""
    from torch import nn

    from app.core.fastpath import prefill
    from app.core.fastpath.cpu import expected_q4_kernel
    from app.core.fastpath.native import head_bytes, packed_matrix_bytes
    from app.core.fastpath.packed import (
        MAPPABLE_EMBEDDING_DTYPES,
        RECORD_PREFILL_BYTES_PER_VALUE,
        RECORD_PREFILL_ROWS,
        chunk_rows,
    )

    layer_names = _decoder_layer_names(model)
    layer_index = {name: i for i, name in enumerate(layer_names)}
    stored = [0] * len(layer_names)
    unquantized = [0] * len(layer_names)
    other = parameters = quantized_parameters = largest = 0
    head = model.get_output_embeddings()
    embedding = model.get_input_embeddings()
    tied = head is not None and head.weight is embedding.weight
    compute_bytes = torch.tensor([], dtype=dtype).element_size()
    mapped_dtype = stored_dtype if stored_dtype in MAPPABLE_EMBEDDING_DTYPES else None
    embedding_rows_bytes = widest = 0
    head_width = 0
    seen: set[int] = set()
    for module_name, module in model.named_modules():
        group = _group_of(module_name, layer_index)
        for tensor_name, tensor in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
            if id(tensor) in seen:
                continue
            seen.add(id(tensor))
            is_weight = tensor_name == "weight" and type(module) is nn.Linear
            if any(tensor is p for p in module.parameters(recurse=False)):
                parameters += tensor.numel()
            plain = tensor.numel() * tensor.element_size()
            size = plain
            if is_weight and group is not None:
                size = packed_matrix_bytes(module.out_features, module.in_features, "q4")
                quantized_parameters += tensor.numel()
                largest = max(largest, tensor.numel())
                widest = max(widest, module.in_features)
                plain = tensor.numel() * compute_bytes
            elif module is embedding and tensor_name == "weight" and mapped_dtype is not None:
                size = 0  # read from the file by row (app.core.fastpath.rows), in the overhead as `embedding_rows`
                # A chunk's distinct rows and their gather in the file's dtype, then the copy at the compute dtype.
                stored_bytes = torch.tensor([], dtype=mapped_dtype).element_size()
                chunk = min(int(tensor.shape[0]), PREFILL_CHUNK)
                embedding_rows_bytes = chunk * int(tensor.shape[1]) * (2 * stored_bytes + compute_bytes)
                if tied:  # the head is the int8 rows, held once
                    size = head_bytes(int(tensor.shape[0]), int(tensor.shape[1]))
                    quantized_parameters += tensor.numel()
                    head_width = int(tensor.shape[1])
            elif (is_weight and module is head) or (module is embedding and tied):
                size = head_bytes(int(tensor.shape[0]), int(tensor.shape[1]))
                quantized_parameters += tensor.numel()
                head_width = int(tensor.shape[1])
            if group is None:
                other += size
            else:
                stored[group] += size
                unquantized[group] += plain
    gemm_dtype = prefill.gemm_dtype()
    gemm_bytes = torch.tensor([], dtype=gemm_dtype).element_size()
    # Inputs of up to `record_rows` rows multiply the records (hearth_q4_prefill's activation buffers: the kernel this
    # CPU's flags name, as the best prebuilt or a -march=native build reports it); longer ones dequantize a chunk of
    # whole rows of at most SCRATCH_BYTES (or CHUNK_ROW_ALIGN rows of the widest matrix, never more than the largest
    # matrix) into the scratch buffer, which stays allocated once used.
    record_rows = min(RECORD_PREFILL_ROWS.get(expected_q4_kernel(), 0), PREFILL_CHUNK)
    scratch = int(record_rows * widest * RECORD_PREFILL_BYTES_PER_VALUE)
    if widest and record_rows < PREFILL_CHUNK:
        scratch += min(largest, chunk_rows(widest, gemm_dtype) * widest) * gemm_bytes
    # Int8RowsLinear dequantizes a chunk of its rows at a time into one fp32 buffer.
    if head_width:
        scratch += min(embedding.weight.shape[0], chunk_rows(head_width, torch.float32)) * head_width * 4
    return WeightsEstimate(
        parameters=parameters,
        quantized_parameters=quantized_parameters,
        total_bytes=other + sum(stored),
        other_bytes=other,
        layer_bytes=tuple(stored),
        layer_bytes_unquantized=tuple(unquantized),
        largest_quantized_linear=largest,
        embedding_rows_bytes=embedding_rows_bytes,
        scratch_bytes=scratch,
    )


def q4_unavailable(meta: Any) -> str:
    from app.core.fastpath.native import unsupported_reason

    return unsupported_reason(meta, "q4")


def _matches(name: str, key: str) -> bool:
    return name == key or name.startswith(key + ".") or f".{key}." in f".{name}."


def _decoder_layer_names(model: Any) -> list[str]:
    """The repeated blocks accelerate places whole on one device (the model's _no_split_modules)."""
    classes = set(getattr(model, "_no_split_modules", None) or [])
    names = [name for name, module in model.named_modules() if type(module).__name__ in classes]
    # Keep outermost blocks only (a no-split class may nest inside another).
    return [name for name in names if not any(name.startswith(other + ".") for other in names if other != name)]


def _group_of(module_name: str, layer_index: dict[str, int]) -> int | None:
    parts = module_name.split(".")
    for end in range(len(parts), 0, -1):
        found = layer_index.get(".".join(parts[:end]))
        if found is not None:
            return found
    return None
