"""The kernel library's GGUF block functions (hearth_gg_* in native/hearth_decode.c): matrices multiplied on the
quantized blocks of a GGUF file as it lies on disk, in ggml's own formats. Torch-free.

What they compute: activations quantized per 32 values, to int8 (llama.cpp's Q8_0 activations, finer than the Q8_K of
its K-quant kernels) or "precise" to 15 bits (two int8 halves through the same integer dot products), integer dot
products per 32-value chunk, one fused multiply-add per chunk into float lanes; a row's result depends only on the row
and the input (bit for bit the same whether it is one of many prefill rows or a lone decode step).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from app.core.models.gguf_meta import BLOCK_SIZES

# ggml's type numbers (gguf.constants.GGMLQuantizationType) of the formats the kernel computes on.
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, BF16 = 0, 1, 2, 3, 6, 7, 8, 12, 13, 14, 30
TYPE_NAMES = {
    F32: "F32", F16: "F16", Q4_0: "Q4_0", Q4_1: "Q4_1", Q5_0: "Q5_0", Q5_1: "Q5_1", Q8_0: "Q8_0", Q4_K: "Q4_K",
    Q5_K: "Q5_K", Q6_K: "Q6_K", BF16: "BF16",
}  # fmt: skip
# (values, bytes) per block of the types above: the file format's, as hearth_gg_geometry reports them too (checked
# against it when the library loads)
GEOMETRY = {kind: BLOCK_SIZES[kind] for kind in TYPE_NAMES}
# A type's 16-row layout (hearth_gg_repack_x16): its code is the file type's plus X16; (values, bytes) per block,
# the file's except Q4_K's and Q5_K's 12 packed bytes of scales and mins, which it keeps as 16 (checked at load).
X16 = 100
X16_ROWS = 16
X16_GEOMETRY = {
    kind: (values, size + (4 if kind in (Q4_K, Q5_K) else 0)) for kind, (values, size) in GEOMETRY.items() if values > 1
}
# hearth_gg_step's argument tables, in the C enums' order (checked against hearth_gg_layout)
STEP_SIZES = (
    "layers", "hidden", "heads", "kv_heads", "head_dim", "inter", "vocab", "kv_bf16", "threads", "rope_pairs",
    "embed_type", "head_type", "precise",
)  # fmt: skip
# hearth_gg_step's `precise` bits: which matrix inputs go in at 15 bits instead of 8
PRECISE_QKV, PRECISE_O, PRECISE_GATE_UP, PRECISE_DOWN, PRECISE_HEAD = 1, 2, 4, 8, 16
STEP_GLOBALS = ("embed", "final_norm", "head", "inv_freq")
STEP_TYPES = ("q", "k", "v", "o", "gate", "up", "down")
STEP_LAYER = (
    "attn_norm", "ffn_norm", "q", "k", "v", "o", "gate", "up", "down", "q_bias", "k_bias", "v_bias", "k_cache",
    "v_cache",
)  # fmt: skip

Floats = npt.NDArray[np.float32]


def file_type(kind: int) -> int:
    """The file's type of a matrix (the type itself, or the one a 16-row layout was repacked from)."""
    return kind - X16 if kind - X16 in X16_GEOMETRY else kind


def type_name(kind: int) -> str:
    """ggml's name for a type number, also for the types the kernel does not compute on."""
    if kind - X16 in X16_GEOMETRY:
        return f"{TYPE_NAMES[kind - X16]} (16-row layout)"
    if kind in TYPE_NAMES:
        return TYPE_NAMES[kind]
    try:
        from gguf.constants import GGMLQuantizationType

        return GGMLQuantizationType(kind).name
    except (ImportError, ValueError):
        return f"type {kind}"


def row_bytes(kind: int, cols: int) -> int:
    """Bytes of one row of `cols` values; ValueError when the kernel does not take that type or row length."""
    if kind - X16 in X16_GEOMETRY and cols % X16_GEOMETRY[kind - X16][0] == 0:
        values, size = X16_GEOMETRY[kind - X16]
        return cols // values * size
    if kind not in GEOMETRY:
        raise ValueError(f"{type_name(kind)} is not a type the kernel computes on")
    values, size = GEOMETRY[kind]
    if cols % values or (values > 1 and cols % 32):
        raise ValueError(f"rows of {cols} values do not divide into {type_name(kind)} blocks of {values}")
    return cols // values * size


def declare(lib: Any) -> str:
    """Set the hearth_gg_* signatures on a loaded library; "" when its tables match this module, else why not."""
    pointer, size, flag = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.hearth_gg_geometry.restype = flag
    lib.hearth_gg_geometry.argtypes = [flag, pointer]
    lib.hearth_gg_dequant.restype = flag
    lib.hearth_gg_dequant.argtypes = [flag, pointer, size, pointer]
    lib.hearth_gg_matmul.restype = flag
    lib.hearth_gg_matmul.argtypes = [flag, pointer, size, size, pointer, size, pointer, pointer, flag, flag]
    lib.hearth_amx.restype = flag  # prefill on AMX tiles: 1 on, 0 off, -1 asks
    lib.hearth_amx.argtypes = [flag]
    lib.hearth_amx_calls.restype = size  # how many products ran on the tiles (tests)
    lib.hearth_amx_calls.argtypes = []
    lib.hearth_tiled_calls.restype = size  # how many runs of a 16-row layout read their inputs from tiles (tests)
    lib.hearth_tiled_calls.argtypes = []
    lib.hearth_unpacked_calls.restype = size  # how many runs of a 16-row layout took values unpacked ahead (tests)
    lib.hearth_unpacked_calls.argtypes = []
    lib.hearth_silu_times.restype = None  # the forward's gated activation in place: g <- silu(g) u (tests)
    lib.hearth_silu_times.argtypes = [pointer, pointer, size]
    lib.hearth_avx_vnni.restype = flag  # 1: the AVX2 loops' dot products on AVX-VNNI
    lib.hearth_avx_vnni.argtypes = []
    lib.hearth_x16_prefetch.restype = flag  # software prefetch in the 16-row products: 1 on, 0 off, -1 asks
    lib.hearth_x16_prefetch.argtypes = [flag]
    lib.hearth_x16_prefetch_for.restype = flag  # whether a product of N inputs prefetches now (tests)
    lib.hearth_x16_prefetch_for.argtypes = [flag]
    lib.hearth_gg_x16_bytes.restype = size
    lib.hearth_gg_x16_bytes.argtypes = [flag, size, size]
    lib.hearth_gg_repack_x16.restype = flag
    lib.hearth_gg_repack_x16.argtypes = [flag, pointer, size, size, pointer, flag]
    lib.hearth_gg_layout.restype = flag
    lib.hearth_gg_layout.argtypes = [flag]
    lib.hearth_gg_scratch_floats.restype = size
    lib.hearth_gg_scratch_floats.argtypes = [pointer, size, size]
    lib.hearth_gg_forward.restype = flag
    lib.hearth_gg_forward.argtypes = [pointer] * 6 + [size] * 3 + [pointer, size, pointer, size]
    lib.hearth_gg_forward_rows.restype = flag
    lib.hearth_gg_forward_rows.argtypes = [pointer] * 6 + [size] + [pointer] * 4 + [size, pointer, size]
    layout = tuple(lib.hearth_gg_layout(i) for i in range(4))
    if layout != (len(STEP_SIZES), len(STEP_GLOBALS), len(STEP_TYPES), len(STEP_LAYER)):
        return f"its GGUF step layout {layout} does not match this Hearth"
    found = (ctypes.c_int64 * 2)()
    for kind, expected in GEOMETRY.items():
        if lib.hearth_gg_geometry(kind, found) != 0 or (found[0], found[1]) != expected:
            return f"its {type_name(kind)} block geometry does not match this Hearth"
    for kind, (values, block) in X16_GEOMETRY.items():  # a build without the layouts answers -1 for every type
        laid_out = lib.hearth_gg_x16_bytes(kind, X16_ROWS, 256)
        if laid_out >= 0 and laid_out != X16_ROWS * 256 // values * block:
            return f"its {type_name(kind)} 16-row layout does not match this Hearth"
    return ""


def dequantize(lib: Any, kind: int, data: npt.NDArray[np.uint8], count: int) -> Floats:
    """`count` values (whole blocks) from the start of `data` as fp32, exactly as ggml's and gguf's dequantizers."""
    out = np.empty(count, dtype=np.float32)
    if lib.hearth_gg_dequant(kind, data.ctypes.data, count, out.ctypes.data) != 0:
        raise ValueError(f"{count} values are not whole {type_name(kind)} blocks")
    return out


def x16_bytes(lib: Any, kind: int, rows: int, cols: int) -> int | None:
    """Bytes of the matrix's 16-row layout; None where this build or this matrix has none (the scalar and ARM builds,
    float types, rows not a multiple of 16)."""
    size = int(lib.hearth_gg_x16_bytes(kind, rows, cols))
    return size if size >= 0 else None


def repack_x16(
    lib: Any,
    kind: int,
    weights: npt.NDArray[np.uint8],
    rows: int,
    cols: int,
    threads: int,
    slice_bytes: int = 0,
    copied: Callable[[npt.NDArray[np.uint8]], None] | None = None,
    out: npt.NDArray[np.uint8] | None = None,
) -> tuple[int, npt.NDArray[np.uint8]] | None:
    """The matrix in its 16-row layout (the same blocks' bits, rows interleaved 16 at a time so that one vector
    instruction steps 16 rows' dot products): (its type code, its bytes); None where it has none (x16_bytes). With
    `slice_bytes`, laid out that many bytes of `weights` at a time, each slice handed to `copied` once done (a load
    releases the file's pages as it goes). `out`: where to lay it out (x16_bytes long), else a new array."""
    size = x16_bytes(lib, kind, rows, cols)
    if size is None:
        return None
    if out is not None and out.nbytes != size:
        raise ValueError(f"the layout takes {size} bytes, not {out.nbytes}")
    in_row = row_bytes(kind, cols)
    if weights.nbytes < rows * in_row:
        raise ValueError(f"the {type_name(kind)} tensor holds {weights.nbytes} bytes, not {rows} rows of {cols}")
    out = np.empty(size, dtype=np.uint8) if out is None else out
    out_row = size // rows
    step = max(X16_ROWS, slice_bytes // in_row // X16_ROWS * X16_ROWS) if slice_bytes else rows
    code = -1
    for first in range(0, rows, step):
        count = min(step, rows - first)
        source = weights[first * in_row : (first + count) * in_row]
        target = out[first * out_row :]
        code = int(lib.hearth_gg_repack_x16(kind, source.ctypes.data, count, cols, target.ctypes.data, threads))
        if code < 0:
            return None
        if copied is not None:
            copied(source)
    return code, out


def matmul(
    lib: Any,
    kind: int,
    weights: npt.NDArray[np.uint8],
    rows: int,
    x: Floats,
    threads: int,
    bias: Floats | None = None,
    precise: bool = False,
) -> Floats:
    """x [n, cols] times the GGUF matrix (`rows` rows in `weights`, the tensor's bytes) transposed: [n, rows];
    `precise`: x quantized to 15 bits per 32 values instead of 8."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    n, cols = x.shape
    if weights.nbytes < rows * row_bytes(kind, cols):
        raise ValueError(f"the {type_name(kind)} tensor holds {weights.nbytes} bytes, not {rows} rows of {cols}")
    out = np.empty((n, rows), dtype=np.float32)
    code = lib.hearth_gg_matmul(
        kind, weights.ctypes.data, rows, cols, x.ctypes.data, n, out.ctypes.data,
        bias.ctypes.data if bias is not None else None, threads, int(precise),
    )  # fmt: skip
    if code == -3:
        raise MemoryError(f"the GGUF kernel could not allocate its buffers for a {n}-row input")
    if code != 0:
        raise ValueError(f"the GGUF kernel refused a {type_name(kind)} matrix of {rows} x {cols} (code {code})")
    return out


class GGForward:
    """hearth_gg_forward's argument arrays for one model (sizes, eps and attention scale, the global pointers, each
    layer's matrix types and pointers; the K/V slabs bound per cache by `bind_kv`) and its scratch buffer. Whoever
    builds it keeps every array its pointers point into alive."""

    def __init__(
        self,
        lib: Any,
        sizes: Mapping[str, int],
        eps: float,
        glob: Mapping[str, int],
        types: Sequence[Mapping[str, int]],
        layers: Sequence[Mapping[str, int | None]],
    ) -> None:
        self.lib = lib
        self.sizes = (ctypes.c_int64 * len(STEP_SIZES))(*(sizes[name] for name in STEP_SIZES))
        self.floats = (ctypes.c_float * 2)(eps, sizes["head_dim"] ** -0.5)
        self.glob = (ctypes.c_void_p * len(STEP_GLOBALS))(*(glob[name] for name in STEP_GLOBALS))
        self.types = (ctypes.c_int64 * (len(STEP_TYPES) * len(types)))(
            *(layer[name] for layer in types for name in STEP_TYPES)
        )
        self.layer_args = (ctypes.c_void_p * (len(STEP_LAYER) * len(layers)))()
        for index, fields in enumerate(layers):
            for offset, name in enumerate(STEP_LAYER[:-2]):
                self.layer_args[index * len(STEP_LAYER) + offset] = fields.get(name)
        self.capacity = 0
        self.scratch = np.empty(0, dtype=np.float32)
        self._scratch_needed = ((0, 0, 0), 0)  # the last (rows, capacity, threads) asked about, and its floats
        self._threads_at = STEP_SIZES.index("threads")

    def bind_kv(self, keys: Sequence[int], values: Sequence[int], capacity: int) -> None:
        """Point every layer at its K and V slabs (all of `capacity` positions)."""
        stride = len(STEP_LAYER)
        for index, (key, value) in enumerate(zip(keys, values, strict=True)):
            self.layer_args[index * stride + stride - 2] = key
            self.layer_args[index * stride + stride - 1] = value
        self.capacity = capacity

    def set_threads(self, threads: int) -> None:
        self.sizes[self._threads_at] = threads

    def scratch_floats(self, tokens: int) -> int:
        return int(self.lib.hearth_gg_scratch_floats(ctypes.addressof(self.sizes), tokens, self.capacity))

    def _scratch_for(self, tokens: int, capacity: int) -> tuple[int, int]:
        """The scratch buffer (grown when `tokens` rows over slabs of `capacity` positions need more): address, size."""
        key = (tokens, capacity, self.sizes[self._threads_at])
        if key != self._scratch_needed[0]:  # a decode step asks the same shape token after token
            floats = int(self.lib.hearth_gg_scratch_floats(ctypes.addressof(self.sizes), tokens, capacity))
            self._scratch_needed = (key, floats)
        needed = self._scratch_needed[1]
        if self.scratch.size < needed:
            self.scratch = np.empty(needed, dtype=np.float32)
        return self.scratch.ctypes.data, self.scratch.size

    def _model(self) -> tuple[int, ...]:
        """The model's argument arrays: sizes, floats, globals, types, layers."""
        parts = (self.sizes, self.floats, self.glob, self.types, self.layer_args)
        return tuple(ctypes.addressof(part) for part in parts)

    def run(self, tokens: npt.NDArray[np.int64], position: int, logits: Floats) -> int:
        """`tokens` at positions position.. through the model; the logits of its last logits.shape[0] tokens into
        `logits` ([rows, vocab] fp32); hearth_gg_forward's code (0: done)."""
        scratch = self._scratch_for(len(tokens), self.capacity)
        rows = logits.shape[0] if logits.ndim == 2 else 1
        return int(
            self.lib.hearth_gg_forward(
                *self._model(), tokens.ctypes.data, len(tokens), position, self.capacity, logits.ctypes.data, rows,
                *scratch,
            )
        )  # fmt: skip

    def run_rows(
        self,
        tokens: npt.NDArray[np.int64],
        slabs: npt.NDArray[np.uint64],
        positions: npt.NDArray[np.int64],
        capacities: npt.NDArray[np.int64],
        logits: Floats,
    ) -> int:
        """Rows of several sequences in one forward (a server's batched step): row i at positions[i] of its own K/V
        slabs (slabs [rows, layers, 2] addresses, capacities[i] positions each); a sequence may have several rows
        (a prompt chunk). The logits of the last logits.shape[0] rows into `logits` [rows, vocab];
        hearth_gg_forward_rows's code (0: done)."""
        scratch = self._scratch_for(len(tokens), int(capacities.max()))
        return int(
            self.lib.hearth_gg_forward_rows(
                *self._model(), tokens.ctypes.data, len(tokens), slabs.ctypes.data, positions.ctypes.data,
                capacities.ctypes.data, logits.ctypes.data, logits.shape[0], *scratch,
            )
        )  # fmt: skip
