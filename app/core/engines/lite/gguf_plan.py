"""What a GGUF file's header says about running it on the torch-free runtime, before any weight is read: the
runtime's config (every size bounded), whether the runtime takes each tensor's type, the bytes its weights hold in
memory once laid out, the forward's scratch and the tokenizer's memory (the planner's and the panel's figures), the
file type's name. Torch-free; nothing here maps the file (app.core.engines.lite.gguf_model does)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from app.core.engines.lite.runtime import LiteConfig, LiteUnavailable
from app.core.errors import HearthError
from app.core.fastpath import blocks
from app.core.fastpath.huge_pages import arena_bytes, arena_on_huge_pages
from app.core.models.gguf_meta import GGUFHeader, TensorExtent, check_gguf_complete, read_gguf_header

# GGUF architectures the runtime runs, and whether llama.cpp's converter interleaved their Q/K rows for RoPE on
# adjacent pairs (llama's "normal" rope) or kept the halves (qwen2's "neox" rope).
ROPE_PAIRS = {"llama": True, "qwen2": False}
# Bounds on a header's sizes: far above any published model, far below what would exhaust memory before a check.
MAX_LAYERS = 1024
MAX_WIDTH = 1 << 18
MAX_HEADS = 1024
MAX_CONTEXT = 1 << 24


def _integer(metadata: dict[str, Any], key: str, low: int, high: int, default: int | None = None) -> int:
    value = metadata.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        if value is None:
            raise LiteUnavailable(f"its header has no {key}")
        raise LiteUnavailable(f"its header's {key} is {value!r}, not an integer")
    if not low <= value <= high:
        raise LiteUnavailable(f"its header's {key} is {value}, outside {low}..{high}")
    return value


def _number(metadata: dict[str, Any], key: str, default: float) -> float:
    value = metadata.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise LiteUnavailable(f"its header's {key} is {value!r}, not a positive number")
    return float(value)


def gguf_config(header: GGUFHeader) -> tuple[LiteConfig, bool]:
    """The runtime's description of a GGUF model from its header alone, and whether its RoPE runs on pairs;
    LiteUnavailable says why the runtime can't take it (an architecture or feature it does not implement, a size
    out of bounds)."""
    architecture = header.architecture
    if architecture not in ROPE_PAIRS:
        names = ", ".join(sorted(ROPE_PAIRS))
        raise LiteUnavailable(f"the runtime implements the {names} GGUF architectures, not {architecture!r}")
    metadata = header.metadata
    key = architecture + "."
    layers = _integer(metadata, key + "block_count", 1, MAX_LAYERS)
    hidden = _integer(metadata, key + "embedding_length", 32, MAX_WIDTH)
    inter = _integer(metadata, key + "feed_forward_length", 32, MAX_WIDTH)
    heads = _integer(metadata, key + "attention.head_count", 1, MAX_HEADS)
    kv_heads = _integer(metadata, key + "attention.head_count_kv", 1, heads, default=heads)
    head_dim = _integer(metadata, key + "attention.key_length", 2, 4096, default=hidden // heads)
    if _integer(metadata, key + "attention.value_length", 2, 4096, default=head_dim) != head_dim:
        raise LiteUnavailable("keys and values of different widths are not in the kernel")
    if _integer(metadata, key + "rope.dimension_count", 2, 4096, default=head_dim) != head_dim:
        raise LiteUnavailable("partial rotary embeddings are not in the kernel")
    if heads % kv_heads:
        raise LiteUnavailable(f"{heads} query heads do not divide into {kv_heads} key/value heads")
    if any(width % 32 for width in (hidden, inter, heads * head_dim)) or head_dim % 2:
        raise LiteUnavailable("the kernel needs widths in multiples of 32 and even head sizes")
    context = _integer(metadata, key + "context_length", 1, MAX_CONTEXT, default=2048)
    eps = _number(metadata, key + "attention.layer_norm_rms_epsilon", 1e-5)
    theta = _number(metadata, key + "rope.freq_base", 10000.0)
    if metadata.get(key + "expert_count"):
        raise LiteUnavailable("mixture-of-experts models are not in the kernel")
    if metadata.get(key + "attention.sliding_window"):
        raise LiteUnavailable("sliding-window attention is not in the kernel")
    embedding = _find(header, "token_embd.weight")
    if embedding is None or len(embedding.dims) != 2 or embedding.dims[0] != hidden:
        raise LiteUnavailable("its token embedding is missing or not [vocab, hidden]")
    vocab = embedding.dims[1]
    steps = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inv_freq = (np.float32(1.0) / (np.float32(theta) ** steps)).astype(np.float32)
    scaling = str(metadata.get(key + "rope.scaling.type", "none") or "none")
    if scaling == "linear":
        inv_freq = (inv_freq / np.float32(_number(metadata, key + "rope.scaling.factor", 1.0))).astype(np.float32)
    elif scaling != "none":
        raise LiteUnavailable(f"RoPE scaling {scaling} is not in the kernel")
    config = LiteConfig(
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        inter=inter,
        vocab=vocab,
        eps=eps,
        inv_freq=inv_freq,
        context_window=context,
    )
    return config, ROPE_PAIRS[architecture]


def _find(header: GGUFHeader, name: str) -> TensorExtent | None:
    return next((tensor for tensor in header.tensors if tensor.name == name), None)


def tensor_bytes(tensor: TensorExtent) -> int:
    """Bytes of a tensor's data in a type the kernel takes; LiteUnavailable names the tensor and type otherwise."""
    if tensor.kind not in blocks.GEOMETRY:
        raise LiteUnavailable(
            f"tensor {tensor.name} is {blocks.type_name(tensor.kind)}, a type the kernel does not compute on "
            f"(it takes {', '.join(blocks.TYPE_NAMES.values())})"
        )
    values, size = blocks.GEOMETRY[tensor.kind]
    if not tensor.dims or tensor.dims[0] % values:
        raise LiteUnavailable(f"tensor {tensor.name}'s rows of {tensor.dims[:1]} values are not whole blocks")
    return tensor.elements // values * size


def gguf_support(path: Path) -> str:
    """ "" when the torch-free runtime can run this GGUF file, as far as its header tells; else why not (a sentence
    naming the architecture, feature, tensor and type it does not take)."""
    try:
        check_gguf_complete(path)
        header = read_gguf_header(path)
        gguf_config(header)
        for tensor in header.tensors:
            tensor_bytes(tensor)
    except LiteUnavailable as exc:
        return str(exc)
    except HearthError as exc:
        return f"the GGUF file could not be read ({exc})"
    return ""


def resident_weight_bytes(header: GGUFHeader, library: Any = None) -> int:
    """What the model's weights hold in memory once every matrix has been read: each tensor's bytes in the file, to
    the byte, except an untied input embedding, of which only the rows of the tokens seen are ever read; the matrices
    the kernel `library` lays out 16 rows at a time (GGUFModel._lay_out_matrices) count their arena instead (the
    layouts' bytes, on huge pages its last 2 MiB page whole)."""
    tied = not any(tensor.name == "output.weight" for tensor in header.tensors)
    total = 0
    layouts: list[int] = []
    for tensor in header.tensors:
        if tensor.kind not in blocks.GEOMETRY or (not tied and tensor.name == "token_embd.weight"):
            continue
        laid_out = None
        if library is not None and len(tensor.dims) == 2:
            laid_out = blocks.x16_bytes(library, tensor.kind, tensor.dims[1], tensor.dims[0])
        if laid_out is not None:
            layouts.append(laid_out)
        else:
            total += tensor_bytes(tensor)
    if layouts:
        total += arena_bytes(layouts, arena_on_huge_pages(layouts))
    return total


# llama.cpp's file types (general.file_type, gguf-py's LlamaFileType without its MOSTLY_/ALL_ prefixes). A table
# here: importing the gguf package for its enum also reads its writer, vocabulary and YAML modules (~30 ms at every
# load). The tests hold it equal to the installed gguf's enum.
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M",
    13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS",
    21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S",
    29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE", 39: "NVFP4",
    40: "Q1_0", 1024: "GUESSED",
}  # fmt: skip


def file_type_label(header: GGUFHeader) -> str:
    """The file's type as llama.cpp names it (Q4_K_M, Q8_0, ...), from general.file_type; else its main tensor type."""
    kind = header.metadata.get("general.file_type")
    if isinstance(kind, int) and not isinstance(kind, bool) and kind in FILE_TYPES:
        return FILE_TYPES[kind]
    counts: dict[int, int] = {}
    for tensor in header.tensors:
        if len(tensor.dims) == 2:
            counts[tensor.kind] = counts.get(tensor.kind, 0) + tensor.elements
    return blocks.type_name(max(counts, key=lambda kind: counts[kind])) if counts else "GGUF"


def parameter_counts(header: GGUFHeader) -> tuple[int, int]:
    """(every weight, the quantized ones): what the plan's parameters line shows."""
    quantized = sum(tensor.elements for tensor in header.tensors if blocks.GEOMETRY.get(tensor.kind, (32, 0))[0] > 1)
    return header.parameters, quantized


SPAN = 256  # positions per attention chunk (hearth_decode.c's SPAN)
ATTEND_TOKENS = 32  # a prefill's tokens attended together, at most (hearth_decode.c's ATTEND_TOKENS)
ATTEND_PARTIAL_FLOATS = 1 << 20  # a thread's partials for them, at most (hearth_decode.c's)
OWN_INPUT_ROWS = 8  # up to this many rows every thread prepares each input for itself (hearth_decode.c's)
TILE_SLOTS = 8  # inputs a tile holds side by side for the 16-row kernels (hearth_decode.c's)
TILE_FROM = 4  # the fewest inputs of a call that get tiles (hearth_decode.c's GG_TILE, gtile_count)


def attend_tokens(group: int, chunks: int, head_dim: int) -> int:
    """hearth_decode.c's attend_tokens: how many of a prefill's tokens attend together."""
    tokens = ATTEND_TOKENS
    while tokens > 1 and tokens * group * chunks * (head_dim + 2) > ATTEND_PARTIAL_FLOATS:
        tokens //= 2
    return tokens


TOKENIZER_FLOOR_BYTES = 16 << 20  # a GGUF's tokenizer before its vocabulary (measured: 27 MiB at 49k, 44 at 128k)
TOKENIZER_BYTES_PER_TOKEN = 220


def forward_scratch_bytes(config: LiteConfig, threads: int, tokens: int, capacity: int) -> int:
    """What hearth_gg_forward's scratch holds for `tokens` tokens and a cache of `capacity` positions: its
    gg_layout_scratch, mirrored (tests hold the two equal)."""
    hidden, heads, kv, hd, inter = config.hidden, config.heads, config.kv_heads, config.head_dim, config.inter
    widest, units, group = max(hidden, heads * hd, inter), heads + 2 * kv, heads // kv
    chunks = -(-capacity // SPAN)
    block_heads = group if tokens == 1 else attend_tokens(group, chunks, hd) * group
    partial_heads = heads if tokens == 1 else threads * block_heads
    copies = threads if tokens <= OWN_INPUT_ROWS else 1  # of each row's normalized and quantized input
    floats = tokens * (hidden + copies * hidden + units * hd + heads * hd + 2 * inter + 2 * (hd // 2))
    floats += partial_heads * chunks * (hd + 2) + threads * block_heads * SPAN
    floats += threads * block_heads * hd  # a block's (one token: a group's) roped queries
    floats = -(-floats // 16) * 16
    quantized = 2 * widest + 2 * (widest // 32) * 4 + (widest // 16) * 4  # gbuf_bytes: h, l, d, s, n16
    floats += copies * tokens * ((-(-quantized // 64) | 1) * 16)  # gbuf_stride: an odd number of cache lines
    tiles = -(-tokens // TILE_SLOTS) if tokens >= TILE_FROM else 0  # gtile_count: the inputs side by side
    floats += copies * tiles * (-(-(TILE_SLOTS * quantized) // 64) * 16)  # gtile_bytes: whole cache lines
    return 4 * floats


def runtime_bytes(vocab: int) -> int:
    """The tokenizer's memory for a vocabulary of `vocab` tokens (besides the interpreter's own floor)."""
    return TOKENIZER_FLOOR_BYTES + TOKENIZER_BYTES_PER_TOKEN * vocab
