"""A model folder run from its packed Q4_1 copy without torch: the runtime's prefill (app.core.engines.lite.runtime)
over the kernel library's `hearth_q4_prefill` / `hearth_lm_head`, each decode token in one `hearth_step` call (the
torch path's own step).

What it reads: the folder's config.json, its norms and one embedding row per token (positioned reads: the table
never becomes resident) from its safetensors files, and the packed copy the torch path cached on the model's first
q4 load (app.core.fastpath.packed_cache; checked against its sha256 before use). Nothing here packs: without a
packed copy, `open_model` says so and the caller loads through torch, which writes one.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from app.core.engines.lite.runtime import (
    PREFILL_CHUNK,
    DecoderRuntime,
    Floats,
    LiteConfig,
    LiteUnavailable,
    from_bf16,
)
from app.core.fastpath import integrity
from app.core.fastpath.kernel import (
    HEAD_RECORD,
    Q4_GROUP,
    Q4_RECORD,
    NativeLibrary,
    StepArguments,
    describe_step,
    lm_head,
    load_library,
    q4_prefill,
)
from app.core.fastpath.packed_cache import packed_cache_file
from app.core.fastpath.positioned import read_exactly_at
from app.core.models.safetensors_header import StoredTensor, read_header

FLOAT_SIZES = {"F32": 4, "BF16": 2, "F16": 2}
PACKED_DTYPES = {"U8": np.uint8, "I8": np.int8, "F32": np.float32}


def _as_float32(raw: npt.NDArray[np.uint8], dtype: str) -> Floats:
    if dtype == "F32":
        return raw.view(np.float32).astype(np.float32)
    if dtype == "BF16":
        return from_bf16(raw.view(np.uint16))
    if dtype == "F16":
        return raw.view(np.float16).astype(np.float32)
    raise LiteUnavailable(f"a weight stored as {dtype} (the runtime reads F32, BF16 and F16)")


# -- the folder's files ------------------------------------------------------------------------------------------------
@dataclass
class EmbeddingRows:
    """The input embedding in its safetensors file, read a row at a time (never mapped)."""

    path: Path
    offset: int
    rows: int
    cols: int
    dtype: str
    handle: io.BufferedReader = field(repr=False)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def row_bytes(self) -> int:
        return self.cols * FLOAT_SIZES[self.dtype]

    def read(self, ids: Sequence[int]) -> Floats:
        """The rows of `ids` as fp32 [len(ids), cols]."""
        raw = np.empty((len(ids), self.row_bytes), dtype=np.uint8)
        for slot, token in enumerate(ids):
            self.read_into(int(token), raw[slot])
        return _as_float32(raw, self.dtype).reshape(len(ids), self.cols)

    def read_into(self, token: int, out: npt.NDArray[np.uint8]) -> None:
        if not 0 <= token < self.rows:
            raise ValueError(f"token id {token} is outside the model's {self.rows}-token vocabulary")
        read_exactly_at(
            self.handle,
            self.lock,
            self.path,
            self.offset + token * self.row_bytes,
            memoryview(out.data)[: self.row_bytes],
        )


def _folder_tensors(folder: Path) -> dict[str, tuple[Path, StoredTensor]]:
    found: dict[str, tuple[Path, StoredTensor]] = {}
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise LiteUnavailable(f"{folder} holds no safetensors weights")
    for path in files:
        try:
            for tensor in read_header(path):
                found[tensor.name] = (path, tensor)
        except (OSError, ValueError) as exc:
            raise LiteUnavailable(f"{path.name} could not be read ({exc})") from exc
    return found


def _read_vector(entry: tuple[Path, StoredTensor], size: int) -> Floats:
    path, tensor = entry
    if tensor.shape != (size,):
        raise LiteUnavailable(f"{tensor.name} has shape {tensor.shape}, not ({size},)")
    with path.open("rb") as handle:
        handle.seek(tensor.start)
        raw = np.frombuffer(handle.read(tensor.end - tensor.start), dtype=np.uint8)
    return np.ascontiguousarray(_as_float32(raw, tensor.dtype))


class PackedFile:
    """The packed copy, memory-mapped (its pages are what every decode step reads) and viewed tensor by tensor."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.map = np.memmap(path, dtype=np.uint8, mode="r")
        self.tensors = {tensor.name: tensor for tensor in read_header(path)}

    def get(self, name: str, shape: tuple[int, ...] | None = None) -> npt.NDArray[Any]:
        tensor = self.tensors.get(name)
        if tensor is None:
            raise LiteUnavailable(f"the packed copy has no {name}")
        dtype = PACKED_DTYPES.get(tensor.dtype)
        if dtype is None:
            raise LiteUnavailable(f"the packed copy's {name} is stored as {tensor.dtype}")
        if shape is not None and tensor.shape != shape:
            raise LiteUnavailable(f"the packed copy's {name} has shape {tensor.shape}, not {shape}")
        return self.map[tensor.start : tensor.end].view(dtype).reshape(tensor.shape)


@dataclass(frozen=True)
class LiteLayer:
    attn_norm: Floats
    mlp_norm: Floats
    qkv: npt.NDArray[np.uint8]
    qkv_bias: Floats | None
    o: npt.NDArray[np.uint8]
    gate_up: npt.NDArray[np.uint8]
    down: npt.NDArray[np.uint8]


class LiteModel(DecoderRuntime):
    """A model folder run from its packed Q4_1 copy (written by its first q4 load through torch)."""

    def __init__(self, folder: Path, packed_path: Path, library: NativeLibrary, threads: int | None = None) -> None:
        self.folder = folder
        self.packed_sha256 = ""  # of the packed copy, as checked when it was opened
        self._start(library, LiteConfig.read(folder), threads)
        config = self.config
        self.packed = PackedFile(packed_path)
        stored = _folder_tensors(folder)
        embed = stored.get("model.embed_tokens.weight")
        if embed is None or embed[1].dtype not in FLOAT_SIZES or embed[1].shape[1:] != (config.hidden,):
            raise LiteUnavailable("its input embedding is not a float table in the folder's safetensors files")
        path, tensor = embed
        self.embedding = EmbeddingRows(
            path, tensor.start, tensor.shape[0], config.hidden, tensor.dtype, path.open("rb")
        )
        width = config.hidden // 32 * Q4_RECORD
        qkv_rows = (config.heads + 2 * config.kv_heads) * config.head_dim
        self.layers: list[LiteLayer] = []
        for index in range(config.layers):
            prefix = f"model.layers.{index}."
            norms = [
                stored.get(prefix + name) for name in ("input_layernorm.weight", "post_attention_layernorm.weight")
            ]
            if norms[0] is None or norms[1] is None:
                raise LiteUnavailable(f"layer {index}'s norms are not in the folder's safetensors files")
            bias = self.packed.get(f"{index}.qkv.b", (qkv_rows,)) if f"{index}.qkv.b" in self.packed.tensors else None
            self.layers.append(
                LiteLayer(
                    attn_norm=_read_vector(norms[0], config.hidden),
                    mlp_norm=_read_vector(norms[1], config.hidden),
                    qkv=self.packed.get(f"{index}.qkv.q", (qkv_rows // Q4_GROUP, width)),
                    qkv_bias=bias,
                    o=self.packed.get(
                        f"{index}.o.q", (config.hidden // Q4_GROUP, config.heads * config.head_dim // 32 * Q4_RECORD)
                    ),
                    gate_up=self.packed.get(f"{index}.gu.q", (2 * config.inter // Q4_GROUP, width)),
                    down=self.packed.get(
                        f"{index}.down.q", (config.hidden // Q4_GROUP, config.inter // 32 * Q4_RECORD)
                    ),
                )
            )
        self.attn_norms = [layer.attn_norm for layer in self.layers]
        self.mlp_norms = [layer.mlp_norm for layer in self.layers]
        final = stored.get("model.norm.weight")
        if final is None:
            raise LiteUnavailable("the final norm is not in the folder's safetensors files")
        self.final_norm = _read_vector(final, config.hidden)
        self.lm_scale = self.packed.get("lm.s", (config.vocab,))
        self.lm_rows = self.packed.get("lm.q")
        if self.lm_rows.shape != (-(-config.vocab // Q4_GROUP), config.hidden // 32 * HEAD_RECORD):
            raise LiteUnavailable(f"the packed copy's lm.q has shape {self.lm_rows.shape}")
        self._bind_step()

    @property
    def digest(self) -> str:
        return f"sha256:{self.packed_sha256}"

    def describe(self) -> str:
        described, runs = describe_step(self.library, "q4", self.decode_team)
        return (
            f"torch-free runtime: fused {described} decode step ({runs}); prefill from the records in chunks of up "
            f"to {PREFILL_CHUNK} tokens, fp32 activations"
        )

    # -- the step's arguments (pointers into the arrays above, kept alive by self)
    def _bind_step(self) -> None:
        config = self.config
        self._row = np.zeros(self.embedding.row_bytes, dtype=np.uint8)  # the token's embedding row, read per step
        if self.embedding.dtype == "F16":  # the step reads bf16 or fp32 rows: an fp16 row is converted first
            self._row_f32: Floats | None = np.zeros(config.hidden, dtype=np.float32)
        else:
            self._row_f32 = None
        sizes = {
            **config.step_sizes(self.threads),
            "embed_bf16": int(self.embedding.dtype == "BF16"),
            "q4": 1,
        }
        row = self._row_f32 if self._row_f32 is not None else self._row
        glob = {
            "embed": row.ctypes.data,
            "final_norm": self.final_norm.ctypes.data,
            "lm_q": self.lm_rows.ctypes.data,
            "lm_s": self.lm_scale.ctypes.data,
            "inv_freq": config.inv_freq.ctypes.data,
        }
        layers = [
            {
                "attn_norm": layer.attn_norm.ctypes.data,
                "mlp_norm": layer.mlp_norm.ctypes.data,
                "qkv_q": layer.qkv.ctypes.data,
                "qkv_b": layer.qkv_bias.ctypes.data if layer.qkv_bias is not None else None,
                "o_q": layer.o.ctypes.data,
                "gu_q": layer.gate_up.ctypes.data,
                "down_q": layer.down.ctypes.data,
            }
            for layer in self.layers
        ]
        self.arguments = StepArguments(self.lib, sizes, config.eps, 1.0, glob, layers)

    @property
    def weight_bytes(self) -> int:
        return self.config.weight_bytes(int(self.packed.map.nbytes))

    def _bind_kv(self, keys: list[int], values: list[int], capacity: int) -> None:
        self.arguments.bind_kv(keys, values, capacity)

    def _run_step(self, token: int, position: int, logits: Floats) -> int:
        self.embedding.read_into(token, self._row)
        if self._row_f32 is not None:
            self._row_f32[:] = self._row.view(np.float16)
        with self.decode_team.timed(1) as threads:
            self.arguments.set_threads(threads)
            return self.arguments.run(0, position, logits.ctypes.data)

    def close(self) -> None:
        super().close()
        self.embedding.handle.close()

    def _embed(self, ids: Sequence[int]) -> Floats:
        return self.embedding.read(ids)

    def _qkv(self, h: Floats, index: int) -> tuple[Floats, Floats, Floats]:
        config, layer = self.config, self.layers[index]
        q_width, kv_width = config.heads * config.head_dim, config.kv_heads * config.head_dim
        qkv = self._q4(h, layer.qkv, q_width + 2 * kv_width)
        if layer.qkv_bias is not None:
            qkv += layer.qkv_bias
        return qkv[:, :q_width], qkv[:, q_width : q_width + kv_width], qkv[:, q_width + kv_width :]

    def _out(self, attended: Floats, index: int) -> Floats:
        return self._q4(attended, self.layers[index].o, self.config.hidden)

    def _mlp(self, h: Floats, index: int) -> Floats:
        config, layer = self.config, self.layers[index]
        gate_up = self._q4(h, layer.gate_up, 2 * config.inter)
        return self._q4(_silu_times(gate_up, config.inter), layer.down, config.hidden)

    def _q4(self, x: Floats, records: npt.NDArray[np.uint8], rows: int) -> Floats:
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.empty((x.shape[0], rows), dtype=np.float32)
        q4_prefill(
            self.lib, records.ctypes.data, rows, x.shape[1], x.ctypes.data, False, x.shape[0], out.ctypes.data, False,
            self.threads,
        )  # fmt: skip
        return out

    def _lm_head(self, x: Floats) -> Floats:
        config = self.config
        out = np.empty((x.shape[0], config.vocab), dtype=np.float32)
        lm_head(
            self.lib, self.lm_rows.ctypes.data, self.lm_scale.ctypes.data, config.vocab, config.hidden, x.ctypes.data,
            x.shape[0], out.ctypes.data, self.threads,
        )  # fmt: skip
        return out


def _silu_times(gate_up: Floats, inter: int) -> Floats:
    """SiLU(gate) * up for gate_up = [gate | up] rows, in place in gate_up's gate half (no temporaries of its size
    beyond one: at 1B and 512 rows each is 11 MiB)."""
    gate, up = gate_up[:, :inter], gate_up[:, inter:]
    activated = np.negative(gate)
    np.exp(activated, out=activated)
    activated += 1.0
    np.divide(gate, activated, out=activated)
    activated *= up
    return activated


def packed_copy(folder: Path) -> Path:
    """Where `folder`'s packed Q4_1 copy is cached; LiteUnavailable when there is none yet."""
    path = packed_cache_file(folder, "bf16", kind="decode-fused-q4")
    if path is None or not path.exists():
        raise LiteUnavailable("no packed Q4_1 copy yet (the first q4 load through torch writes it)")
    return path


def open_model(
    folder: Path, notices: list[str] | None = None, threads: int | None = None, packed: Path | None = None
) -> LiteModel:
    """The model in `folder` from its cached packed copy (`packed`, where the caller found it already), checked
    against its sha256; LiteUnavailable says why not (no packed copy yet, a damaged one: moved aside with a line in
    `notices`, no kernel for this CPU)."""
    library = load_library()
    if isinstance(library, str):
        raise LiteUnavailable(library)
    path = packed or packed_copy(folder)
    found = notices if notices is not None else []
    checked = integrity.check_or_quarantine(path, "packed decode copy", "packed again", found)
    if checked is None:
        raise LiteUnavailable("the packed Q4_1 copy failed its check")
    model = LiteModel(folder, path, library, threads)
    model.packed_sha256 = checked.sha256
    return model
