"""A float64 forward pass of a llama/qwen2 GGUF file from its own dequantized tensors (gguf.quants, the bit-exact
oracle), for checking the torch-free runtime's logits and for bench/quality.py's reference. Slow, simple, obvious."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader, quants


class ReferenceModel:
    def __init__(self, path: Path) -> None:
        reader = GGUFReader(str(path))
        self.tensors: dict[str, np.ndarray[Any, Any]] = {}
        for tensor in reader.tensors:
            values = quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float64)
            self.tensors[tensor.name] = values.reshape(tuple(int(d) for d in reversed(tensor.shape)))
        fields = {name: field for name, field in reader.fields.items()}

        def value(key: str, default: Any = None) -> Any:
            field = fields.get(key)
            if field is None:
                return default
            return field.parts[field.data[0]].tolist()[0] if field.types[0].name != "STRING" else None

        arch = bytes(fields["general.architecture"].parts[-1]).decode()
        self.pairs = arch == "llama"
        self.layers = int(value(f"{arch}.block_count"))
        self.heads = int(value(f"{arch}.attention.head_count"))
        self.kv_heads = int(value(f"{arch}.attention.head_count_kv", self.heads))
        hidden = int(value(f"{arch}.embedding_length"))
        self.head_dim = int(value(f"{arch}.attention.key_length", hidden // self.heads))
        self.eps = float(value(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5))
        theta = float(value(f"{arch}.rope.freq_base", 10000.0))
        self.inv_freq = 1.0 / theta ** (np.arange(0, self.head_dim, 2) / self.head_dim)
        if "rope_freqs.weight" in self.tensors:
            self.inv_freq = self.inv_freq / self.tensors["rope_freqs.weight"]
        self.head = self.tensors.get("output.weight", self.tensors["token_embd.weight"])

    def _norm(self, x: np.ndarray[Any, Any], weight: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * weight

    def _rope(self, x: np.ndarray[Any, Any], positions: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        angles = positions[:, None] * self.inv_freq[None, :]  # [n, half]
        cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
        if self.pairs:
            a, b = x[..., 0::2], x[..., 1::2]
            out = np.empty_like(x)
            out[..., 0::2], out[..., 1::2] = a * cos - b * sin, b * cos + a * sin
            return out
        half = x.shape[-1] // 2
        a, b = x[..., :half], x[..., half:]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)

    def logits(self, ids: list[int]) -> np.ndarray[Any, Any]:
        """Every position's logits [len(ids), vocab] for the token ids, from position 0."""
        t = self.tensors
        n = len(ids)
        x = t["token_embd.weight"][ids]
        positions = np.arange(n, dtype=np.float64)
        mask = np.triu(np.full((n, n), -np.inf), k=1)
        group = self.heads // self.kv_heads
        for index in range(self.layers):
            p = f"blk.{index}."
            h = self._norm(x, t[p + "attn_norm.weight"])
            q = h @ t[p + "attn_q.weight"].T + t.get(p + "attn_q.bias", 0)
            k = h @ t[p + "attn_k.weight"].T + t.get(p + "attn_k.bias", 0)
            v = h @ t[p + "attn_v.weight"].T + t.get(p + "attn_v.bias", 0)
            q = self._rope(q.reshape(n, self.heads, self.head_dim), positions)
            k = self._rope(k.reshape(n, self.kv_heads, self.head_dim), positions)
            v = v.reshape(n, self.kv_heads, self.head_dim)
            out = np.empty((n, self.heads, self.head_dim))
            for head in range(self.heads):
                g = head // group
                scores = q[:, head] @ k[:, g].T / np.sqrt(self.head_dim) + mask
                scores = np.exp(scores - scores.max(axis=1, keepdims=True))
                out[:, head] = (scores / scores.sum(axis=1, keepdims=True)) @ v[:, g]
            x = x + out.reshape(n, -1) @ t[p + "attn_output.weight"].T
            h = self._norm(x, t[p + "ffn_norm.weight"])
            gate, up = h @ t[p + "ffn_gate.weight"].T, h @ t[p + "ffn_up.weight"].T
            x = x + (gate / (1 + np.exp(-gate)) * up) @ t[p + "ffn_down.weight"].T
        return self._norm(x, t["output_norm.weight"]) @ self.head.T
