"""The torch-free chat backend, and when a load can take it.

A q4 model on the CPU whose packed copy is cached (written by its first load through torch) runs without torch:
`open_lite_backend` returns a LiteBackend, or the reason it can't, and the caller (app.core.engines.opening) then
loads through torch as before. What needs torch stays there: models whose code or tokenizer only transformers' auto
classes load, and every GPU.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from app.core.chat.events import Event
from app.core.chat.response_cache import ResponseCache
from app.core.engines.backend import (
    CPU_NOTICE,
    LoadRequest,
    MemoryReading,
    ModelInfo,
    ProgressCallback,
    ReplyRequest,
)
from app.core.engines.kv_pool import POOL_MEMORY_SHARE, ConversationCaches, PrefixKVPool, pool_size
from app.core.engines.lite.engine import LiteEngine, load_tokenizer
from app.core.engines.lite.runtime import PREFILL_CHUNK, LiteConfig, LiteUnavailable, open_model, packed_copy
from app.core.errors import HearthError, LoadCancelled
from app.core.fastpath.packed_cache import torch_version
from app.core.memory.fit import window_that_fits
from app.core.memory.types import DeviceMemory, MemoryPlan
from app.core.models import gguf_cache
from app.core.models.model_source import ModelSource, check_folder_weights, resolve_model, weights_fingerprint

log = logging.getLogger(__name__)

RUNTIME_ENV = "HEARTH_RUNTIME"  # "auto" (torch-free where it can run), "torch" (never), "lite" (refuse otherwise)
RUNTIME_CHOICES = ("auto", "torch", "lite")
RUNTIME_FLOOR_BYTES = 64 << 20  # the interpreter, numpy and the tokenizer before any weight (~45 MiB measured)


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
    """A load the torch-free runtime can take, as far as can be told without opening it."""

    source: ModelSource
    folder: Path
    packed: Path  # the cached packed copy (checked when it is opened)
    notices: tuple[str, ...]


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
            folder = gguf_cache.converted_folder_for(source.path)
            if not gguf_cache.is_converted(folder) or gguf_cache.converted_damage(folder):
                return "the GGUF file is not converted yet"
        else:
            folder = source.path
            if check_folder_weights(folder, allow_pickle=False)[0].suffix != ".safetensors":
                return "the weights are not safetensors"
    except HearthError as exc:
        return f"the model could not be resolved here ({exc})"
    try:
        packed = packed_copy(folder)
    except LiteUnavailable as exc:
        return str(exc)
    return LiteCandidate(source, folder, packed, notices)


def lite_plan(request: LoadRequest) -> MemoryPlan | str:
    """The memory plan of the torch-free runtime for this request (what the window shows before loading), read from
    the config and the packed copy's size without opening the model; else why the runtime would not take it."""
    candidate = lite_candidate(request)
    if isinstance(candidate, str):
        return candidate
    try:
        config = LiteConfig.read(candidate.folder)
        weights = config.weight_bytes(candidate.packed.stat().st_size)
    except (LiteUnavailable, OSError) as exc:
        return str(exc)
    window = min(config.context_window, request.context_length or config.context_window)
    return memory_plan(candidate.source.display_name, config, weights, window)


def memory_plan(name: str, config: LiteConfig, weights: int, window: int) -> MemoryPlan:
    """The planner's plan for this runtime's own figures: the packed copy (and norms), a bf16 KV cache, one prefill
    chunk's activations and the runtime's floor, against the memory available now."""
    free = int(psutil.virtual_memory().available)
    per_token = config.kv_bytes_per_token
    activations = PREFILL_CHUNK * (2 * config.inter + 3 * config.hidden + config.heads * config.head_dim) * 4 * 3
    runtime = RUNTIME_FLOOR_BYTES
    fixed = weights + activations + runtime
    room = int(min(max(0, (free - fixed) // per_token), config.context_window))
    total = fixed + per_token * window
    return MemoryPlan(
        model=name,
        model_type="llama",
        quantization="q4",
        device="cpu",
        context=window,
        model_max_context=config.context_window,
        parameters=0,
        quantized_parameters=0,
        weights_bytes=weights,
        weights_by_device={"cpu": weights},
        kv_bytes_per_token=per_token,
        kv_bytes_per_token_long=per_token,
        kv_bytes=per_token * window,
        kv_dtype="bf16",
        kv_layers=config.layers,
        kv_sliding_layers=0,
        overhead_bytes=activations + runtime,
        overhead={"prefill activations": activations, "runtime (Python, numpy, tokenizer)": runtime},
        total_bytes=total,
        free_bytes=free,
        free_source="measured",
        free_after_bytes=free - total,
        fits="yes" if total <= free else "no",
        max_context=room,
        notes=("torch-free runtime: the packed Q4_1 copy, mapped",),
    )


def open_lite_backend(
    request: LoadRequest, progress: ProgressCallback | None = None, cancel: threading.Event | None = None
) -> LiteBackend | str:
    """The request's model on the torch-free runtime, or why not (a sentence: the caller loads through torch)."""
    started = time.perf_counter()
    candidate = lite_candidate(request)
    if isinstance(candidate, str):
        return candidate
    source, folder, notices = candidate.source, candidate.folder, list(candidate.notices)
    if progress is not None:
        progress(f"Opening {source.display_name} (torch-free runtime)…", 0.1)
    recovered: list[str] = []
    try:
        model = open_model(folder, recovered, packed=candidate.packed)
        tokenizer = load_tokenizer(folder)
    except LiteUnavailable as exc:
        return str(exc)
    except (OSError, ValueError) as exc:
        return f"its files could not be read ({exc})"
    if cancel is not None and cancel.is_set():
        model.close()
        raise LoadCancelled()
    window = model.config.context_window
    if request.context_length:
        window = min(window, request.context_length)
    if not request.ignore_fit:
        plan = memory_plan(source.display_name, model.config, model.weight_bytes, window)
        try:
            window = window_that_fits(plan, request.context_length is not None, notices) or window
        except HearthError:
            model.close()
            raise
    engine = LiteEngine(
        model,
        tokenizer,
        model_id=source.repo_id or str(source.path),
        display_name=source.display_name,
        context_window=window,
        weights_fingerprint=weights_fingerprint(folder),
        packed_digest=model.packed_sha256,
        response_cache=ResponseCache() if request.response_cache else None,
    )
    if progress is not None:
        progress("Ready", 1.0)
    info = ModelInfo(
        name=source.display_name,
        quantization="q4",
        device="cpu",
        context_window=window,
        load_seconds=time.perf_counter() - started,
        notices=tuple(notices),
        recovered=(*recovered, *engine.recovery_notices()),
        tokenizer_file=str(folder / "tokenizer.json") if (folder / "tokenizer.json").is_file() else None,
    )
    return LiteBackend(engine, info)


class LiteBackend:
    """A ChatBackend over the torch-free engine, its caches kept as the torch backend keeps its own: one per
    conversation (the active one), and for requests that name none a prefix pool sized to a share of the memory
    free at load (app.core.engines.kv_pool)."""

    def __init__(self, engine: LiteEngine, info: ModelInfo) -> None:
        self.engine = engine
        self.info = info
        self._caches = ConversationCaches(engine.new_kv)
        budget = int(psutil.virtual_memory().available * POOL_MEMORY_SHARE)
        self._pool = PrefixKVPool(
            pool_size(budget, engine.model.config.kv_bytes_per_token, info.context_window), engine.new_kv
        )
        self._process = psutil.Process()

    def generate(self, request: ReplyRequest, cancel: threading.Event) -> Iterator[Event]:
        prompt = self.engine.prepare(request)  # the user's errors raise here, before any event
        conversation = request.conversation_id
        kv = self._pool.take(prompt.ids) if conversation is None else self._caches.take(conversation)
        return self.engine.generate_prepared(prompt, request, kv=kv, cancel=cancel)

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
        return MemoryReading((device,), per_token, kv_tokens + int(memory.available) // per_token)

    def forget(self, conversation_id: int) -> None:
        self._caches.forget(conversation_id)

    def close(self) -> None:
        self._caches.clear()
        self._pool.clear()
        self.engine.close()
