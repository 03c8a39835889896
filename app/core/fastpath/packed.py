"""One copy of the weights on the CPU (`--quant q4`): the decoder matrices held once, as the fused decode step's Q4_1
blocks, and prefill run from them.

The model loads in its files' own dtype (transformers maps the safetensors file: nothing is read yet), each decoder
linear layer is swapped for a `Q4Linear` whose buffers are views of the packed matrices the fused step reads (q/k/v
are row ranges of the merged QKV matrix, gate/up every other row of the interleaved one), and the lm_head for an
`Int8RowsLinear` over the fused step's int8 rows, so the 16-bit matrices are never resident: a warm start maps the
packed copy from the cache and never reads them. A call (prefill) dequantizes its matrix a bounded chunk of rows at a
time into one scratch buffer reused by every layer (`SCRATCH_BYTES`) and runs the fast GEMM per chunk (bf16 where
torch's bf16 GEMM is native, fp32 elsewhere: app.core.fastpath.prefill); the fused C step does the single-token steps.

Memory (measured with /proc/self/status, see README "One copy of the weights"): the model is loaded in its weight
files' own dtype, so transformers keeps every tensor as an untouched view of the mapped file and no 16-bit copy of
the matrices is ever made; the embedding stays such a view (`MappedEmbedding`: only the pages around rows read become
resident, as with llama.cpp's mmap, clean file pages the kernel can drop under pressure), a tied lm_head becomes the
fused step's int8 rows like an untied one (so prefill's logits never read the whole embedding), and only the small
tensors (norms, biases) are copied, at the compute dtype.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from app.core.fastpath import prefill

# A prefill call dequantizes at most this many bytes of a matrix at a time (a chunk of output rows, GEMM per chunk):
# the 1B model's gate/up would otherwise need 23-46 MiB dense. 4 MiB chunks keep 512-row GEMMs at >= 256 columns.
SCRATCH_BYTES = 4 << 20
CHUNK_ROW_ALIGN = 32  # chunks start at multiples of this many rows


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


def dequantize_q4(q: torch.Tensor, dm: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The reference (and fallback) dequantization: Q4_1 nibbles [rows, cols/2] + fp16 (d, m) pairs [rows, 2 * blocks]
    -> d * q + m [rows, cols], with the C kernel's two roundings."""
    rows = q.shape[0]
    values = torch.cat([(q & 15).view(rows, -1, 16), (q >> 4).view(rows, -1, 16)], dim=-1).float()
    pairs = dm.reshape(rows, -1, 2).float()
    return (values * pairs[..., :1] + pairs[..., 1:]).reshape(rows, -1).to(dtype)


class Q4Linear(nn.Module):
    """A linear layer whose weight is held only as Q4_1 blocks (views of the fused step's packed matrix)."""

    q: torch.Tensor
    dm: torch.Tensor

    def __init__(
        self,
        q: torch.Tensor,
        dm: torch.Tensor,
        bias: torch.Tensor | None,
        scratch: Scratch,
        library: Any,
        gemm_dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.out_features = int(q.shape[0])
        self.in_features = int(q.shape[1]) * 2
        self.register_buffer("q", q, persistent=False)
        self.register_buffer("dm", dm, persistent=False)
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None
        self.scratch = scratch
        self.library = library  # the fused kernel's library (its hearth_dequant_q4), or None: torch's reference
        self.gemm_dtype = gemm_dtype

    def dense(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The weight, dequantized into the shared scratch buffer (valid until the next layer's call)."""
        dtype = dtype or self.gemm_dtype
        out = self.scratch.take(self.out_features, self.in_features, dtype)
        if self.library is None or self.q.stride(1) != 1 or self.dm.stride(1) != 1:
            out.copy_(dequantize_q4(self.q, self.dm, dtype))
            return out
        self.library.lib.hearth_dequant_q4(
            self.q.data_ptr(),
            self.q.stride(0),
            self.dm.data_ptr(),
            self.dm.stride(0),
            self.out_features,
            self.in_features,
            out.data_ptr(),
            int(dtype == torch.bfloat16),
            max(1, torch.get_num_threads()),
        )
        return out

    def dequantize_rows_into(self, start: int, out: torch.Tensor) -> None:
        """Rows [start, start + len(out)) of the weight, dequantized into `out` (as `dense` does for all rows)."""
        end = start + int(out.shape[0])
        q, dm = self.q[start:end], self.dm[start:end]
        if self.library is None or q.stride(1) != 1 or dm.stride(1) != 1:
            out.copy_(dequantize_q4(q, dm, out.dtype))
            return
        self.library.lib.hearth_dequant_q4(
            q.data_ptr(),
            q.stride(0),
            dm.data_ptr(),
            dm.stride(0),
            end - start,
            self.in_features,
            out.data_ptr(),
            int(out.dtype == torch.bfloat16),
            max(1, torch.get_num_threads()),
        )

    def forward(self, input: torch.Tensor) -> torch.Tensor:
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
    """An lm_head (tied or not) held only as the fused step's int8 rows (fp32 scale per row); prefill asks for one
    row of logits, computed a chunk of rows (SCRATCH_BYTES of fp32 at most) at a time."""

    q: torch.Tensor
    scale: torch.Tensor

    def __init__(self, q: torch.Tensor, scale: torch.Tensor) -> None:
        super().__init__()
        self.out_features, self.in_features = int(q.shape[0]), int(q.shape[1])
        self.register_buffer("q", q, persistent=False)
        self.register_buffer("scale", scale, persistent=False)
        self.bias = None

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        flat = input.reshape(-1, self.in_features).float()
        out = torch.empty(flat.shape[0], self.out_features, dtype=torch.float32)
        step = chunk_rows(self.in_features, torch.float32)
        for start in range(0, self.out_features, step):
            end = min(start + step, self.out_features)
            weight = self.q[start:end].float().mul_(self.scale[start:end, None])  # SCRATCH_BYTES at most
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
    """The input embedding left as a view of the mapped weight file (a buffer, so it is not one of the model's
    parameters): a lookup touches only the pages it reads (with the kernel's read-around: measured 244 KiB per sparse
    row of the 1B model on Linux 6.18), and returns the rows at the compute dtype."""

    def __init__(self, weight: torch.Tensor, dtype: torch.dtype, padding_idx: int | None) -> None:
        super().__init__(1, int(weight.shape[1]), padding_idx=None, _weight=torch.empty(1, int(weight.shape[1])))
        del self.weight
        self.register_buffer("weight", weight.detach(), persistent=False)
        self.num_embeddings = int(weight.shape[0])
        self.padding_idx = padding_idx
        self.compute_dtype = dtype

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.embedding(input, self.weight, self.padding_idx).to(self.compute_dtype)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, mapped from the weight file as {self.weight.dtype}"


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


def hold_once(model: Any, tensors: Mapping[str, torch.Tensor], library: Any) -> int:
    """Swap the decoder's linear layers and the lm_head (tied or not) for views of `tensors` (native.pack_model's
    Q4_1 layout and int8 lm_head rows), and the embedding for a `MappedEmbedding` over its mapped tensor; returns the
    bytes the swapped-out weights held. Call `keep_small` first: the rest must not stay views of the file."""
    base: Any = model.model
    config = model.config.get_text_config(decoder=True)
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    gemm_dtype = torch.bfloat16 if prefill.native_bf16_gemm() else torch.float32
    scratch = Scratch()
    freed = 0

    def swap(parent: nn.Module, name: str, q: torch.Tensor, dm: torch.Tensor) -> None:
        nonlocal freed
        old = getattr(parent, name)
        freed += old.weight.numel() * old.weight.element_size()
        bias = old.bias.detach() if getattr(old, "bias", None) is not None else None
        setattr(parent, name, Q4Linear(q, dm, bias, scratch, library, gemm_dtype))

    for index, layer in enumerate(base.layers):
        attention, mlp = layer.self_attn, layer.mlp
        q, dm = tensors[f"{index}.qkv.q"], tensors[f"{index}.qkv.s"]
        bounds = [0, heads * head_dim, (heads + kv_heads) * head_dim, (heads + 2 * kv_heads) * head_dim]
        for part, start, end in zip(("q_proj", "k_proj", "v_proj"), bounds, bounds[1:], strict=False):
            swap(attention, part, q[start:end], dm[start:end])
        swap(attention, "o_proj", tensors[f"{index}.o.q"], tensors[f"{index}.o.s"])
        gu_q, gu_dm = tensors[f"{index}.gu.q"], tensors[f"{index}.gu.s"]
        swap(mlp, "gate_proj", gu_q[0::2], gu_dm[0::2])
        swap(mlp, "up_proj", gu_q[1::2], gu_dm[1::2])
        swap(mlp, "down_proj", tensors[f"{index}.down.q"], tensors[f"{index}.down.s"])
    head = model.get_output_embeddings()
    embedding = model.get_input_embeddings()
    dtype = compute_dtype(model) or embedding.weight.dtype
    if isinstance(head, nn.Linear) and "lm.q" in tensors:
        # A tied head too: prefill's logits then read the int8 rows the fused step holds, not the whole embedding.
        if head.weight is not embedding.weight:
            freed += head.weight.numel() * head.weight.element_size()
        model.set_output_embeddings(Int8RowsLinear(tensors["lm.q"], tensors["lm.s"]))
    if isinstance(embedding, nn.Embedding) and not isinstance(embedding, MappedEmbedding):
        if embedding.weight.dtype in MAPPABLE_EMBEDDING_DTYPES:
            model.set_input_embeddings(MappedEmbedding(embedding.weight, dtype, embedding.padding_idx))
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
