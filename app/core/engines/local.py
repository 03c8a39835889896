"""The real chat backend: a loaded model, its Engine, and one KV cache per conversation.

Imports torch at module top: only the GUI's worker thread imports it, after the window has painted.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Iterator
from typing import Any

import psutil
import torch

from app.core.chat.events import Event
from app.core.chat.response_cache import ResponseCache
from app.core.engines.backend import LoadRequest, MemoryReading, ModelInfo, ProgressCallback, ReplyRequest
from app.core.engines.engine import Engine, KVState
from app.core.engines.kv_pool import POOL_MEMORY_SHARE, ConversationCaches, PrefixKVPool, pool_size
from app.core.engines.loader import LoadedModel, load_model
from app.core.errors import HearthError
from app.core.memory.accounting import MemoryMonitor, model_kv_layout
from app.core.memory.types import DeviceMemory, MemorySnapshot
from app.core.models.gguf_tokenizer import gguf_tokenizer_file

log = logging.getLogger(__name__)


class EngineBackend:
    def __init__(self, loaded: LoadedModel, response_cache: ResponseCache | None = None) -> None:
        self._attach(Engine(loaded, response_cache=response_cache))

    def _attach(self, engine: Engine) -> None:
        loaded = engine.loaded
        self.loaded = loaded
        self.engine = engine
        rewritten: list[str] = []
        tokenizer_file = _tokenizer_file(loaded, rewritten)
        self.info = ModelInfo(
            name=loaded.display_name,
            quantization=loaded.quantization,
            device=loaded.device,
            context_window=loaded.context_window,
            load_seconds=loaded.load_seconds,
            notices=tuple(loaded.notices),
            recovered=(*loaded.recovered, *self.engine.recovery_notices(), *rewritten),
            tokenizer_file=tokenizer_file,
        )
        self._caches = ConversationCaches(KVState)
        # The memory planner's KV bytes per token; a full-window cache each, as many as a share of free memory holds.
        budget = int(_free_bytes(loaded) * POOL_MEMORY_SHARE)
        self._pool = PrefixKVPool(pool_size(budget, _kv_bytes_per_token(loaded.model), loaded.context_window), KVState)
        # Every cache held counts (the window's conversation and the API clients' pool): the panel shows them all.
        self._monitor = _memory_monitor(loaded, self._all_caches)

    def _all_caches(self) -> list[KVState]:
        return [*self._caches.values(), *self._pool.states()]

    @classmethod
    def wrap(cls, engine: Engine) -> EngineBackend:
        """A backend around an Engine that already exists (the command line's and the tests' shared model)."""
        backend = cls.__new__(cls)
        backend._attach(engine)
        return backend

    def generate(self, request: ReplyRequest, cancel: threading.Event) -> Iterator[Event]:
        # Tokenize once, now, so the user's errors raise before the first event.
        prompt = self.engine.prepare(request)
        # An API client resending its conversation names none: it gets the pool's best-matching cache.
        conversation = request.conversation_id
        kv = self._pool.take(prompt.ids) if conversation is None else self._caches.take(conversation)
        return self.engine.generate_prepared(prompt, request, kv=kv, cancel=cancel)

    def compile_grammar(self, request: ReplyRequest) -> None:
        """The request's grammar compiled now, off the model's thread (the server's compile thread)."""
        self.engine.compile_grammar(request)

    def count_tokens(self, text: str) -> int:
        return self.engine.count_tokens(text) if text else 0

    def memory(self) -> MemoryReading:
        if self._monitor is not None:
            try:
                return _reading_from_snapshot(self._monitor.snapshot())
            except Exception:  # the planner's accounting is optional here; fall back to our own numbers
                log.exception("memory monitor failed; using the fallback accounting")
                self._monitor = None
        return self._fallback_memory()

    def _fallback_memory(self) -> MemoryReading:
        kv_bytes = sum(kv.nbytes() for kv in self._all_caches())
        kv_tokens = sum(len(kv.ids) for kv in self._all_caches())
        per_token = kv_bytes // kv_tokens if kv_tokens else _kv_bytes_per_token(self.loaded.model)
        devices: list[DeviceMemory] = []
        by_device: dict[str, int] = {}
        for placement in self.loaded.placements:
            by_device[placement.device] = by_device.get(placement.device, 0) + placement.parameter_bytes
        if not by_device:
            by_device[self.loaded.device] = 0
        for device, weights in by_device.items():
            kv_here = kv_bytes if device == self.loaded.device else 0
            if device.startswith("cuda"):
                free, total = torch.cuda.mem_get_info(torch.device(device))
                overhead = max(int(torch.cuda.memory_reserved(torch.device(device))) - weights - kv_here, 0)
            else:
                memory = psutil.virtual_memory()
                free, total = memory.available, memory.total
                overhead = max(int(psutil.Process().memory_info().rss) - weights - kv_here, 0)
            devices.append(DeviceMemory(device, weights, kv_here, overhead, int(free), total_bytes=int(total)))
        main = next((d for d in devices if d.device == self.loaded.device), devices[0])
        forecast = (kv_tokens + main.free_bytes // per_token) if per_token else None
        return MemoryReading(tuple(devices), kv_bytes_per_token=per_token, forecast_kv_full_at_tokens=forecast)

    def forget(self, conversation_id: int) -> None:
        self._caches.forget(conversation_id)

    def close(self) -> None:
        """Drop this backend's references to the model (never mutating the LoadedModel, which others may share),
        then hand cached GPU memory back to the driver."""
        self._caches.clear()
        self._pool.clear()
        del self.engine, self.loaded, self._monitor
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _tokenizer_file(loaded: LoadedModel, notices: list[str]) -> str | None:
    """A tokenizer.json for the window's torch-free token counts: the folder's own, or for a GGUF model one written
    once from its header into the cache (a damaged copy is rewritten, with a line in `notices`); None where there is
    none (the window then shows no counts)."""
    if loaded.folder.is_dir():
        found = loaded.folder / "tokenizer.json"
        return str(found) if found.is_file() else None
    try:
        return str(gguf_tokenizer_file(loaded.folder, loaded.tokenizer, notices))
    except (OSError, HearthError, AttributeError) as exc:
        log.warning("no tokenizer.json for token counts: %s", exc)
        return None


def _free_bytes(loaded: LoadedModel) -> int:
    """Memory free on the model's device now (the pool's budget is a share of it)."""
    try:
        if loaded.device.startswith("cuda"):
            free, _total = torch.cuda.mem_get_info(torch.device(loaded.device))
            return int(free)
        return int(psutil.virtual_memory().available)
    except Exception:  # no reading: room for one cache
        return 0


def _kv_bytes_per_token(model: Any) -> int:
    """The planner's figure (0 for a model it cannot lay out: the panel then shows no forecast)."""
    try:
        return model_kv_layout(model).bytes_per_token
    except (AttributeError, TypeError, ValueError, KeyError, ZeroDivisionError):
        return 0


def _memory_monitor(loaded: LoadedModel, kv_provider: Any) -> MemoryMonitor | None:
    """The live accounting; None (the fallback numbers) if it cannot measure this model."""
    try:
        return MemoryMonitor(loaded, kv_provider)
    except Exception:
        log.exception("memory monitor could not start; using the fallback accounting")
        return None


def _reading_from_snapshot(snapshot: MemorySnapshot) -> MemoryReading:
    """The accounting's snapshot as the panel's reading (the same DeviceMemory rows)."""
    return MemoryReading(snapshot.devices, snapshot.kv_bytes_per_token, snapshot.forecast_kv_full_at_tokens)


def open_engine_backend(
    request: LoadRequest, progress: ProgressCallback | None = None, cancel: threading.Event | None = None
) -> EngineBackend:
    """Load the request's (local) model through torch and wrap it with its engine (app.core.engines.opening decides
    when)."""
    loaded = load_model(
        request.model,
        quantization=request.quantization,
        device=request.device,
        context_length=request.context_length,
        allow_pickle=request.allow_pickle,
        trust_remote_code=request.trust_remote_code,
        ignore_fit=request.ignore_fit,
        progress=progress,
        cancel=cancel,
    )
    cache = ResponseCache() if request.response_cache else None
    return EngineBackend(loaded, response_cache=cache)
