"""The memory planner: what a model will need, before any weight is loaded.

Weights come from the model built on the meta device (accelerate's init_empty_weights: shapes, no memory), with
the bytes bitsandbytes really stores for each quantized nn.Linear (packed data + quant_state); everything bnb leaves
alone (embeddings, norms, lm_head, tied weights, biases, buffers) is counted at its real dtype. The KV cache follows
the layer layout transformers' DynamicCache builds from the config (GQA heads, sliding windows capped at
`window - 1` tokens). Overhead constants are measured, see app.core.memory.calibration.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import torch

from app.core.errors import (
    CorruptModelError,
    DeviceUnavailableError,
    HearthError,
    ModelNotFoundError,
    UnsupportedModelError,
)
from app.core.memory import calibration
from app.core.memory.types import Fit, MemoryPlan, format_bytes
from app.core.models import bnb_cpu
from app.core.models.attention import attention_shape
from app.core.models.dtypes import FLOAT_DTYPES
from app.core.models.gguf_meta import config_dict_from_gguf
from app.core.models.model_source import ModelSource, check_config_sizes, resolve_model
from app.core.models.quant import (
    is_4bit,
    is_bitsandbytes,
    quantization_kwargs,
    resolve_quantization,
    uses_double_quant,
    weights_dtype_name,
)
from app.core.models.safetensors_header import read_header

PREFILL_CHUNK = 512  # app.core.engines.generation.PREFILL_CHUNK (not imported: the engine pulls in the sampling stack)
NF4_BLOCKSIZE = 64  # bitsandbytes' 4-bit blocksize: one absmax per 64 weights
NF4_CODE_BYTES = 16 * 4  # the 16-entry fp32 NF4 code book, one per layer
DQ_BLOCKSIZE = 256  # double quant: absmax quantized to 8 bits in blocks of 256, one fp32 absmax each
DQ_CODE_BYTES = 256 * 4  # the 8-bit dynamic code book (fp32), one per layer
DQ_OFFSET_BYTES = 4  # the fp32 mean subtracted from the absmax before quantizing it
REPACKED_ABSMAX_BYTES = 2  # bf16 absmax per block in bnb's AVX512-BF16 CPU layout


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


@dataclass(frozen=True)
class ModelShape:
    config: Any  # transformers PretrainedConfig
    name: str
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    max_context: int


# -- model configs ---------------------------------------------------------------------------------------------
def load_config(source: str | Path | ModelSource | Mapping[str, Any] | None) -> tuple[Any, str]:
    """A transformers config and a display name, from a spec, folder, config.json, .gguf, ModelSource or dict."""
    from transformers import PretrainedConfig

    if isinstance(source, PretrainedConfig):
        return source, str(getattr(source, "name_or_path", "") or source.model_type)
    if isinstance(source, Mapping):
        return _config_from_dict(dict(source), "config"), str(source.get("_name_or_path") or source.get("model_type"))
    if isinstance(source, str | Path) and Path(source).expanduser().name == "config.json":
        path = Path(source).expanduser()
        if not path.is_file():
            raise ModelNotFoundError(f"No model config at {path}: the file does not exist.")
        return _config_from_folder(path.parent), path.parent.name
    model = source if isinstance(source, ModelSource) else resolve_model(None if source is None else str(source))
    if model.kind == "gguf":
        return config_from_gguf(model.path), model.display_name
    ggufs = sorted(model.path.glob("*.gguf")) if not (model.path / "config.json").is_file() else []
    if ggufs:
        return config_from_gguf(ggufs[0]), model.display_name
    return _config_from_folder(model.path), model.display_name


def _config_from_folder(folder: Path) -> Any:
    from app.core.models.model_source import read_config

    data = read_config(folder)  # clear errors for a missing or broken config.json
    return _config_from_dict(data, str(folder / "config.json"))


def _config_from_dict(data: dict[str, Any], where: str) -> Any:
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = data.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise CorruptModelError(f"{where} has no model_type: it is not a transformers model config.")
    check_config_sizes(data, where)  # before anything is built from it
    if model_type not in CONFIG_MAPPING:
        raise UnsupportedModelError(
            f"{where}: model type {model_type!r} is not supported by this transformers version "
            "(models that need their own Python code are not planned)."
        )
    values = {k: v for k, v in data.items() if k != "model_type"}
    try:
        return AutoConfig.for_model(model_type, **values)
    except (TypeError, ValueError) as exc:
        raise CorruptModelError(f"{where} is not a valid {model_type} config: {exc}") from exc


def config_from_gguf(path: Path) -> Any:
    """The model config from a GGUF file's header (metadata only: no tensor is read or dequantized)."""
    return _config_from_dict(config_dict_from_gguf(path), str(path))


def stored_dtype(folder: Path) -> torch.dtype | None:
    """The floating dtype most of the folder's safetensors bytes are stored in (read from the files' headers), or
    None where that can't be told."""
    totals: dict[torch.dtype, int] = defaultdict(int)
    for path in sorted(folder.glob("*.safetensors")):
        try:
            tensors = read_header(path)
        except (OSError, ValueError):
            return None
        for tensor in tensors:
            dtype = FLOAT_DTYPES.get(tensor.dtype)
            if dtype is not None:
                totals[dtype] += tensor.end - tensor.start
    return max(totals, key=lambda dtype: totals[dtype]) if totals else None


def weights_dtype_of(source: Any, config: Any) -> torch.dtype | None:
    """The dtype a source's weight files hold: read from a folder's safetensors headers, else (a GGUF) what its
    config says."""
    folder: Path | None = None
    try:
        if isinstance(source, str | Path) and Path(source).expanduser().name == "config.json":
            folder = Path(source).expanduser().parent
        elif source is None or isinstance(source, str | Path | ModelSource):
            spec = None if source is None else str(source)
            model = source if isinstance(source, ModelSource) else resolve_model(spec)
            folder = None if model.kind == "gguf" else model.path
    except (HearthError, OSError, ValueError):
        folder = None
    found = stored_dtype(folder) if folder is not None and folder.is_dir() else None
    return found or config_dtype(config)


def config_dtype(config: Any) -> torch.dtype | None:
    """The dtype the config says the weights are stored in (`dtype`, or the older `torch_dtype`), if it says one."""
    for name in ("dtype", "torch_dtype"):
        value = getattr(config, name, None)
        if isinstance(value, torch.dtype):
            return value
        if isinstance(value, str) and isinstance(getattr(torch, value, None), torch.dtype):
            return getattr(torch, value)
    return None


def model_shape(config: Any, name: str) -> ModelShape:
    text = config.get_text_config(decoder=True)
    hidden = int(getattr(text, "hidden_size", 0) or 0)
    return ModelShape(
        config=config,
        name=name,
        hidden_size=hidden,
        intermediate_size=int(getattr(text, "intermediate_size", 0) or 4 * hidden),
        vocab_size=int(getattr(text, "vocab_size", 0) or 0),
        max_context=int(getattr(text, "max_position_embeddings", 0) or 2048),
    )


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


# -- weights ---------------------------------------------------------------------------------------------------
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
    from app.core.fastpath.kernel import expected_q4_kernel
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


def _q4_unavailable(meta: Any) -> str:
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
    held_as_bf16 = _q4_unavailable(meta) if quant == "q4" else ""
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
