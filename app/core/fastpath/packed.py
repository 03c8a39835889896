"""One copy of the weights on the CPU (`--quant q4`): the decoder matrices held once, as the fused decode step's Q4_1
blocks, and prefill run from them.

The model loads in its files' own dtype (transformers maps the safetensors file: nothing is read yet), each decoder
linear layer is swapped for a `Q4Linear` whose buffer is a view of the packed matrix the fused step reads (Q4_1
records in groups of 16 rows: q/k/v are group ranges of the merged QKV matrix, gate/up the two halves of the merged
one), and the lm_head for an `Int8RowsLinear` over the fused step's int8 rows (grouped the same way), so the 16-bit
matrices are never resident: a warm start maps the packed copy from the cache and never reads them. A short call
(prefill of up to RECORD_PREFILL_ROWS rows on x86) multiplies the records directly (`hearth_q4_prefill`); a longer one
dequantizes its matrix a bounded chunk of rows at a time into one scratch buffer reused by every layer
(`SCRATCH_BYTES`) and runs the fast GEMM per chunk (bf16 where torch's bf16 GEMM is native, fp32 elsewhere:
app.core.fastpath.prefill); the fused C step does the single-token steps.

Memory (measured with /proc/self/status, see README "One copy of the weights"): the model is loaded in its weight
files' own dtype, so transformers keeps every tensor as an untouched view of the mapped file and no 16-bit copy of
the matrices is ever made; the embedding stays such a view (`MappedEmbedding`: only the pages around rows read become
resident, as with llama.cpp's mmap, clean file pages the kernel can drop under pressure), a tied lm_head becomes the
fused step's int8 rows like an untied one (so prefill's logits never read the whole embedding), and only the small
tensors (norms, biases) are copied, at the compute dtype.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from app.core.fastpath import prefill
from app.core.fastpath.kernel import HEAD_RECORD, Q4_GROUP, Q4_RECORD, lm_head, q4_prefill
from app.core.fastpath.rows import RowFile, advise_random_access
from app.core.fastpath.rows import locate as locate_rows
from app.core.models.attention import attention_shape

# A prefill call dequantizes at most this many bytes of a matrix at a time (a chunk of output rows, GEMM per chunk):
# the 1B model's gate/up would otherwise need 23-46 MiB dense. 4 MiB chunks keep 512-row GEMMs at >= 256 columns.
SCRATCH_BYTES = 4 << 20
CHUNK_ROW_ALIGN = 32  # chunks start at multiples of this many rows (whole groups of Q4_GROUP)


class Scratch:
    """One reusable buffer for the dequantized rows of the layer being multiplied; `peak` is the most it held."""

    def __init__(self) -> None:
        self.buffer = torch.empty(0, dtype=torch.uint8)
        self.peak = 0

    def take(self, rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
        size = rows * cols * torch.tensor([], dtype=dtype).element_size()
        if self.buffer.numel() < size:
            self.buffer = torch.empty(size, dtype=torch.uint8)
            self.peak = max(self.peak, size)
        return self.buffer[:size].view(dtype).view(rows, cols)


def chunk_rows(cols: int, dtype: torch.dtype, budget: int = SCRATCH_BYTES) -> int:
    """Rows of a [rows, cols] matrix that fit `budget` bytes at `dtype` (whole multiples of CHUNK_ROW_ALIGN, at least
    one multiple)."""
    row_bytes = cols * torch.tensor([], dtype=dtype).element_size()
    return max(CHUNK_ROW_ALIGN, budget // row_bytes // CHUNK_ROW_ALIGN * CHUNK_ROW_ALIGN)


def interleave_q4(nibbles: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    """quantize_q4_blocks' rows -> the kernel's x16 layout: per group of 16 rows and block of 32 columns one 320-byte
    record (64-byte chunk k holds bytes 4k..4k+3 of row i's block at 4i..4i+3; then the 16 d, then the 16 m, fp16);
    [rows / 16, blocks * 320] uint8. Rows must be a multiple of 16."""
    rows, blocks = nibbles.shape[0], nibbles.shape[1] // 16
    groups = rows // Q4_GROUP
    chunks = nibbles.reshape(groups, Q4_GROUP, blocks, 4, 4).permute(0, 2, 3, 1, 4).reshape(groups, blocks, 256)
    dm = pairs.reshape(groups, Q4_GROUP, blocks, 2).permute(0, 2, 3, 1).contiguous()  # [groups, blocks, (d, m), 16]
    scales = dm.view(torch.uint8).reshape(groups, blocks, 64)
    return torch.cat([chunks, scales], dim=-1).reshape(groups, blocks * Q4_RECORD).contiguous()


def deinterleave_q4(records: torch.Tensor, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """interleave_q4 undone: (nibbles [rows, cols / 2], fp16 (d, m) pairs [rows, 2 * blocks])."""
    groups, blocks = records.shape[0], cols // 32
    parts = records.reshape(groups, blocks, Q4_RECORD)
    chunks = parts[..., :256].reshape(groups, blocks, 4, Q4_GROUP, 4).permute(0, 3, 1, 2, 4)
    nibbles = chunks.reshape(groups * Q4_GROUP, blocks * 16)
    dm = parts[..., 256:].contiguous().view(torch.float16).reshape(groups, blocks, 2, Q4_GROUP).permute(0, 3, 1, 2)
    return nibbles.contiguous(), dm.reshape(groups * Q4_GROUP, 2 * blocks).contiguous()


def interleave_rows(q: torch.Tensor) -> torch.Tensor:
    """int8 rows [rows, cols] -> the lm_head's x16 layout: per group of 16 rows and block of 32 columns a 512-byte
    record (64-byte chunk k holds bytes 4k..4k+3 of row i's block at 4i..4i+3); [ceil(rows / 16), blocks * 512]
    int8, the last group padded with zero rows."""
    rows, cols = q.shape
    groups, blocks = -(-rows // Q4_GROUP), cols // 32
    padded = torch.zeros(groups * Q4_GROUP, cols, dtype=torch.int8)
    padded[:rows] = q
    chunks = padded.reshape(groups, Q4_GROUP, blocks, 8, 4).permute(0, 2, 3, 1, 4)
    return chunks.reshape(groups, blocks * HEAD_RECORD).contiguous()


def deinterleave_rows(records: torch.Tensor, cols: int) -> torch.Tensor:
    """interleave_rows undone, padding included: int8 [groups * 16, cols]."""
    groups, blocks = records.shape[0], cols // 32
    chunks = records.reshape(groups, blocks, 8, Q4_GROUP, 4).permute(0, 3, 1, 2, 4)
    return chunks.reshape(groups * Q4_GROUP, cols)


def dequantize_q4(records: torch.Tensor, cols: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The reference (and fallback) dequantization: the kernel's Q4_1 records [rows / 16, blocks * 320]
    (interleave_q4) -> d * q + m [rows, cols], with the C kernel's two roundings."""
    q, dm = deinterleave_q4(records, cols)
    rows = q.shape[0]
    values = torch.cat([(q & 15).view(rows, -1, 16), (q >> 4).view(rows, -1, 16)], dim=-1).float()
    pairs = dm.reshape(rows, -1, 2).float()
    return (values * pairs[..., :1] + pairs[..., 1:]).reshape(rows, -1).to(dtype)


# Up to how many rows a call multiplies the records (hearth_q4_prefill: the activations as int16 steps split into two
# int8 halves, through the decode step's int8 dot products) instead of dequantizing chunks for a GEMM, per Q4_1
# kernel (hearth_q4_kernel()). Measured per matrix against torch's GEMM (2 threads, Zen 4): AVX-512 VNNI (4) vs bf16,
# 2-4x faster at 12-32 rows, 1.4-2.3x at 49, 1.3-2x at 64, 1.0-1.3x at 128; the AVX2 kernel (3) vs fp32 with torch
# held to AVX2, 2.7-3.2x at 12 rows, 1.5x at 48, 1.1-1.4x at 512: every prefill chunk (README "Prefill from the
# records"). ARM's kernels (1, 2) are unmeasured: there prefill keeps the GEMM.
RECORD_PREFILL_ROWS = {4: 96, 3: 512}
# hearth_q4_prefill's buffers per input row and column: the two int8 halves, and per block of 32 three floats.
RECORD_PREFILL_BYTES_PER_VALUE = 2 + 3 * 4 / 32


class Q4Linear(nn.Module):
    """A linear layer whose weight is held only as Q4_1 records (a view of the fused step's packed matrix)."""

    records: torch.Tensor

    def __init__(
        self,
        records: torch.Tensor,
        bias: torch.Tensor | None,
        scratch: Scratch,
        library: Any,
        gemm_dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.out_features = int(records.shape[0]) * Q4_GROUP
        self.in_features = int(records.shape[1]) // Q4_RECORD * 32
        self.register_buffer("records", records, persistent=False)
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None
        self.scratch = scratch
        self.library = library  # the fused kernel's library (hearth_q4_prefill, hearth_dequant_q4), or None: torch's
        self.gemm_dtype = gemm_dtype
        # Short inputs multiply the records (up to this many rows; 0: never), longer ones dequantize for a GEMM.
        self.record_rows = RECORD_PREFILL_ROWS.get(int(library.lib.hearth_q4_kernel()), 0) if library is not None else 0

    def dense(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The whole weight, dequantized into the shared scratch buffer (valid until the next layer's call)."""
        out = self.scratch.take(self.out_features, self.in_features, dtype or self.gemm_dtype)
        self.dequantize_rows_into(0, out)
        return out

    def dequantize_rows_into(self, start: int, out: torch.Tensor) -> None:
        """Rows [start, start + len(out)) of the weight (start a multiple of Q4_GROUP), dequantized into `out` (as
        `dense` does for all rows)."""
        end = start + int(out.shape[0])
        records = self.records[start // Q4_GROUP : -(-end // Q4_GROUP)]
        if self.library is None or not records.is_contiguous():
            out.copy_(dequantize_q4(records, self.in_features, out.dtype)[: end - start])
            return
        self.library.lib.hearth_dequant_q4(
            records.data_ptr(),
            end - start,
            self.in_features,
            out.data_ptr(),
            int(out.dtype == torch.bfloat16),
            max(1, torch.get_num_threads()),
        )

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        rows = input.numel() // self.in_features
        if (
            0 < rows <= self.record_rows
            and self.records.is_contiguous()
            and input.dtype in (torch.bfloat16, torch.float32)
        ):
            return self._on_records(input)
        return self._dequantized(input)

    def _on_records(self, input: torch.Tensor) -> torch.Tensor:
        """A short input (a prompt, a reused turn's new tokens) straight from the records (hearth_q4_prefill): the
        matrix is read once and never dequantized, the activations held to 15 bits a block (finer than bf16's
        8-bit mantissa), so the result is closer to fp32's than the bf16 GEMM's."""
        flat = input.reshape(-1, self.in_features).contiguous()
        out = torch.empty(flat.shape[0], self.out_features, dtype=input.dtype)
        q4_prefill(
            self.library.lib,
            self.records.data_ptr(),
            self.out_features,
            self.in_features,
            flat.data_ptr(),
            flat.dtype == torch.bfloat16,
            flat.shape[0],
            out.data_ptr(),
            out.dtype == torch.bfloat16,
            max(1, torch.get_num_threads()),
        )
        if self.bias is not None:
            out += self.bias.to(out.dtype)
        return out.reshape(*input.shape[:-1], self.out_features)

    def _dequantized(self, input: torch.Tensor) -> torch.Tensor:
        """A chunk of output rows at a time: dequantize it into the scratch buffer (at most SCRATCH_BYTES), GEMM it
        into its columns of the output."""
        dtype = self.gemm_dtype
        flat = input.reshape(-1, self.in_features).to(dtype)
        out = torch.empty(flat.shape[0], self.out_features, dtype=dtype)
        step = chunk_rows(self.in_features, dtype)
        for start in range(0, self.out_features, step):
            rows = min(step, self.out_features - start)
            weight = self.scratch.take(rows, self.in_features, dtype)
            self.dequantize_rows_into(start, weight)
            bias = self.bias[start : start + rows].to(dtype) if self.bias is not None else None
            out[:, start : start + rows] = F.linear(flat, weight, bias)
        return out.reshape(*input.shape[:-1], self.out_features).to(input.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, Q4_1 held once"


class Int8RowsLinear(nn.Module):
    """An lm_head (tied or not) held only as the fused step's int8 rows (fp32 scale per row, rows in the x16 layout of
    interleave_rows). Prefill asks for one row of logits: with the kernel's library it is computed as the fused step
    computes every decode token's (`hearth_lm_head`: int8 activations, the rows read once); without, in torch, a
    chunk of rows (SCRATCH_BYTES of fp32 at most) dequantized at a time."""

    q: torch.Tensor
    scale: torch.Tensor

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, library: Any = None) -> None:
        super().__init__()
        self.out_features = int(scale.shape[0])
        self.in_features = int(q.shape[1]) // HEAD_RECORD * 32
        self.register_buffer("q", q, persistent=False)
        self.register_buffer("scale", scale, persistent=False)
        self.bias = None
        self.library = library

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        flat = input.reshape(-1, self.in_features).float()
        out = torch.empty(flat.shape[0], self.out_features, dtype=torch.float32)
        if self.library is not None and self.q.is_contiguous() and self.scale.is_contiguous():
            flat = flat.contiguous()
            lm_head(
                self.library.lib,
                self.q.data_ptr(),
                self.scale.data_ptr(),
                self.out_features,
                self.in_features,
                flat.data_ptr(),
                flat.shape[0],
                out.data_ptr(),
                max(1, torch.get_num_threads()),
            )
            return out.reshape(*input.shape[:-1], self.out_features).to(input.dtype)
        step = chunk_rows(self.in_features, torch.float32)
        for start in range(0, self.out_features, step):  # step: whole groups of 16 rows
            end = min(start + step, self.out_features)
            rows = deinterleave_rows(self.q[start // Q4_GROUP : -(-end // Q4_GROUP)], self.in_features)[: end - start]
            weight = rows.float().mul_(self.scale[start:end, None])  # SCRATCH_BYTES at most
            torch.matmul(flat, weight.t(), out=out[:, start:end])
        return out.reshape(*input.shape[:-1], self.out_features).to(input.dtype)


COMPUTE_DTYPE_ATTR = "_hearth_compute_dtype"
MAPPABLE_EMBEDDING_DTYPES = (torch.bfloat16, torch.float32)  # what the fused step reads rows of (others are copied)


def set_compute_dtype(model: Any, dtype: torch.dtype) -> None:
    """Say which dtype a q4 model computes (and keeps its KV cache) in, whatever dtype its mapped tensors have."""
    setattr(model, COMPUTE_DTYPE_ATTR, dtype)


def compute_dtype(model: Any) -> torch.dtype | None:
    """The dtype set by `set_compute_dtype`, or None (the model computes in its embedding's dtype)."""
    dtype = getattr(model, COMPUTE_DTYPE_ATTR, None)
    return dtype if isinstance(dtype, torch.dtype) else None


class MappedEmbedding(nn.Embedding):
    """The input embedding left in the weight file (a buffer over its map, so it is not one of the model's
    parameters), returning rows at the compute dtype. With `rows` (app.core.fastpath.rows) a lookup reads just the
    rows asked for and the table never becomes resident; without, it reads the map with read-around off (244 KiB per
    sparse row of the 1B model on Linux 6.18 with it, 64 KiB of fault-around without)."""

    def __init__(
        self, weight: torch.Tensor, dtype: torch.dtype, padding_idx: int | None, rows: RowFile | None = None
    ) -> None:
        super().__init__(1, int(weight.shape[1]), padding_idx=None, _weight=torch.empty(1, int(weight.shape[1])))
        del self.weight
        self.register_buffer("weight", weight.detach(), persistent=False)
        self.num_embeddings = int(weight.shape[0])
        self.padding_idx = padding_idx
        self.compute_dtype = dtype
        self.rows = rows
        if rows is None:  # lookups read the map
            advise_random_access(weight.data_ptr(), weight.numel() * weight.element_size())

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if self.rows is not None:
            return self.rows.lookup(input).to(self.compute_dtype)
        return F.embedding(input, self.weight, self.padding_idx).to(self.compute_dtype)

    def extra_repr(self) -> str:
        how = "read by row from" if self.rows is not None else "mapped from"
        return f"{self.num_embeddings}, {self.embedding_dim}, {how} the weight file as {self.weight.dtype}"


def big_tensor_ids(model: Any) -> set[int]:
    """The tensors q4 never copies: the decoder layers' linear weights, the input embedding and the lm_head weight."""
    base: Any = model.model
    ids = {id(m.weight) for layer in base.layers for m in layer.modules() if type(m) is nn.Linear}
    for module in (model.get_input_embeddings(), model.get_output_embeddings()):
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.Tensor):
            ids.add(id(weight))
    return ids


def keep_small(model: Any, dtype: torch.dtype) -> None:
    """Copy what q4 keeps besides the matrices (norms, biases, buffers) out of the mapped file, floating parameters at
    the compute dtype (as a load in that dtype would have made them), before the matrices are packed from the map."""
    big = big_tensor_ids(model)
    for module in model.modules():
        for param in list(module.parameters(recurse=False)):
            if id(param) not in big:
                param.data = param.data.to(dtype if param.is_floating_point() else param.dtype, copy=True)
        for name, buffer in list(module.named_buffers(recurse=False)):
            if id(buffer) not in big:
                module._buffers[name] = buffer.clone()


def hold_once(model: Any, tensors: Mapping[str, torch.Tensor], library: Any, folder: Path | None = None) -> int:
    """Swap the decoder's linear layers and the lm_head (tied or not) for views of `tensors` (native.pack_model's
    Q4_1 records and int8 lm_head rows), and the embedding for a `MappedEmbedding` over its mapped tensor; returns the
    bytes the swapped-out weights held. Call `keep_small` first: the rest must not stay views of the file."""
    base: Any = model.model
    config = model.config.get_text_config(decoder=True)
    heads, kv_heads, head_dim = attention_shape(config)
    gemm_dtype = prefill.gemm_dtype()
    scratch = Scratch()
    freed = 0

    def swap(parent: nn.Module, name: str, records: torch.Tensor) -> None:
        nonlocal freed
        old = getattr(parent, name)
        freed += old.weight.numel() * old.weight.element_size()
        bias = old.bias.detach() if getattr(old, "bias", None) is not None else None
        setattr(parent, name, Q4Linear(records, bias, scratch, library, gemm_dtype))

    inter_groups = int(config.intermediate_size) // Q4_GROUP
    for index, layer in enumerate(base.layers):
        attention, mlp = layer.self_attn, layer.mlp
        qkv = tensors[f"{index}.qkv.q"]
        bounds = [0, heads, heads + kv_heads, heads + 2 * kv_heads]  # in heads; head_dim is a multiple of 16 rows
        for part, start, end in zip(("q_proj", "k_proj", "v_proj"), bounds, bounds[1:], strict=False):
            swap(attention, part, qkv[start * head_dim // Q4_GROUP : end * head_dim // Q4_GROUP])
        swap(attention, "o_proj", tensors[f"{index}.o.q"])
        gate_up = tensors[f"{index}.gu.q"]
        swap(mlp, "gate_proj", gate_up[:inter_groups])
        swap(mlp, "up_proj", gate_up[inter_groups:])
        swap(mlp, "down_proj", tensors[f"{index}.down.q"])
    head = model.get_output_embeddings()
    embedding = model.get_input_embeddings()
    dtype = compute_dtype(model) or embedding.weight.dtype
    if isinstance(head, nn.Linear) and "lm.q" in tensors:
        # A tied head too: prefill's logits then read the int8 rows the fused step holds, not the whole embedding.
        if head.weight is not embedding.weight:
            freed += head.weight.numel() * head.weight.element_size()
        model.set_output_embeddings(Int8RowsLinear(tensors["lm.q"], tensors["lm.s"], library))
    if isinstance(embedding, nn.Embedding) and not isinstance(embedding, MappedEmbedding):
        if embedding.weight.dtype in MAPPABLE_EMBEDDING_DTYPES:
            rows = locate_rows(folder, embedding.weight)
            model.set_input_embeddings(MappedEmbedding(embedding.weight, dtype, embedding.padding_idx, rows))
        else:  # the fused step reads bf16 or fp32 rows: an fp16 file's embedding is copied at the compute dtype
            embedding.weight.data = embedding.weight.data.to(dtype, copy=True)
    return freed


def is_held_once(model: Any) -> bool:
    return any(isinstance(module, Q4Linear) for module in model.modules())


def held_tensor_bytes(model: Any) -> int:
    """Bytes of the packed matrices the model's own layers hold (the fused step reads the same memory)."""
    total = 0
    for module in model.modules():
        if isinstance(module, (Q4Linear, Int8RowsLinear)):
            total += sum(b.numel() * b.element_size() for b in module.buffers(recurse=False))
    return total


def mapped_tensor_bytes(model: Any) -> int:
    """Bytes the model keeps as views of its mapped weight file (the embedding): resident only where touched."""
    return sum(m.weight.numel() * m.weight.element_size() for m in model.modules() if isinstance(m, MappedEmbedding))
