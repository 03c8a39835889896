"""Live memory accounting of a loaded model: measured weights (incl. bnb's quant_state), KV cache, device memory.

`MemoryMonitor.snapshot()` is built to be polled by the GUI during generation: the weights are measured once, the
KV cache is summed from tensor metadata (no device sync), and the parts that cost a syscall or a driver call (free
memory, RSS) are refreshed at most every `refresh_interval_s` (0.25 s: ~4x a second).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import torch

from app.core.memory import calibration
from app.core.memory.planner import KVLayout, device_free_bytes, kv_layout
from app.core.memory.types import DeviceMemory, MemorySnapshot
from app.core.models import bnb_cpu

# Returns a KVState (.cache, .ids), a transformers Cache, None, or a list of those (every cache the backend holds).
KVProvider = Callable[[], Any]


def _quant_state_tensors(module: torch.nn.Module) -> Iterator[torch.Tensor]:
    """bitsandbytes' per-layer side tensors, which model.get_memory_footprint() does not count."""
    weight = getattr(module, "weight", None)
    state = getattr(weight, "quant_state", None)
    if state is not None:  # Params4bit: absmax, NF4 code book, and with double quant the nested state + offset
        yield from (t for t in (state.absmax, state.code, getattr(state, "offset", None)) if t is not None)
        nested = getattr(state, "state2", None)
        if nested is not None:
            yield from (t for t in (nested.absmax, nested.code) if t is not None)
    scb = getattr(weight, "SCB", None)  # Int8Params: one fp32 scale per output row
    if isinstance(scb, torch.Tensor):
        yield scb
    matmul_state = getattr(module, "state", None)  # Linear8bitLt may keep its own CB/SCB references
    for name in ("CB", "SCB"):
        tensor = getattr(matmul_state, name, None)
        if isinstance(tensor, torch.Tensor):
            yield tensor


def measured_weights_by_device(model: torch.nn.Module) -> dict[str, int]:
    """Bytes of every parameter, buffer and bnb quant_state tensor, per device; shared tensors counted once. A q4
    model's embedding, left mapped from the weight file (resident only where read), is not among them: the rows a
    conversation touched show in the process's RSS, so in the overhead."""
    from app.core.fastpath.packed import MappedEmbedding

    seen: set[tuple[str, int]] = set()
    totals: dict[str, int] = defaultdict(int)
    for module in model.modules():
        if isinstance(module, MappedEmbedding):
            seen.add((str(module.weight.device), module.weight.data_ptr()))

    def add(tensor: torch.Tensor) -> None:
        if tensor.device.type == "meta" or tensor.numel() == 0:
            return
        key = (str(tensor.device), tensor.data_ptr())
        if key in seen:
            return
        seen.add(key)
        totals[str(tensor.device)] += tensor.numel() * tensor.element_size()

    for parameter in model.parameters():
        add(parameter)
    for buffer in model.buffers():
        add(buffer)
    for module in model.modules():
        for tensor in _quant_state_tensors(module):
            add(tensor)
    return dict(totals)


def _cache_of(held: Any) -> Any:
    return getattr(held, "cache", held) if held is not None and not hasattr(held, "layers") else held


def kv_bytes_by_device(held: Any) -> dict[str, int]:
    """Bytes of the cache's actual key/value tensors per device (metadata only: no sync, no copy)."""
    cache = _cache_of(held)
    totals: dict[str, int] = defaultdict(int)
    for layer in getattr(cache, "layers", None) or []:
        for tensor in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(tensor, torch.Tensor) and tensor.device.type != "meta":
                totals[str(tensor.device)] += tensor.numel() * tensor.element_size()
    return dict(totals)


def kv_tokens(held: Any) -> int:
    """Tokens in the cache: the KVState's id list, else the cache's own sequence length."""
    if held is None:
        return 0
    ids = getattr(held, "ids", None)
    if isinstance(ids, list):
        return len(ids)
    cache = _cache_of(held)
    if cache is None or not getattr(cache, "layers", None):
        return 0
    return int(cache.get_seq_length())


def model_kv_layout(model: Any) -> KVLayout:
    """The planner's KV layout for a loaded model, in the dtype its cache is kept in (a q4 model states it)."""
    from app.core.fastpath.packed import compute_dtype

    dtype = compute_dtype(model) or getattr(model, "dtype", torch.bfloat16)
    return kv_layout(model.config, torch.tensor([], dtype=dtype).element_size())


class MemoryMonitor:
    """Cheap, pollable memory snapshots of one loaded model and its KV cache (see module docstring)."""

    def __init__(
        self,
        loaded: Any,  # app.core.engines.loader.LoadedModel
        kv_provider: KVProvider,
        *,
        refresh_interval_s: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.loaded = loaded
        self.kv_provider = kv_provider
        self.refresh_interval_s = refresh_interval_s
        self.clock = clock
        self.device = str(loaded.device)
        self.weights_by_device = measured_weights_by_device(loaded.model)
        # Layers bnb will repack at their first forward change size then; watched until they all have.
        self._repack_pending = [m for m in loaded.model.modules() if bnb_cpu.will_repack(m)]
        self.layout = model_kv_layout(loaded.model)
        self._process = psutil.Process()
        self._slow: dict[str, tuple[int, int, int | None]] = {}  # device -> (free, total, rss)
        self._slow_at: float | None = None
        self.slow_refreshes = 0  # how often the slow parts were measured (tests and the GUI's own diagnostics)

    @property
    def devices(self) -> list[str]:
        names = set(self.weights_by_device) | {self.device}
        return sorted(names, key=lambda d: (d != self.device, d))

    def _refresh_slow(self, now: float) -> float:
        if self._slow_at is not None and now - self._slow_at < self.refresh_interval_s:
            return now - self._slow_at
        rss = int(self._process.memory_info().rss)
        values: dict[str, tuple[int, int, int | None]] = {}
        for device in self.devices:
            free, total = device_free_bytes(device)
            values[device] = (free, total, None if device.startswith("cuda") else rss)
        self._slow = values
        self._slow_at = now
        self.slow_refreshes += 1
        return 0.0

    def _remeasure_after_repack(self) -> None:
        pending = [m for m in self._repack_pending if bnb_cpu.will_repack(m)]
        if len(pending) < len(self._repack_pending):
            self.weights_by_device = measured_weights_by_device(self.loaded.model)
        self._repack_pending = pending

    def snapshot(self) -> MemorySnapshot:
        now = self.clock()
        age = self._refresh_slow(now)
        if self._repack_pending:  # a flag read per layer until bnb has repacked them all, then nothing
            self._remeasure_after_repack()
        held = self.kv_provider()
        every = list(held) if isinstance(held, (list, tuple)) else [held]
        kv_by_device: dict[str, int] = defaultdict(int)
        for one in every:
            for device_name, size in kv_bytes_by_device(one).items():
                kv_by_device[device_name] += size
        tokens = sum(kv_tokens(one) for one in every)
        devices: list[DeviceMemory] = []
        for device in self.devices:
            free, total, rss = self._slow[device]
            weights = self.weights_by_device.get(device, 0)
            kv = kv_by_device.get(device, 0)
            allocated = reserved = None
            if device.startswith("cuda"):
                # Host-side counters of the caching allocator: no device synchronisation.
                allocated = int(torch.cuda.memory_allocated(device))
                reserved = int(torch.cuda.memory_reserved(device))
                held_bytes = reserved
            else:
                held_bytes = rss or 0
            devices.append(
                DeviceMemory(
                    device=device,
                    weights_bytes=weights,
                    kv_bytes=kv,
                    overhead_bytes=max(0, held_bytes - weights - kv),
                    free_bytes=free,
                    total_bytes=total,
                    allocated_bytes=allocated,
                    reserved_bytes=reserved,
                    process_rss_bytes=rss,
                )
            )
        primary_free = self._slow[self.device][0]
        return MemorySnapshot(
            devices=tuple(devices),
            kv_bytes=sum(kv_by_device.values()),
            kv_tokens=tokens,
            forecast_kv_full_at_tokens=self.forecast(tokens, primary_free),
            kv_bytes_per_token=self.layout.bytes_per_token,
            taken_at=time.time(),
            details_age_s=age,
        )

    def forecast(self, tokens: int, free_bytes: int) -> int | None:
        """The cache size (tokens) at which growing from `tokens` uses up `free_bytes` (None: it never does).

        One layer's append copy and the small decode activations stay in reserve, as they are needed to grow.
        """
        reserve = calibration.ACTIVATION_FLOOR_BYTES + self.layout.largest_layer_at(max(tokens, 1))
        budget = free_bytes - reserve
        if budget <= 0:
            return tokens
        return self.layout.tokens_until(tokens, budget)
