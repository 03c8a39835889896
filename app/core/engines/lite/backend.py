"""The torch-free chat backend, and when a load can take it.

A GGUF file on the CPU runs on its own blocks (app.core.engines.lite.gguf_model); a q4 model folder whose packed copy
is cached (written by its first load through torch) runs from that copy. Either way without torch:
`open_lite_backend` returns a LiteBackend, or the reason it can't, and the caller (app.core.engines.opening) then
loads through torch as before. What needs torch stays there: models whose code or tokenizer only transformers' auto
classes load, and every GPU.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psutil

from app.core.chat.events import Event
from app.core.chat.response_cache import ResponseCache
from app.core.chat.template_safety import check_model
from app.core.engines.backend import (
    CPU_NOTICE,
    LoadRequest,
    MemoryReading,
    ModelInfo,
    ProgressCallback,
    ReplyRequest,
)
from app.core.engines.batching import BatchStep, NoRoomYet, ReplyItem
from app.core.engines.generation import token_ids
from app.core.engines.kv_pool import (
    MAX_POOLED,
    POOL_MEMORY_SHARE,
    ConversationCaches,
    PrefixKVPool,
    pool_size,
    tokens_each,
)
from app.core.engines.lite.engine import LiteEngine, LiteKV, eos_ids, load_tokenizer
from app.core.engines.lite.gguf_model import GGUFModel, open_gguf_model
from app.core.engines.lite.gguf_plan import (
    file_type_label,
    forward_scratch_bytes,
    gguf_config,
    gguf_support,
    parameter_counts,
    resident_weight_bytes,
    runtime_bytes,
)
from app.core.engines.lite.packed_model import open_model, packed_copy
from app.core.engines.lite.prefix_store import (
    CacheShape,
    PrefixCache,
    PrefixStore,
    budget_for,
    file_sha256,
    folder_usage,
    identity_digest,
)
from app.core.engines.lite.runtime import (
    PREFILL_CHUNK,
    DecoderRuntime,
    LiteConfig,
    LiteUnavailable,
    default_threads,
)
from app.core.errors import HearthError, LoadCancelled
from app.core.fastpath.kernel import ABI as KERNEL_ABI
from app.core.fastpath.kernel import NativeLibrary, load_library
from app.core.fastpath.packed_cache import torch_version
from app.core.memory.fit import window_that_fits
from app.core.memory.types import DeviceMemory, MemoryPlan, format_bytes
from app.core.models.gguf_meta import read_gguf_header
from app.core.models.gguf_tokenizer import (
    gguf_eos_ids,
    gguf_tokenizer_file,
    load_gguf_tokenizer_and_file,
    tokenizer_kept,
)
from app.core.models.model_source import (
    ModelSource,
    check_folder_weights,
    file_fingerprint,
    resolve_model,
    weights_fingerprint,
)
from app.core.settings import DEFAULT_PARALLEL
from app.core.storage.paths import cache_dir

log = logging.getLogger(__name__)

RUNTIME_ENV = "HEARTH_RUNTIME"  # "auto" (torch-free where it can run), "torch" (never), "lite" (refuse otherwise)
RUNTIME_CHOICES = ("auto", "torch", "lite")
RUNTIME_FLOOR_BYTES = 64 << 20  # the interpreter, numpy and the tokenizer before any weight (~45 MiB measured)
IMPORTS_BYTES = 49 << 20  # the interpreter, numpy, tokenizers and the load path imported (measured: 48.8 MiB)
TOKENIZER_BUILD_BYTES = 21 << 20  # transformers, imported by a file's first load to build its tokenizer (21.0 MiB)


GGUF_DECLINED = "this GGUF file: "  # begins the reason when the runtime would take the load but not this file


class LiteRefused(HearthError):
    """HEARTH_RUNTIME=lite, and this load can't run without torch."""


def runtime_choice() -> str:
    choice = os.environ.get(RUNTIME_ENV, "") or "auto"
    if choice not in RUNTIME_CHOICES:
        raise HearthError(f"{RUNTIME_ENV}={choice} is not one of {', '.join(RUNTIME_CHOICES)}.")
    return choice


def gpu_reason() -> str:
    """Why `--device auto` lands on the CPU, judged without importing torch; "" when a GPU may be there (then the
    torch path decides)."""
    version = torch_version()
    if sys.platform == "darwin":
        return "" if os.uname().machine == "arm64" else "this Mac has no Metal GPU PyTorch can use"
    if version.endswith("+cpu"):
        return "this PyTorch build has no CUDA support"
    if sys.platform.startswith("linux"):
        if Path("/proc/driver/nvidia/version").exists() or Path("/dev/kfd").exists():
            return ""
        return "no CUDA GPU was found"
    return ""  # Windows with a CUDA build: only torch can tell


@dataclass(frozen=True)
class LiteCandidate:
    """A load the torch-free runtime can take, as far as can be told without opening it: a GGUF file (run on its
    own blocks), or a model folder with its cached packed copy."""

    source: ModelSource
    folder: Path | None  # the Hugging Face folder (None for a GGUF file)
    packed: Path | None  # its cached packed copy (checked when it is opened)
    notices: tuple[str, ...]
    gguf: Path | None = None


def lite_candidate(request: LoadRequest) -> LiteCandidate | str:
    """The request's model and folder when the torch-free runtime may take the load, else why not (a sentence)."""
    if runtime_choice() == "torch":
        return f"{RUNTIME_ENV}=torch"
    if request.remote is not None:
        return "a remote model"
    if request.quantization not in ("auto", "q4"):
        return f"{request.quantization} weights run through torch"
    notices: tuple[str, ...] = ()
    if request.device == "auto":
        reason = gpu_reason()
        if not reason:
            return "a GPU may be present"
        notices = (CPU_NOTICE.format(reason=reason),)
    elif request.device != "cpu":
        return f"device {request.device} runs through torch"
    if request.trust_remote_code or request.allow_pickle:
        return "models that run their own code or pickled weights load through torch"
    try:
        source = resolve_model(request.model)
        if source.kind == "gguf":
            gguf: Path | None = source.path
        else:
            weights = check_folder_weights(source.path, allow_pickle=False)
            gguf = weights[0] if weights[0].suffix == ".gguf" else None
            if gguf is None and weights[0].suffix != ".safetensors":
                return "the weights are not safetensors"
    except HearthError as exc:
        return f"the model could not be resolved here ({exc})"
    if gguf is not None:
        reason = gguf_support(gguf)
        return GGUF_DECLINED + reason if reason else LiteCandidate(source, None, None, notices, gguf)
    try:
        packed = packed_copy(source.path)
    except LiteUnavailable as exc:
        return str(exc)
    return LiteCandidate(source, source.path, packed, notices)


def lite_plan(request: LoadRequest, free_bytes: int | None = None, replies: int = 1) -> MemoryPlan | str:
    """The memory plan of the torch-free runtime for this request (what the window shows before loading), read from
    the config and the packed copy's size without opening the model; else why the runtime would not take it.
    `replies`: served replies decoded together, each with its own KV cache (a packed copy decodes one at a time)."""
    candidate = lite_candidate(request)
    if isinstance(candidate, str):
        return candidate
    try:
        if candidate.gguf is not None:
            header = read_gguf_header(candidate.gguf)
            config, _ = gguf_config(header)
            library = load_library()
            weights = resident_weight_bytes(header, library.lib if isinstance(library, NativeLibrary) else None)
            label = file_type_label(header)
            counts = parameter_counts(header)
            first_load = not tokenizer_kept(candidate.gguf)
        else:
            assert candidate.folder is not None and candidate.packed is not None
            config = LiteConfig.read(candidate.folder)
            weights, label, counts = config.weight_bytes(candidate.packed.stat().st_size), "", (0, 0)
            first_load = False
    except (LiteUnavailable, HearthError, OSError) as exc:
        return str(exc)
    window = min(config.context_window, request.context_length or config.context_window)
    return memory_plan(
        candidate.source.display_name, config, weights, window, label, free_bytes, counts, replies, first_load
    )


def memory_plan(
    name: str,
    config: LiteConfig,
    weights: int,
    window: int,
    gguf_type: str = "",
    free_bytes: int | None = None,
    parameters: tuple[int, int] = (0, 0),
    replies: int = 1,
    builds_tokenizer: bool = False,
) -> MemoryPlan:
    """The planner's plan for this runtime's own figures: the weights as mapped (a GGUF file's tensors to the byte,
    or the packed copy and norms), a bf16 KV cache per reply, one prefill chunk's activations (a batched step's rows
    take less) and the runtime's floor, against the memory available now. `gguf_type`: the GGUF file's type (e.g.
    Q4_K_M), "" for a packed copy, which has no batched step: its replies decode one at a time, in one cache.
    `builds_tokenizer`: a GGUF's first load, which imports transformers to build the tokenizer (later loads read the
    copies it keeps)."""
    free = int(psutil.virtual_memory().available) if free_bytes is None else free_bytes
    replies = replies if gguf_type else 1
    per_token = config.kv_bytes_per_token
    if gguf_type:  # the C forward's scratch for a full prefill chunk, the tokenizer by its vocabulary, and the
        # prompt cache's block being read back and the one being copied out
        activations = forward_scratch_bytes(config, default_threads(), min(PREFILL_CHUNK, window), window)
        activations += 2 * CacheShape(config.layers, config.kv_heads, config.head_dim).block_bytes
        runtime = IMPORTS_BYTES + runtime_bytes(config.vocab) + (TOKENIZER_BUILD_BYTES if builds_tokenizer else 0)
    else:
        activations = PREFILL_CHUNK * (2 * config.inter + 3 * config.hidden + config.heads * config.head_dim) * 4 * 3
        runtime = RUNTIME_FLOOR_BYTES
    fixed = weights + activations + runtime
    room = int(min(max(0, (free - fixed) // (per_token * replies)), config.context_window))
    total = fixed + per_token * window * replies
    return MemoryPlan(
        model=name,
        model_type="llama",
        quantization=gguf_type or "q4",
        device="cpu",
        context=window,
        model_max_context=config.context_window,
        parameters=parameters[0],
        quantized_parameters=parameters[1],
        weights_bytes=weights,
        weights_by_device={"cpu": weights},
        kv_bytes_per_token=per_token,
        kv_bytes_per_token_long=per_token,
        kv_bytes=per_token * window * replies,
        kv_dtype="bf16",
        kv_layers=config.layers,
        kv_sliding_layers=0,
        overhead_bytes=activations + runtime,
        overhead={"prefill activations": activations, "runtime (Python, numpy, tokenizer)": runtime},
        total_bytes=total,
        free_bytes=free,
        free_source="measured" if free_bytes is None else "stated",
        free_after_bytes=free - total,
        fits="yes" if total <= free else "no",
        max_context=room,
        notes=(
            f"torch-free runtime: the GGUF file's {gguf_type} blocks, mapped"
            if gguf_type
            else "torch-free runtime: the packed Q4_1 copy, mapped",
            *([serving_note(config, free, replies, window)] if gguf_type else []),
        ),
        replies=replies,
        served_together=MAX_POOLED if gguf_type else 1,  # LiteBackend.max_batch: a packed copy has no batched step
        served_kv_budget_bytes=int(free * POOL_MEMORY_SHARE) if gguf_type else 0,
    )


def serving_note(config: LiteConfig, free: int, replies: int = 1, window: int = 0) -> str:
    """What `hearth serve` lets replies decoded together reserve (LiteBackend.reply_steps: a quarter of the memory
    free at load), and how long each of `replies` (DEFAULT_PARALLEL where 1) replies may then be; planned for
    several replies of `window` tokens, how many of them the budget runs together."""
    budget = int(free * POOL_MEMORY_SHARE)
    together = replies if replies > 1 else DEFAULT_PARALLEL
    each = tokens_each(budget, config.kv_bytes_per_token, together, config.context_window)
    note = (
        f"served (`hearth serve`): replies decoded together reserve at most {format_bytes(budget)} of KV cache, a "
        f"quarter of the memory free at load: {together} at once of up to {each:,} tokens each (prompt plus "
        "max_tokens); a request beyond that waits for a running one to end"
    )
    if replies > 1 and window > each:
        running = max(1, budget // (window * config.kv_bytes_per_token))
        note += f". At {window:,} tokens each, {running} of the {replies} run together and the others wait"
    return note


def open_lite_backend(
    request: LoadRequest, progress: ProgressCallback | None = None, cancel: threading.Event | None = None
) -> LiteBackend | str:
    """The request's model on the torch-free runtime, or why not (a sentence: the caller loads through torch)."""
    started = time.perf_counter()
    candidate = lite_candidate(request)
    if isinstance(candidate, str):
        return candidate
    source, notices = candidate.source, list(candidate.notices)
    if progress is not None:
        progress(f"Opening {source.display_name} (torch-free runtime)…", 0.1)
    recovered: list[str] = []
    model: DecoderRuntime
    first_load = candidate.gguf is not None and not tokenizer_kept(candidate.gguf)
    try:
        if candidate.gguf is not None:
            gguf_model = open_gguf_model(candidate.gguf)
            model = gguf_model
            # a damaged cached copy: said, not lost; the tokenizer.json it came from serves the window's token counts
            tokenizer, tokenizer_file = load_gguf_tokenizer_and_file(candidate.gguf, recovered)
            eos = gguf_eos_ids(candidate.gguf) | token_ids([getattr(tokenizer, "eos_token_id", None)])
            fingerprint, label = file_fingerprint(candidate.gguf), file_type_label(gguf_model.header)
            tokenizer_file = tokenizer_file or gguf_tokenizer_file(candidate.gguf, tokenizer, recovered)
        else:
            assert candidate.folder is not None
            folder = candidate.folder
            model = open_model(folder, recovered, packed=candidate.packed)
            tokenizer = load_tokenizer(folder)
            eos, fingerprint, label = eos_ids(folder, tokenizer), weights_fingerprint(folder), ""
            found = folder / "tokenizer.json"
            tokenizer_file = found if found.is_file() else None
    except LiteUnavailable as exc:
        return str(exc)
    except (OSError, ValueError, HearthError) as exc:
        return f"its files could not be read ({exc})"
    try:
        check_model(candidate.gguf or folder, tokenizer)  # refused at load (naming the file), not at every reply
    except HearthError:
        model.close()
        raise
    if cancel is not None and cancel.is_set():
        model.close()
        raise LoadCancelled()
    window = model.config.context_window
    if request.context_length:
        window = min(window, request.context_length)
    if not request.ignore_fit:
        plan = memory_plan(
            source.display_name, model.config, model.weight_bytes, window, label, builds_tokenizer=first_load
        )
        try:
            window = window_that_fits(plan, request.context_length is not None, notices) or window
        except HearthError:
            model.close()
            raise
    engine = LiteEngine(
        model,
        tokenizer,
        eos,
        model_id=source.repo_id or str(source.path),
        display_name=source.display_name,
        context_window=window,
        weights_fingerprint=fingerprint,
        quantization=label or "q4",
        response_cache=ResponseCache() if request.response_cache else None,
        prompt_lookup=request.prompt_lookup,
    )
    if candidate.gguf is not None and request.prompt_cache_gib > 0:
        start_prompt_cache(engine, gguf_model, candidate.gguf, tokenizer, request.prompt_cache_gib)
    if progress is not None:
        progress("Ready", 1.0)
    info = ModelInfo(
        name=source.display_name,
        quantization=label or "q4",
        device="cpu",
        context_window=window,
        load_seconds=time.perf_counter() - started,
        notices=tuple(notices),
        recovered=(*recovered, *engine.recovery_notices()),
        tokenizer_file=str(tokenizer_file) if tokenizer_file is not None else None,
    )
    return LiteBackend(engine, info)


class LiteBackend:
    """A ChatBackend over the torch-free engine, its caches kept as the torch backend keeps its own: one per
    conversation (the active one), and for requests that name none a prefix pool sized to a share of the memory
    free at load (app.core.engines.kv_pool)."""

    def __init__(self, engine: LiteEngine, info: ModelInfo) -> None:
        self.engine = engine
        budget = int(psutil.virtual_memory().available * POOL_MEMORY_SHARE)
        self.info = replace(
            info,
            served_together=self.max_batch,
            served_kv_budget_bytes=budget,
            kv_bytes_per_token=engine.model.config.kv_bytes_per_token,
        )
        self._caches = ConversationCaches(engine.new_kv)
        self._pool = PrefixKVPool(
            pool_size(budget, engine.model.config.kv_bytes_per_token, info.context_window), engine.new_kv
        )
        self.kv_budget_bytes = budget  # what replies decoded together may reserve for their caches
        self._reserved: dict[int, int] = {}  # a running batched reply's cache (id) -> the bytes it may grow to
        self._process = psutil.Process()
        self._prompt_cache_read = (-PROMPT_CACHE_POLL_S, 0)  # (when, bytes)

    def generate(self, request: ReplyRequest, cancel: threading.Event) -> Iterator[Event]:
        prompt = self.engine.prepare(request)  # the user's errors raise here, before any event
        conversation = request.conversation_id
        kv = self._pool.take(prompt.ids) if conversation is None else self._caches.take(conversation)
        return self.engine.generate_prepared(prompt, request, kv=kv, cancel=cancel)

    @property
    def max_batch(self) -> int:
        """How many replies the server may decode together: one where the model has no batched step. Each writes its
        own KV cache; reply_steps admits one only while the caches' reservations fit the pool's memory budget."""
        return MAX_POOLED if self.engine.model.batched_step else 1

    def reply_steps(self, request: ReplyRequest, cancel: threading.Event) -> Iterator[ReplyItem]:
        """`generate`, its decode steps yielded for the server's queue to run with other replies' (decode_batch);
        the reply's cache is its own until the reply ends."""
        prompt = self.engine.prepare(request)  # the user's errors raise here, before any event
        conversation = request.conversation_id
        if conversation is not None:
            kv = self._caches.take(conversation)
            return self.engine.reply_steps(prompt, request, kv=kv, cancel=cancel, batched=True)
        positions = min(len(prompt.ids) + request.params.max_new_tokens, self.info.context_window)
        needed = positions * self.engine.model.config.kv_bytes_per_token
        if self._reserved and sum(self._reserved.values()) + needed > self.kv_budget_bytes:
            raise NoRoomYet(f"{needed} bytes of KV cache wanted, {sum(self._reserved.values())} reserved")
        kv = self._pool.take(prompt.ids, hold=True)
        self._reserved[id(kv)] = needed
        return self._released(self.engine.reply_steps(prompt, request, kv=kv, cancel=cancel, batched=True), kv)

    def _released(self, items: Iterator[ReplyItem], kv: LiteKV) -> Iterator[ReplyItem]:
        try:
            yield from items
        finally:
            self._reserved.pop(id(kv), None)
            self._pool.release(kv)

    def decode_batch(self, steps: Sequence[BatchStep]) -> None:
        self.engine.decode_batch(steps)

    @property
    def pooled_in_use(self) -> int:
        """The pool's caches that running replies hold."""
        return self._pool.in_use

    def compile_grammar(self, request: ReplyRequest) -> None:
        """The request's grammar compiled now, off the model's thread (the server's compile thread)."""
        self.engine.compile_grammar(request)

    def count_tokens(self, text: str) -> int:
        return self.engine.count_tokens(text) if text else 0

    def memory(self) -> MemoryReading:
        caches = [*self._caches.values(), *self._pool.states()]
        kv_bytes = sum(kv.nbytes() for kv in caches)
        kv_tokens = sum(len(kv.ids) for kv in caches)
        per_token = self.engine.model.config.kv_bytes_per_token
        weights = self.engine.model.weight_bytes
        memory = psutil.virtual_memory()
        rss = int(self._process.memory_info().rss)
        device = DeviceMemory(
            "cpu",
            weights,
            kv_bytes,
            max(rss - weights - kv_bytes, 0),
            int(memory.available),
            total_bytes=int(memory.total),
            process_rss_bytes=rss,
        )
        return MemoryReading(
            (device,),
            per_token,
            kv_tokens + int(memory.available) // per_token,
            prompt_cache_bytes=self._prompt_cache_bytes(),
        )

    def _prompt_cache_bytes(self) -> int | None:
        """The prompt cache's size on disk, read at most every PROMPT_CACHE_POLL_S (the panel asks every second)."""
        if self.engine.prefixes is None:
            return None
        now = time.monotonic()
        if now - self._prompt_cache_read[0] >= PROMPT_CACHE_POLL_S:
            self._prompt_cache_read = (now, folder_usage(prompt_cache_folder())[1])
        return self._prompt_cache_read[1]

    def forget(self, conversation_id: int) -> None:
        self._caches.forget(conversation_id)

    def clear_caches(self) -> None:
        """Drop every KV cache kept between replies (none may be running): the next prompts are prefilled whole."""
        self._caches.clear()
        self._pool.clear()

    def close(self) -> None:
        self._caches.clear()
        self._pool.clear()
        self.engine.close()


PROMPT_CACHE_FOLDER = "prompt-cache"
PROMPT_CACHE_POLL_S = 5.0


def prompt_cache_folder() -> Path:
    return cache_dir() / PROMPT_CACHE_FOLDER


def clear_prompt_cache() -> tuple[int, int]:
    """Remove every saved prompt block (the window's Clear, `hearth cache --clear`): (blocks, bytes) removed."""
    folder = prompt_cache_folder()
    removed = folder_usage(folder)
    if folder.is_dir() and not folder.is_symlink():
        shutil.rmtree(folder, ignore_errors=True)
    return removed


def start_prompt_cache(engine: LiteEngine, model: GGUFModel, path: Path, tokenizer: Any, gib: float) -> None:
    """Give the engine its prompt cache on disk once the weights' digest is known: hashed in the background (an 8B
    file takes seconds), so the first reply never waits for it (it is prefilled as before)."""

    def ready() -> None:
        folder = prompt_cache_folder()
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if folder.is_symlink() or not folder.is_dir():
                raise OSError(f"{folder} is not a plain folder")
            identity = identity_digest(
                {
                    "weights_sha256": file_sha256(path, folder / "weights.json"),
                    "tokenizer": hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest(),
                    "chat_template": hashlib.sha256(str(tokenizer.chat_template or "").encode()).hexdigest(),
                    "kv": "bf16 [layer][kv_head][position][head_dim], K after RoPE",
                    "rope": {
                        "pairs": model.rope_pairs,
                        "inv_freq": hashlib.sha256(model.config.inv_freq.tobytes()).hexdigest(),
                    },
                    "dims": [model.config.layers, model.config.heads, model.config.kv_heads, model.config.head_dim],
                    "numerics": {
                        "kernel_abi": KERNEL_ABI,
                        "kernel": int(model.lib.hearth_q4_kernel()),
                        "precise": model.precise,
                    },
                }
            )
        except OSError as exc:
            log.warning("no prompt cache: %s", exc)
            return
        shape = CacheShape(model.config.layers, model.config.kv_heads, model.config.head_dim)
        budget = budget_for(folder, int(gib * (1 << 30)))
        engine.prefixes = PrefixCache(PrefixStore(folder, identity, shape, budget))

    threading.Thread(target=ready, name="hearth-prompt-cache-digest", daemon=True).start()
