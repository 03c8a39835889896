"""The fused decode step: a small C library (native/hearth_decode.c), prebuilt per CPU target at package time
(packaging/build_kernels.py) or compiled on first use and cached; either way checked against its sha256 before it is
loaded.

Prefill keeps running through the model's own (fast, batched) torch kernels; each single-token step runs the whole
decoder in one C call over packed copies of its matrices (Q4_1 blocks or int8 rows; the lm_head int8 rows), with
activations quantized to int8 per block of 32. Both share one KV cache: `SlabLayer` keeps each
layer's keys and values in a preallocated [1, kv_heads, capacity, head_dim] slab that torch sees as a growing view
and the C step writes in place, so prefix reuse (crop to the common prefix, overwrite past it) works as before.

Everything that can stop the fused path (no prebuilt library for this CPU and no C compiler, a failed compile, a CPU
without AVX2/FMA, an architecture the kernel does not implement) returns a reason instead of raising; the engine
then runs the plain path and shows the reason in the reply's stats.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from transformers.cache_utils import DynamicCache, DynamicLayer

from app.core.fastpath.int8 import quantize_rows
from app.core.fastpath.kernel import (
    HEAD_RECORD,
    Q4_GROUP,
    Q4_RECORD,
    SUPPORTED_MODEL_TYPES,
    NativeLibrary,
    StepArguments,
    grown_capacity,
)
from app.core.fastpath.packed import (
    Int8RowsLinear,
    compute_dtype,
    interleave_q4,
    interleave_rows,
)
from app.core.fastpath.rows import RowFile, byte_view
from app.core.fastpath.team import TeamChooser
from app.core.models.attention import attention_shape

log = logging.getLogger(__name__)

STATIC_ROPE_TYPES = ("default", "linear", "llama3")  # inv_freq does not depend on the sequence length


# -- the KV cache both paths share ----------------------------------------------------------------------------------
class SlabArena:
    """Shared by one cache's layers: the capacity they all have and a version bumped on every reallocation."""

    def __init__(self, limit: int) -> None:
        self.limit = limit  # the model's context window: slabs never grow past it
        self.version = 0


class SlabLayer(DynamicLayer):
    """A DynamicLayer whose keys/values are views of preallocated slabs, so a C step can write in place."""

    def __init__(self, arena: SlabArena, kv_heads: int, head_dim: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.arena = arena
        self.slab_keys = torch.empty(1, kv_heads, 0, head_dim, dtype=dtype)
        self.slab_values = torch.empty(1, kv_heads, 0, head_dim, dtype=dtype)
        self.length = 0
        self.device = torch.device("cpu")
        self.is_initialized = True

    # transformers reads and assigns .keys/.values; here they are always the valid part of the slabs.
    @property
    def keys(self) -> torch.Tensor:
        return self.slab_keys[:, :, : self.length]

    @keys.setter
    def keys(self, value: torch.Tensor | None) -> None:
        if value is not None:
            raise TypeError("SlabLayer keys are written through update()")

    @property
    def values(self) -> torch.Tensor:
        return self.slab_values[:, :, : self.length]

    @values.setter
    def values(self, value: torch.Tensor | None) -> None:
        if value is not None:
            raise TypeError("SlabLayer values are written through update()")

    @property
    def capacity(self) -> int:
        return int(self.slab_keys.shape[2])

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        return None

    def reserve(self, needed: int) -> None:
        if needed <= self.capacity:
            return
        capacity = grown_capacity(self.capacity, needed, self.arena.limit)
        for name in ("slab_keys", "slab_values"):
            old = getattr(self, name)
            new = torch.empty(1, old.shape[1], capacity, old.shape[3], dtype=old.dtype)
            new[:, :, : self.length].copy_(old[:, :, : self.length])
            setattr(self, name, new)
        self.arena.version += 1

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        count = int(key_states.shape[-2])
        self.reserve(self.length + count)
        self.slab_keys[:, :, self.length : self.length + count].copy_(key_states)
        self.slab_values[:, :, self.length : self.length + count].copy_(value_states)
        self.length += count
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes the (negative) number of tokens to remove")
        self.length = max(0, self.length + tokens_to_remove)

    def reset(self) -> None:
        self.length = 0


def new_slab_cache(model: Any, limit: int) -> DynamicCache:
    config = model.config.get_text_config(decoder=True)
    _, kv_heads, head_dim = attention_shape(config)
    dtype = kv_dtype(model)
    cache = DynamicCache(config=model.config)
    arena = SlabArena(limit)
    cache.layers = [SlabLayer(arena, kv_heads, head_dim, dtype) for _ in range(int(config.num_hidden_layers))]
    return cache


def is_slab_cache(cache: Any) -> bool:
    layers = getattr(cache, "layers", None) or []
    return bool(layers) and all(isinstance(layer, SlabLayer) for layer in layers)


def kv_dtype(model: Any) -> torch.dtype:
    """The dtype attention runs in (and the cache is kept in): the one a q4 load states (its embedding stays mapped in
    the weight file's dtype, e.g. fp32, and is looked up at this dtype), else the embedding's."""
    stated = compute_dtype(model)
    if stated is not None:
        return stated
    embed = model.get_input_embeddings()
    return embed.weight.dtype if isinstance(embed, nn.Embedding) else torch.float32


# -- the model, packed for the kernel -------------------------------------------------------------------------------
def quantize_q4_blocks(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_1 (llama.cpp's layout): per block of 32, w ≈ d * q + m with q in 0..15; nibbles [rows, cols/2] (byte j of a
    block = q[j] | q[j+16] << 4) and fp16 (d, m) pairs [rows, 2 * blocks]."""
    rows, cols = weight.shape
    blocks = weight.detach().float().reshape(rows, cols // 32, 32)
    low, high = blocks.amin(dim=-1), blocks.amax(dim=-1)
    scale = ((high - low) / 15).to(torch.float16)
    offset = low.to(torch.float16)
    step = scale.float()
    inverse = torch.where(step > 0, 1.0 / step, torch.zeros_like(step))
    q = torch.round((blocks - offset.float()[..., None]) * inverse[..., None]).clamp_(0, 15).to(torch.uint8)
    packed = (q[..., :16] | (q[..., 16:] << 4)).reshape(rows, cols // 2)
    return packed.contiguous(), torch.stack([scale, offset], dim=-1).reshape(rows, -1).contiguous()


PACK_ROWS = 1024  # rows of a decoder matrix quantized to Q4_1 at a time (whole groups of 16)
# lm_head rows quantized at a time (whole groups): the whole 1B head at once took 1.4 GiB of temporaries.
HEAD_QUANTIZE_ROWS = 4096


def quantize_head(weight: torch.Tensor, release: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The lm_head as the kernel reads it: int8 rows (int8.quantize_rows) in the x16 layout (packed.interleave_rows)
    and the fp32 scale per row [vocab], made a chunk of rows at a time into the final tensors (each row's scale is its
    own, each group of 16 rows its own records); `release(tensor)`, when given, is called with each chunk once done."""
    rows, cols = int(weight.shape[0]), int(weight.shape[1])
    records = torch.empty(-(-rows // Q4_GROUP), cols // 32 * HEAD_RECORD, dtype=torch.int8)
    scales = torch.empty(rows, dtype=torch.float32)
    for start in range(0, rows, HEAD_QUANTIZE_ROWS):
        q, scale = quantize_rows(weight[start : start + HEAD_QUANTIZE_ROWS])
        first = start // Q4_GROUP
        records[first : first + -(-q.shape[0] // Q4_GROUP)] = interleave_rows(q)
        scales[start : start + q.shape[0]] = scale
        if release is not None:
            release(weight[start : start + HEAD_QUANTIZE_ROWS])
    return records, scales


def head_bytes(vocab: int, hidden: int) -> int:
    """What quantize_head stores: int8 rows padded to a multiple of 16, an fp32 scale per real row."""
    return -(-vocab // Q4_GROUP) * Q4_GROUP * hidden + 4 * vocab


def quantize_q4(weight: torch.Tensor) -> tuple[torch.Tensor, None]:
    """A matrix as the kernel's Q4_1 records (interleave_q4); no separate scale tensor."""
    return interleave_q4(*quantize_q4_blocks(weight)), None


def packed_matrix_bytes(rows: int, cols: int, weight_format: str) -> int:
    """What pack_model stores for a [rows, cols] matrix: Q4_1 records (nibbles + fp16 d, m: 20 bytes per 32 weights),
    or int8 rows + an fp32 scale per row."""
    if weight_format == "q4":
        return rows * cols // 2 + rows * (cols // 32) * 4
    return rows * cols + 4 * rows


def unsupported_reason(model: Any, weight_format: str = "int8") -> str:
    """Empty when the kernel implements this model's decoder exactly in `weight_format`, else what it lacks."""
    config = model.config.get_text_config(decoder=True)
    model_type = str(getattr(config, "model_type", ""))
    if model_type not in SUPPORTED_MODEL_TYPES:
        return f"the fused kernel implements {', '.join(SUPPORTED_MODEL_TYPES)}, not {model_type or 'this model'}"
    if str(getattr(config, "hidden_act", "silu")) != "silu":
        return f"activation {config.hidden_act} is not in the fused kernel"
    layer_types = getattr(config, "layer_types", None) or []
    window = getattr(config, "sliding_window", None)
    if any(kind != "full_attention" for kind in layer_types) or (
        window and getattr(config, "use_sliding_window", True) and not layer_types
    ):
        return "sliding-window attention is not in the fused kernel"
    base = getattr(model, "model", None)
    rotary = getattr(base, "rotary_emb", None)
    rope_type = str(getattr(rotary, "rope_type", "default"))
    if rope_type not in STATIC_ROPE_TYPES:
        return f"RoPE type {rope_type} is not in the fused kernel"
    heads, _, head_dim = attention_shape(config)
    inv_freq = getattr(rotary, "inv_freq", None)
    if not isinstance(inv_freq, torch.Tensor) or inv_freq.numel() * 2 != head_dim:
        return "partial rotary embeddings are not in the fused kernel"
    widths = {
        "hidden": int(config.hidden_size),
        "intermediate": int(config.intermediate_size),
        "heads": heads * head_dim,
    }
    if odd := [f"{name} {width}" for name, width in widths.items() if width % 32]:
        return f"the fused kernel needs sizes in multiples of 32 ({', '.join(odd)})"
    if weight_format == "q4" and head_dim % Q4_GROUP:
        return f"the fused kernel's Q4_1 layout needs head sizes in multiples of {Q4_GROUP} (this model's: {head_dim})"
    if kv_dtype(model) not in (torch.float32, torch.bfloat16):
        return f"{kv_dtype(model)} activations are not in the fused kernel (bf16 and fp32 are)"
    layers = getattr(base, "layers", None)
    if layers is None or len(layers) != int(config.num_hidden_layers):
        return "the model's decoder layers are not where the fused kernel looks for them"
    attention = layers[0].self_attn
    if abs(float(getattr(attention, "scaling", head_dim**-0.5)) - head_dim**-0.5) > 1e-6:
        return "a non-standard attention scale is not in the fused kernel"
    return ""


class FusedDecoder:
    """One loaded model's int8 copies plus the argument arrays for hearth_step; `step` runs one token."""

    def __init__(
        self, native: NativeLibrary, model: Any, tensors: Mapping[str, torch.Tensor], weight_format: str = "int8"
    ) -> None:
        self.native = native
        self.weight_format = weight_format
        config = model.config.get_text_config(decoder=True)
        base: Any = model.model
        self.heads, self.kv_heads, self.head_dim = attention_shape(config)
        self.layers = int(config.num_hidden_layers)
        self.hidden = int(config.hidden_size)
        self.vocab = int(tensors["lm.s"].shape[0])
        embed = base.embed_tokens.weight.detach()
        cache_dtype = kv_dtype(model)
        self._keep: list[torch.Tensor] = []  # every tensor the C side points into stays alive here
        self.threads = max(1, torch.get_num_threads()) if native.threaded else 1
        # The team follows the cores actually free, as the torch-free runtime's does: beside another application's
        # busy process a fixed two-thread team decoded 368 -> 2.1 tok/s (135M, 2-core KVM guest).
        self.decode_team = TeamChooser(self.threads)
        sizes = {
            "layers": self.layers,
            "hidden": self.hidden,
            "heads": self.heads,
            "kv_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "inter": int(config.intermediate_size),
            "vocab": self.vocab,
            "embed_bf16": int(embed.dtype == torch.bfloat16),
            "kv_bf16": int(cache_dtype == torch.bfloat16),
            "threads": self.threads,
            "q4": int(weight_format == "q4"),
        }
        norm = base.norm
        eps = float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))
        rotary = base.rotary_emb
        if embed.dtype not in (torch.bfloat16, torch.float32):
            embed = embed.float()
        # A table kept in the weight file is read a row per step into this buffer (the kernel then embeds row 0).
        self._rows: RowFile | None = getattr(base.embed_tokens, "rows", None)
        if self._rows is not None and self._rows.dtype == embed.dtype:
            embed = torch.empty(1, self.hidden, dtype=embed.dtype)
        else:
            self._rows = None
        self._row = byte_view(embed)
        glob = {
            "embed": self._hold(embed),
            "final_norm": self._hold(norm.weight.detach().float()),
            "lm_q": self._hold(tensors["lm.q"]),
            "lm_s": self._hold(tensors["lm.s"]),
            "inv_freq": self._hold(rotary.inv_freq.detach().float()),
        }
        layer_fields: list[dict[str, int | None]] = []
        for index, layer in enumerate(base.layers):
            fields: dict[str, int | None] = {
                "attn_norm": self._hold(layer.input_layernorm.weight.detach().float()),
                "mlp_norm": self._hold(layer.post_attention_layernorm.weight.detach().float()),
            }
            for part in ("qkv", "o", "gu", "down"):
                fields[f"{part}_q"] = self._hold(tensors[f"{index}.{part}.q"])
                scale = tensors.get(f"{index}.{part}.s")  # int8 rows' scales; Q4_1 records carry their own
                fields[f"{part}_s"] = self._hold(scale) if scale is not None else None
                bias = tensors.get(f"{index}.{part}.b")
                fields[f"{part}_b"] = self._hold(bias) if bias is not None else None
            layer_fields.append(fields)
        rope_scaling = float(getattr(rotary, "attention_scaling", 1.0))
        self.arguments = StepArguments(native.lib, sizes, eps, rope_scaling, glob, layer_fields)
        # What this path adds to memory: the packed matrices and the fp32 norm copies (the planner counts the same).
        norms = [
            norm.weight,
            *(m.weight for layer in base.layers for m in (layer.input_layernorm, layer.post_attention_layernorm)),
        ]
        self.added_bytes = sum(t.numel() * t.element_size() for t in tensors.values()) + 4 * sum(
            w.numel() for w in norms
        )
        # The arena (held, so its id can't be reused by a new cache), version and capacity the K/V pointers were set
        # for.
        self._bound: tuple[SlabArena, int, int] | None = None

    def fix_threads(self, threads: int) -> None:
        """Run every step on `threads` threads (at most the team it started with), never trying another size."""
        self.decode_team = TeamChooser(max(1, min(threads, self.threads)), explore_every=0)

    def _hold(self, tensor: torch.Tensor) -> int:
        tensor = tensor.contiguous()
        self._keep.append(tensor)
        return int(tensor.data_ptr())

    def step(self, token: int, cache: DynamicCache) -> torch.Tensor:
        """Run `token` at the cache's next position; returns the next token's logits [1, vocab] (fp32)."""
        layers: list[SlabLayer] = cache.layers
        position = layers[0].length
        arena = layers[0].arena
        bound = self._bound
        # The pointers and capacity bound last time still hold while no slab was reallocated and the next position
        # fits: then the per-layer reserve calls (30-odd Python calls a token) are skipped.
        if bound is None or bound[0] is not arena or bound[1] != arena.version or position >= bound[2]:
            for layer in layers:
                layer.reserve(position + 1)
            capacity = layers[0].capacity
            if any(layer.capacity != capacity for layer in layers):  # the kernel strides every layer alike
                raise RuntimeError("the KV cache's layers have different capacities")
            keys = [layer.slab_keys.data_ptr() for layer in layers]
            self.arguments.bind_kv(keys, [layer.slab_values.data_ptr() for layer in layers], capacity)
            bound = self._bound = (arena, arena.version, capacity)
        logits = torch.empty(1, self.vocab, dtype=torch.float32)  # fresh per step: callers may keep it
        row = token
        if self._rows is not None:
            if not 0 <= token < self._rows.rows:
                raise RuntimeError(f"the fused decode step refused token {token} at position {position} (code -1)")
            self._rows.read_row_into(token, self._row)
            row = 0
        with self.decode_team.timed(1) as threads:
            self.arguments.set_threads(threads)
            code = self.arguments.run(row, position, logits.data_ptr())
        if code != 0:
            raise RuntimeError(f"the fused decode step refused token {token} at position {position} (code {code})")
        for layer in layers:
            layer.length = position + 1
        return logits


def pack_model(
    model: Any, dense_weight: Any, weight_format: str = "int8", release: Any = None
) -> dict[str, torch.Tensor]:
    """The copies the kernel reads, by name: decoder matrices in `weight_format` (WEIGHT_FORMATS), the lm_head in
    int8 rows; `dense_weight(module)` gives a linear layer's float weight; `release(tensor)`, when given, is called
    with each source weight (or chunk of the head's) once it is packed (q4 gives the mapped file's pages back)."""
    quantize: Any = quantize_q4 if weight_format == "q4" else quantize_rows
    base: Any = model.model
    packed: dict[str, torch.Tensor] = {}

    def add(name: str, modules: list[nn.Module], interleave: bool = False) -> None:
        weights = []
        biases = []
        for module in modules:
            weight = dense_weight(module)
            if weight is None:
                raise ValueError(f"{name}: {type(module).__name__} has no weight the kernel can pack")
            weights.append(weight.detach())
            bias = getattr(module, "bias", None)
            biases.append(bias.detach().float() if isinstance(bias, torch.Tensor) else None)
        heights = [int(w.shape[0]) for w in weights]
        if weight_format == "q4" and not interleave and all(h % Q4_GROUP == 0 for h in heights):
            # Q4_1 blocks are per row: quantized a chunk of rows at a time, never as one fp32 copy of the matrix
            # (gate/up at 1B: 92 MiB, and several temporaries of its size).
            records = [
                quantize_q4(w[start : start + PACK_ROWS].float())[0]
                for w in weights
                for start in range(0, w.shape[0], PACK_ROWS)
            ]
            packed[f"{name}.q"], scale = torch.cat(records), None
            del records
        else:
            floats = [w.float() for w in weights]
            if interleave:  # gate/up pairs adjacent: row 2i is gate i, row 2i+1 up i
                merged = torch.stack(floats, dim=1).reshape(-1, floats[0].shape[1])
            else:
                merged = torch.cat(floats, dim=0)
            packed[f"{name}.q"], scale = quantize(merged)
            del merged, floats
        del weights  # before the next matrix's are read
        if release is not None:
            for module in modules:
                release(module.weight)
        if scale is not None:
            packed[f"{name}.s"] = scale
        if any(bias is not None for bias in biases):
            filled = [b if b is not None else torch.zeros(h) for b, h in zip(biases, heights, strict=True)]
            packed[f"{name}.b"] = (
                torch.stack(filled, dim=1).reshape(-1) if interleave else torch.cat(filled)
            ).contiguous()

    for index, layer in enumerate(base.layers):
        attention, mlp = layer.self_attn, layer.mlp
        add(f"{index}.qkv", [attention.q_proj, attention.k_proj, attention.v_proj])
        add(f"{index}.o", [attention.o_proj])
        add(f"{index}.gu", [mlp.gate_proj, mlp.up_proj], interleave=weight_format == "int8")
        add(f"{index}.down", [mlp.down_proj])
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Module):
        raise ValueError("the model has no output embedding")
    if isinstance(head, Int8RowsLinear):  # held once already (q4): the same int8 rows
        packed["lm.q"], packed["lm.s"] = head.q, head.scale
        return packed
    head_weight = dense_weight(head) if isinstance(head, nn.Linear) else None
    if head_weight is None:
        raise ValueError("the lm_head is not a linear layer the kernel can pack")
    packed["lm.q"], packed["lm.s"] = quantize_head(head_weight, release)
    if release is not None:
        release(head.weight)
    return packed


def tensors_fit(model: Any, tensors: Mapping[str, torch.Tensor], weight_format: str = "int8") -> bool:
    """A cached pack matches this model's shapes (a stale or foreign cache is repacked, not trusted)."""
    config = model.config.get_text_config(decoder=True)
    heads, kv_heads, head_dim = attention_shape(config)
    hidden, inter = int(config.hidden_size), int(config.intermediate_size)
    dtype = torch.uint8 if weight_format == "q4" else torch.int8

    def shape(rows: int, cols: int) -> tuple[int, int]:
        if weight_format == "q4":
            return rows // Q4_GROUP, cols // 32 * Q4_RECORD
        return rows, cols

    expected = {
        "0.qkv.q": shape((heads + 2 * kv_heads) * head_dim, hidden),
        "0.gu.q": shape(2 * inter, hidden),
    }
    for index in range(int(config.num_hidden_layers)):
        expected[f"{index}.down.q"] = shape(hidden, inter)
        expected[f"{index}.o.q"] = shape(hidden, heads * head_dim)
    head, scale = tensors.get("lm.q"), tensors.get("lm.s")
    if head is None or scale is None or head.dtype != torch.int8 or scale.dim() != 1:
        return False
    if tuple(head.shape) != (-(-scale.shape[0] // Q4_GROUP), hidden // 32 * HEAD_RECORD):
        return False
    return all(
        name in tensors and tuple(tensors[name].shape) == shape and tensors[name].dtype == dtype
        for name, shape in expected.items()
    )
