"""The real chat backend: a loaded model, its Engine, and one KV cache per conversation.

Imports torch at module top: only the GUI's worker thread imports it, after the window has painted.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import psutil
import torch

from app.core.backend import DeviceMemory, LoadRequest, MemoryReading, ModelInfo, ProgressCallback
from app.core.engine import Engine, KVState
from app.core.events import ChatMessage, Event
from app.core.loader import LoadedModel, load_model
from app.core.response_cache import ResponseCache
from app.core.sampling import SamplingParams

log = logging.getLogger(__name__)

# Only the active conversation keeps its KV cache: the memory panel then shows every byte the caches hold.
# Switching conversations prefills the other one again.
MAX_KEPT_CACHES = 1


class EngineBackend:
    def __init__(self, loaded: LoadedModel, response_cache: ResponseCache | None = None) -> None:
        self.loaded = loaded
        self.engine = Engine(loaded, response_cache=response_cache)
        self.info = ModelInfo(
            name=loaded.display_name,
            quantization=loaded.quantization,
            device=loaded.device,
            context_window=loaded.context_window,
            load_seconds=loaded.load_seconds,
            notices=tuple(loaded.notices),
            recovered=(*loaded.recovered, *self.engine.recovery_notices()),
            tokenizer_file=str(loaded.folder / "tokenizer.json")
            if (loaded.folder / "tokenizer.json").is_file()
            else None,
        )
        self._caches: dict[int, KVState] = {}
        self._active: int | None = None
        self._monitor = _memory_monitor(loaded, self._active_kv)

    def _active_kv(self) -> KVState | None:
        return self._caches.get(self._active) if self._active is not None else None

    def _kv_for(self, conversation_id: int) -> KVState:
        kv = self._caches.pop(conversation_id, None) or KVState()
        self._caches[conversation_id] = kv  # most recently used last
        while len(self._caches) > MAX_KEPT_CACHES:
            oldest = next(iter(self._caches))
            self._caches.pop(oldest).reset()
        return kv

    def generate(
        self,
        conversation_id: int,
        messages: Sequence[ChatMessage],
        params: SamplingParams,
        *,
        cancel: threading.Event,
        assistant_prefix: str = "",
        context_policy: str = "error",
        use_response_cache: bool = True,
    ) -> Iterator[Event]:
        self._active = conversation_id
        kv = self._kv_for(conversation_id)
        # Engine.generate is a generator: run its prompt checks now so user errors raise before the first event.
        self.engine.prepare_prompt(list(messages), assistant_prefix=assistant_prefix, context_policy=context_policy)
        return self.engine.generate(
            list(messages),
            params,
            kv=kv,
            cancel=cancel,
            assistant_prefix=assistant_prefix,
            context_policy=context_policy,
            use_response_cache=use_response_cache,
        )

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
        kv_bytes = sum(kv.nbytes() for kv in self._caches.values())
        kv_tokens = sum(len(kv.ids) for kv in self._caches.values())
        per_token = kv_bytes // kv_tokens if kv_tokens else _kv_bytes_per_token(self.loaded)
        devices: list[DeviceMemory] = []
        by_device: dict[str, int] = {}
        for placement in self.loaded.placements:
            by_device[placement.device] = by_device.get(placement.device, 0) + placement.parameter_bytes
        if not by_device:
            by_device[self.loaded.device] = 0
        for device, weights in by_device.items():
            kv_here = kv_bytes if device == self.loaded.device else 0
            if device.startswith("cuda"):
                free, _total = torch.cuda.mem_get_info(torch.device(device))
                overhead = max(int(torch.cuda.memory_reserved(torch.device(device))) - weights - kv_here, 0)
            else:
                free = int(psutil.virtual_memory().available)
                overhead = max(int(psutil.Process().memory_info().rss) - weights - kv_here, 0)
            devices.append(DeviceMemory(device, weights, kv_here, overhead, int(free)))
        main = next((d for d in devices if d.device == self.loaded.device), devices[0])
        forecast = (kv_tokens + main.free_bytes // per_token) if per_token else None
        return MemoryReading(tuple(devices), kv_bytes_per_token=per_token, forecast_kv_full_at_tokens=forecast)

    def forget(self, conversation_id: int) -> None:
        kv = self._caches.pop(conversation_id, None)
        if kv is not None:
            kv.reset()

    def close(self) -> None:
        """Drop this backend's references to the model (never mutating the LoadedModel, which others may share),
        then hand cached GPU memory back to the driver."""
        for kv in self._caches.values():
            kv.reset()
        self._caches.clear()
        del self.engine, self.loaded, self._monitor
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _kv_bytes_per_token(loaded: LoadedModel) -> int:
    config = getattr(loaded.model, "config", None)
    if config is None:
        return 0
    layers = int(getattr(config, "num_hidden_layers", 0) or 0)
    heads = int(getattr(config, "num_key_value_heads", 0) or getattr(config, "num_attention_heads", 0) or 0)
    head_dim = getattr(config, "head_dim", None) or (
        int(getattr(config, "hidden_size", 0) or 0) // max(int(getattr(config, "num_attention_heads", 1) or 1), 1)
    )
    element = 2 if loaded.quantization in ("bf16", "fp16", "nf4", "nf4-nodq", "int8", "q4") else 4
    return 2 * layers * heads * int(head_dim) * element


def _memory_monitor(loaded: LoadedModel, kv_provider: Any) -> Any:
    """The memory issue's live accounting, when that module is present."""
    try:
        from app.core.memory.accounting import MemoryMonitor
    except ImportError:
        return None
    try:
        return MemoryMonitor(loaded, kv_provider)
    except Exception:
        log.exception("memory monitor could not start; using the fallback accounting")
        return None


def _reading_from_snapshot(snapshot: Any) -> MemoryReading:
    """Adapt the accounting's MemorySnapshot (one device or several) to the panel's plain data."""
    items = getattr(snapshot, "devices", None) or [snapshot]
    devices = tuple(
        DeviceMemory(
            device=str(getattr(item, "device", "device")),
            weights_bytes=int(getattr(item, "weights_bytes", 0) or 0),
            kv_bytes=int(getattr(item, "kv_bytes", 0) or 0),
            overhead_bytes=int(getattr(item, "overhead_bytes", 0) or 0),
            free_bytes=int(getattr(item, "free_bytes", 0) or 0),
        )
        for item in items
    )
    forecast = getattr(snapshot, "forecast_kv_full_at_tokens", None)
    per_token = getattr(snapshot, "kv_bytes_per_token", 0) or 0
    return MemoryReading(devices, int(per_token), int(forecast) if forecast is not None else None)


def load_engine_backend(request: LoadRequest, progress: ProgressCallback, cancel: threading.Event) -> EngineBackend:
    """The default backend factory the GUI's worker uses."""
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
