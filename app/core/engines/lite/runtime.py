"""What every torch-free Llama-family runtime shares: the model's description (LiteConfig), its KV cache
(LiteCache), and DecoderRuntime: the prefill in numpy over the kernel's products, PREFILL_CHUNK rows a call, and the
decode step each model binds. The models: a packed folder (lite.packed_model) and a GGUF file (lite.gguf_model).

Numerics: activations in fp32 throughout (the torch path runs bf16 where the CPU has it); the KV cache in bf16 (as
the torch path keeps it on such CPUs, and as half the memory of fp32); the matrices' products are the kernel's.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import psutil
from threadpoolctl import ThreadpoolController

from app.core.engines.kv_pool import shared_prefix
from app.core.errors import HearthError
from app.core.fastpath.kernel import (
    Q4_GROUP,
    SUPPORTED_MODEL_TYPES,
    NativeLibrary,
    grown_capacity,
)
from app.core.fastpath.team import EXPLORE_EVERY, TeamChooser
from app.core.models.attention import AttentionShape, attention_shape
from app.core.models.model_source import check_config_sizes

PREFILL_CHUNK = 256  # rows a prefill call takes at most: bounds the activations' peak (the kernel is as fast at 64)
ATTENTION_SCORE_BYTES = 1 << 20  # one attention block's scores (per thread)
PARALLEL_ATTENTION_MIN = 64 * 256  # query rows x positions below which attention runs on the calling thread

Floats = npt.NDArray[np.float32]


class LiteUnavailable(Exception):
    """Why this model can't run without torch (the caller loads it through torch instead); the text says why."""


# -- bf16 in numpy (which has no bf16 dtype): the cache's storage --------------------------------------------------
def to_bf16(values: Floats) -> npt.NDArray[np.uint16]:
    """Round to nearest even, as torch's fp32 -> bf16 conversion does (NaN aside: activations here never are)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))
    return (rounded >> np.uint32(16)).astype(np.uint16)


def from_bf16(values: npt.NDArray[np.uint16]) -> Floats:
    return (values.astype(np.uint32) << np.uint32(16)).view(np.float32)


# -- the model's description -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LiteConfig:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    inter: int
    vocab: int
    eps: float
    inv_freq: Floats  # [head_dim / 2]
    context_window: int

    @property
    def kv_bytes_per_token(self) -> int:
        """Every layer's keys and values for one token, in the cache's bf16."""
        return self.layers * AttentionShape(self.heads, self.kv_heads, self.head_dim).kv_bytes_per_token(2)

    def step_sizes(self, threads: int) -> dict[str, int]:
        """The kernel's size fields every model's step binds (a bf16 KV cache, `threads` at most)."""
        return {
            "layers": self.layers,
            "hidden": self.hidden,
            "heads": self.heads,
            "kv_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "inter": self.inter,
            "vocab": self.vocab,
            "kv_bf16": 1,
            "threads": threads,
        }

    def weight_bytes(self, packed_bytes: int) -> int:
        """What the model holds: its packed copy (every decode step reads all of it) and its fp32 norms."""
        return packed_bytes + 4 * self.hidden * (2 * self.layers + 1)

    @classmethod
    def read(cls, folder: Path) -> LiteConfig:
        try:
            raw = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise LiteUnavailable(f"its config.json could not be read ({exc})") from exc
        config = raw.get("text_config", raw) if isinstance(raw, dict) else {}
        if not isinstance(config, dict):
            raise LiteUnavailable("its config.json is not a JSON object")
        try:
            check_config_sizes(raw, str(folder / "config.json"))
        except HearthError as exc:
            raise LiteUnavailable(str(exc)) from exc
        model_type = str(config.get("model_type", ""))
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise LiteUnavailable(f"the runtime implements {', '.join(SUPPORTED_MODEL_TYPES)}, not {model_type!r}")
        if str(config.get("hidden_act", "silu")) != "silu":
            raise LiteUnavailable(f"activation {config.get('hidden_act')} is not in the kernel")
        layer_types = config.get("layer_types") or []
        window = config.get("sliding_window")
        if any(kind != "full_attention" for kind in layer_types) or (
            window and config.get("use_sliding_window", True) and not layer_types
        ):
            raise LiteUnavailable("sliding-window attention is not in the kernel")
        try:
            heads, kv_heads, head_dim = attention_shape(_Attributes(config))
            hidden, inter = int(config["hidden_size"]), int(config["intermediate_size"])
            layers, vocab = int(config["num_hidden_layers"]), int(config["vocab_size"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise LiteUnavailable(f"its config.json lacks a size ({exc})") from exc
        if any(width % 32 for width in (hidden, inter, heads * head_dim)) or head_dim % Q4_GROUP:
            raise LiteUnavailable("the kernel needs sizes in multiples of 32 and head sizes in multiples of 16")
        return cls(
            layers=layers,
            hidden=hidden,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            inter=inter,
            vocab=vocab,
            eps=float(config.get("rms_norm_eps", 1e-6)),
            inv_freq=rope_inv_freq(config, head_dim),
            context_window=int(config.get("max_position_embeddings") or 2048),
        )


class _Attributes:
    """A config dict read as attributes (attention_shape reads configs that way)."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)

    def __getattr__(self, name: str) -> Any:
        return None


def rope_inv_freq(config: dict[str, Any], head_dim: int) -> Floats:
    """RoPE's inverse frequencies for the static types the kernel implements (default, linear, llama3), computed as
    transformers computes them (in fp32)."""
    params = config.get("rope_parameters") or {**(config.get("rope_scaling") or {})}
    if "rope_theta" not in params:
        params = {**params, "rope_theta": config.get("rope_theta", 10000.0)}
    rope_type = str(params.get("rope_type") or params.get("type") or "default")
    if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise LiteUnavailable("partial rotary embeddings are not in the kernel")
    steps = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inv_freq = (np.float32(1.0) / (np.float32(params["rope_theta"]) ** steps)).astype(np.float32)
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return (inv_freq / np.float32(params["factor"])).astype(np.float32)
    if rope_type == "llama3":
        factor = float(params["factor"])
        low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
        old_context = float(params["original_max_position_embeddings"])
        wavelen = np.float32(2 * math.pi) / inv_freq
        scaled = np.where(wavelen > old_context / low, inv_freq / np.float32(factor), inv_freq).astype(np.float32)
        smooth = ((old_context / wavelen - low) / (high - low)).astype(np.float32)
        smoothed = (1 - smooth) * scaled / np.float32(factor) + smooth * scaled
        medium = ~(wavelen < old_context / high) & ~(wavelen > old_context / low)
        return np.where(medium, smoothed, scaled).astype(np.float32)
    raise LiteUnavailable(f"RoPE type {rope_type} is not in the kernel")


# -- the KV cache --------------------------------------------------------------------------------------------------
class LiteCache:
    """A conversation's keys and values: per layer [kv_heads, capacity, head_dim] bf16 slabs (the layout hearth_step
    writes), the first `length` positions valid; `ids` are the tokens they hold (for prefix reuse)."""

    def __init__(self, config: LiteConfig) -> None:
        self.config = config
        self.length = 0
        self.ids: list[int] = []
        self.keys: list[npt.NDArray[np.uint16]] = []
        self.values: list[npt.NDArray[np.uint16]] = []
        self.version = 0  # bumped on every reallocation (the step's pointers are then stale)
        self._addresses: tuple[int, list[int], list[int]] = (-1, [], [])  # (version, K slabs, V slabs)

    @property
    def capacity(self) -> int:
        return int(self.keys[0].shape[1]) if self.keys else 0

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.keys) + sum(a.nbytes for a in self.values)

    def reserve(self, needed: int) -> None:
        if needed <= self.capacity:
            return
        if needed > self.config.context_window:
            raise ValueError(f"{needed} positions exceed the model's context window ({self.config.context_window})")
        capacity = grown_capacity(self.capacity, needed, self.config.context_window)
        shape = (self.config.kv_heads, capacity, self.config.head_dim)
        for slabs in (self.keys, self.values):
            for index in range(self.config.layers):
                new = np.empty(shape, dtype=np.uint16)
                if index < len(slabs):
                    new[:, : self.length] = slabs[index][:, : self.length]
                    slabs[index] = new
                else:
                    slabs.append(new)
        self.version += 1

    def slab_addresses(self) -> tuple[list[int], list[int]]:
        """Each layer's K and V slab address (what the C step points at), read again only after a reallocation."""
        if self._addresses[0] != self.version:
            self._addresses = (
                self.version,
                [slab.ctypes.data for slab in self.keys],
                [slab.ctypes.data for slab in self.values],
            )
        return self._addresses[1], self._addresses[2]

    def truncate(self, length: int) -> None:
        """Keep the first `length` positions (a speculative forward's rejected guesses go)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot keep {length} of {self.length} cached positions")
        self.length = length
        del self.ids[length:]

    def reuse_for(self, prompt: Sequence[int]) -> int:
        """Keep the longest common prefix with `prompt` (always leaving its last token to run) and return its
        length."""
        common = shared_prefix(self.ids, list(prompt[:-1]))
        self.length = common
        del self.ids[common:]
        return common


# -- the runtime -----------------------------------------------------------------------------------------------------
@cache
def _blas_controller() -> ThreadpoolController:
    return ThreadpoolController()


def default_threads() -> int:
    """One thread per physical core this process may run on, as torch's default (decode is bound by memory: a
    core's second hardware thread adds barrier cost, not bandwidth)."""
    try:
        allowed = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity call
        allowed = os.cpu_count() or 1
    return max(1, min(allowed, psutil.cpu_count(logical=False) or allowed))


class DecoderRuntime:
    """What every torch-free model shares: the prefill (numpy over the kernel's products, PREFILL_CHUNK rows a
    call), its attention, the KV cache, and the decode step's binding. A subclass supplies the weights: its
    embedding rows, the attention and MLP products of a layer, the head, and one decode step in C."""

    config: LiteConfig
    library: NativeLibrary
    lib: Any
    threads: int
    rope_pairs = False  # RoPE on adjacent pairs (GGUF llama Q/K rows) instead of halves (Hugging Face's)
    path_name = "lite-q4"  # the stats' and the response cache's name for how its steps run
    exact_forward = False  # whether forward() computes each row bit for bit as step() does (prompt lookup needs it)
    batched_step = False  # whether run_sequences() runs several sequences' steps in one call (a server's batch)
    attn_norms: list[Floats]
    mlp_norms: list[Floats]
    final_norm: Floats

    def _start(self, library: NativeLibrary, config: LiteConfig, threads: int | None) -> None:
        self.library = library
        self.lib = library.lib
        self.config = config
        self.threads = threads or (default_threads() if library.threaded else 1)  # the most a call uses
        # a fixed `threads` is kept as asked (tests, benchmarks); else each call's team follows the free cores
        self.decode_team = TeamChooser(self.threads, explore_every=0 if threads else EXPLORE_EVERY)
        self.prefill_team = TeamChooser(self.threads, explore_every=0 if threads else EXPLORE_EVERY)
        self.batch_team = TeamChooser(self.threads, explore_every=0 if threads else EXPLORE_EVERY)
        self._bound: tuple[LiteCache, int, int] | None = None  # (the cache, its version, capacity) last bound
        self._executor: ThreadPoolExecutor | None = None

    def fix_threads(self, threads: int) -> None:
        """Run every call on `threads` threads (at most the team it started with), never trying another size:
        benchmarks that hold two engines to the same thread count."""
        size = max(1, min(threads, self.threads))
        self.decode_team = TeamChooser(size, explore_every=0)
        self.prefill_team = TeamChooser(size, explore_every=0)
        self.batch_team = TeamChooser(size, explore_every=0)

    # -- what a subclass supplies
    def _embed(self, ids: Sequence[int]) -> Floats:
        raise NotImplementedError

    def _qkv(self, h: Floats, index: int) -> tuple[Floats, Floats, Floats]:
        raise NotImplementedError

    def _out(self, attended: Floats, index: int) -> Floats:
        raise NotImplementedError

    def _mlp(self, h: Floats, index: int) -> Floats:
        raise NotImplementedError

    def _lm_head(self, x: Floats) -> Floats:
        raise NotImplementedError

    def _bind_kv(self, keys: list[int], values: list[int], capacity: int) -> None:
        raise NotImplementedError

    def _run_step(self, token: int, position: int, logits: Floats) -> int:
        raise NotImplementedError

    @property
    def weight_bytes(self) -> int:
        raise NotImplementedError

    @property
    def digest(self) -> str:
        """Which weights the decode reads (part of a cached reply's identity)."""
        raise NotImplementedError

    def describe(self) -> str:
        """The reply note's account of how this model runs."""
        raise NotImplementedError

    def new_cache(self) -> LiteCache:
        return LiteCache(self.config)

    def forward(self, ids: Sequence[int], cache: LiteCache, logit_rows: int) -> Floats:
        """Run `ids` after the cache's positions; the logits after each of the last `logit_rows` of them, each row as
        a decode step computes it (only where `exact_forward`)."""
        raise NotImplementedError(f"{type(self).__name__} computes no exact multi-row forward")

    def check(self, ids: Sequence[int], cache: LiteCache) -> Floats:
        """A prompt-lookup check: the current token and its guesses, the logits after each (`forward`'s)."""
        return self.forward(ids, cache, len(ids))

    def run_sequences(self, parts: Sequence[tuple[Sequence[int], LiteCache, bool]]) -> list[Floats]:
        """Several sequences' tokens (tokens, cache, wants_logits) in one forward, each row as its own step computes
        it; the logits after each wanting part's last token (only where `batched_step`)."""
        raise NotImplementedError(f"{type(self).__name__} computes no batched step")

    def step_rows(self, tokens: Sequence[int], caches: Sequence[LiteCache]) -> Floats:
        """One token of each sequence at its cache's next position in one call (a server's batched decode step); the
        logits [rows, vocab], row i bit for bit what step(tokens[i], caches[i]) gives."""
        if len(tokens) != len(caches) or not caches:
            raise ValueError("a batched step takes one token for each cache")
        return np.stack(
            self.run_sequences([([token], cache, True) for token, cache in zip(tokens, caches, strict=True)])
        )

    # -- decode
    def step(self, token: int, cache: LiteCache) -> Floats:
        """Run `token` at the cache's next position; the next token's logits [vocab] (fp32)."""
        position = cache.length
        cache.reserve(position + 1)
        self._bind(cache)
        if not 0 <= token < self.config.vocab:
            raise ValueError(f"token id {token} is outside the model's {self.config.vocab}-token vocabulary")
        logits = np.empty(self.config.vocab, dtype=np.float32)
        code = self._run_step(token, position, logits)
        if code != 0:
            raise RuntimeError(f"the decode step refused token {token} at position {position} (code {code})")
        cache.length = position + 1
        cache.ids.append(int(token))
        return logits

    def _bind(self, cache: LiteCache) -> None:
        """Point the C step at the cache's slabs, unless it already points at these (reserve() replaces them). The
        bound cache is held, not just its id(): a new cache may get a freed one's id, and the step would then write
        into freed slabs."""
        bound = self._bound
        if bound is None or bound[0] is not cache or bound[1:] != (cache.version, cache.capacity):
            self._bind_kv(*cache.slab_addresses(), cache.capacity)
            self._bound = (cache, cache.version, cache.capacity)

    # -- prefill
    def prefill(self, ids: Sequence[int], cache: LiteCache) -> Floats:
        """Run `ids` after the cache's positions, PREFILL_CHUNK at a time; the logits after the last [vocab]."""
        if not ids:
            raise ValueError("prefill needs at least one token")
        cache.reserve(cache.length + len(ids))
        hidden: Floats | None = None
        # numpy's BLAS (attention's products) one thread per call, the calls spread over our own threads: its spinning
        # worker threads would otherwise take the cores from the kernel's OpenMP team (measured: 2x slower at 135M).
        with _blas_controller().limit(limits=1, user_api="blas"):
            for start in range(0, len(ids), PREFILL_CHUNK):
                hidden = self._prefill_chunk(ids[start : start + PREFILL_CHUNK], cache)
        assert hidden is not None
        last = np.ascontiguousarray(self._norm(hidden[-1:], self.final_norm))
        return self._lm_head(last)[0]

    def _prefill_chunk(self, ids: Sequence[int], cache: LiteCache) -> Floats:
        config = self.config
        start, count = cache.length, len(ids)
        x = self._embed(ids)
        angles = np.arange(start, start + count, dtype=np.float32)[:, None] * config.inv_freq[None, :]
        if self.rope_pairs:
            cos, sin, rope = np.cos(angles), np.sin(angles), _rope_pairs
        else:
            cos = np.cos(np.concatenate([angles, angles], axis=1))
            sin = np.sin(np.concatenate([angles, angles], axis=1))
            rope = _rope
        for index in range(config.layers):
            q, k, v = self._qkv(self._norm(x, self.attn_norms[index]), index)
            q = rope(q.reshape(count, config.heads, config.head_dim), cos, sin)
            k = rope(k.reshape(count, config.kv_heads, config.head_dim), cos, sin)
            v = v.reshape(count, config.kv_heads, config.head_dim)
            cache.keys[index][:, start : start + count] = to_bf16(k).transpose(1, 0, 2)
            cache.values[index][:, start : start + count] = to_bf16(v).transpose(1, 0, 2)
            del k, v
            x += self._out(self._attention(q, index, cache, start, count), index)
            x += self._mlp(self._norm(x, self.mlp_norms[index]), index)
        cache.length = start + count
        cache.ids.extend(int(token) for token in ids)
        return x

    def _attention(self, q: Floats, index: int, cache: LiteCache, start: int, count: int) -> Floats:
        """Causal attention of the chunk's queries over every cached position: per KV head, its group's query heads
        in one product with the keys, in blocks of rows that keep the scores to ATTENTION_SCORE_BYTES; the blocks
        spread over the threads (numpy releases the GIL in its products and ufuncs)."""
        config = self.config
        total, group, dim = start + count, config.heads // config.kv_heads, config.head_dim
        out = np.empty((count, config.heads * dim), dtype=np.float32)
        block = max(16, ATTENTION_SCORE_BYTES // (4 * group * total))
        # Every KV head's keys and values as fp32, once a call (not once a block), and the queries pre-scaled.
        keys = from_bf16(cache.keys[index][:, :total])
        values = from_bf16(cache.values[index][:, :total])
        q = q * np.float32(dim**-0.5)

        def attend(kv_head: int, first: int) -> None:
            last = min(first + block, count)
            rows, seen = last - first, start + last  # no row of the block sees past its last row's position
            heads = slice(kv_head * group, (kv_head + 1) * group)
            queries = q[first:last, heads].transpose(1, 0, 2).reshape(group * rows, dim)
            scores = (queries @ keys[kv_head, :seen].T).reshape(group, rows, seen)
            scores[:, :, seen - rows :] += _causal_mask(rows)  # row r sees the block's positions up to its own
            scores -= scores.max(axis=2, keepdims=True)
            np.exp(scores, out=scores)
            sums = scores.sum(axis=2, keepdims=True)
            mixed = (scores.reshape(group * rows, seen) @ values[kv_head, :seen]).reshape(group, rows, dim)
            mixed /= sums
            out[first:last, kv_head * group * dim : (kv_head + 1) * group * dim] = mixed.transpose(1, 0, 2).reshape(
                rows, group * dim
            )

        tasks = [(kv_head, first) for kv_head in range(config.kv_heads) for first in range(0, count, block)]
        # A short input's attention is less work than handing it to the threads.
        if self.threads > 1 and len(tasks) > 1 and count * total >= PARALLEL_ATTENTION_MIN:
            list(self._pool().map(lambda task: attend(*task), tasks))
        else:
            for task in tasks:
                attend(*task)
        return out

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.threads, thread_name_prefix="hearth-attention")
        return self._executor

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown()
            self._executor = None

    def _norm(self, x: Floats, weight: Floats) -> Floats:
        variance = np.mean(np.square(x), axis=-1, keepdims=True)
        return (x / np.sqrt(variance + np.float32(self.config.eps))).astype(np.float32) * weight


@cache
def _causal_mask(rows: int) -> Floats:
    """[rows, rows]: 0 on and below the diagonal, -inf above (read-only: shared by every call)."""
    mask = np.triu(np.full((rows, rows), -np.inf, dtype=np.float32), k=1)
    mask.flags.writeable = False
    return mask


def _rope_pairs(x: Floats, cos: Floats, sin: Floats) -> Floats:
    """x [count, heads, head_dim] rotated on adjacent pairs (2i, 2i + 1) by angle i: llama.cpp's layout of llama's Q
    and K rows (its converter interleaves each head's halves), the same rotation as _rope on the halves."""
    pairs = x.reshape(*x.shape[:-1], -1, 2)
    a, b = pairs[..., 0], pairs[..., 1]
    c, s = cos[:, None, :], sin[:, None, :]
    return np.stack([a * c - b * s, b * c + a * s], axis=-1).reshape(x.shape).astype(np.float32)


def _rope(x: Floats, cos: Floats, sin: Floats) -> Floats:
    """x [count, heads, head_dim] rotated as transformers' rotate_half does (the halves, not interleaved pairs)."""
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return (x * cos[:, None, :] + rotated * sin[:, None, :]).astype(np.float32)
