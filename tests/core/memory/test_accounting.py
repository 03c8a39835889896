"""Live accounting: measured weights (with bnb's quant_state), KV from the cache's tensors, cheap snapshots."""

from __future__ import annotations

import pytest

from app.core.chat.events import ChatMessage
from app.core.chat.sampling import SamplingParams
from app.core.engines.backend import ReplyRequest
from app.core.engines.engine import Engine, KVState, kv_cache_bytes
from app.core.engines.loader import load_model
from app.core.memory.accounting import MemoryMonitor, kv_bytes_by_device, kv_tokens, measured_weights_by_device
from app.core.memory.planner import plan_memory
from tests.core.memory.conftest import CpuKind


class FakeClock:
    """Time the test controls, so the refresh logic is checked without sleeping or timing anything."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def tiny_nf4(tiny_model_dir):  # type: ignore[no-untyped-def]
    return load_model(str(tiny_model_dir("llama")), quantization="nf4", device="cpu", ignore_fit=True)


def _generate(loaded, kv: KVState, tokens: int = 12) -> None:  # type: ignore[no-untyped-def]
    engine = Engine(loaded)
    params = SamplingParams(temperature=0.0, max_new_tokens=tokens)
    for _ in engine.generate(ReplyRequest([ChatMessage("user", "Count to ten, please.")], params), kv=kv):
        pass


def test_measured_weights_include_quant_state(tiny_nf4) -> None:  # type: ignore[no-untyped-def]
    _generate(tiny_nf4, KVState(), tokens=1)  # bnb's layout after its first forward, whichever this CPU's is
    measured = measured_weights_by_device(tiny_nf4.model)["cpu"]
    footprint = tiny_nf4.model.get_memory_footprint()
    assert measured > footprint  # absmax, nested absmax and code books are not in get_memory_footprint()
    plan = plan_memory(tiny_nf4.folder, quantization="nf4", context=16, device="cpu", free_bytes=2**40)
    assert measured == plan.weights_bytes


@pytest.mark.parametrize("quant", ["nf4", "nf4-nodq"])
def test_monitor_follows_bnbs_first_use_repack_on_each_kind_of_cpu(
    tiny_model_dir, quant: str, bnb_cpu_kind: CpuKind
) -> None:
    folder = tiny_model_dir("llama-untied")
    loaded = load_model(str(folder), quantization=quant, device="cpu", ignore_fit=True)
    monitor = MemoryMonitor(loaded, lambda: None, clock=FakeClock())
    at_load = monitor.snapshot().devices[0].weights_bytes
    assert at_load == measured_weights_by_device(loaded.model)["cpu"]
    bnb_cpu_kind.first_use(loaded.model)
    after = monitor.snapshot().devices[0].weights_bytes  # same instant: the repack is noticed without a refresh
    assert monitor.slow_refreshes == 1
    assert after == measured_weights_by_device(loaded.model)["cpu"]
    plan = plan_memory(folder, quantization=quant, context=16, device="cpu", free_bytes=2**40)
    assert after == plan.weights_bytes
    assert (after != at_load) == bnb_cpu_kind.repacks  # tiny layers: the repacked layout is smaller
    assert monitor._repack_pending == []  # nothing left to watch: later snapshots do not walk the layers


def test_snapshot_after_generation_reports_the_real_cache(tiny_nf4) -> None:  # type: ignore[no-untyped-def]
    kv = KVState()
    monitor = MemoryMonitor(tiny_nf4, lambda: kv, clock=FakeClock())
    empty = monitor.snapshot()
    assert empty.kv_bytes == 0 and empty.kv_tokens == 0
    _generate(tiny_nf4, kv)
    snap = monitor.snapshot()
    assert snap.kv_bytes == kv_cache_bytes(kv.cache) > 0
    assert snap.kv_tokens == len(kv.ids) == kv.cache.get_seq_length()
    assert snap.kv_bytes == snap.kv_tokens * snap.kv_bytes_per_token  # llama: no sliding window
    cpu = snap.devices[0]
    assert cpu.device == "cpu"
    assert cpu.weights_bytes == measured_weights_by_device(tiny_nf4.model)["cpu"]
    assert cpu.process_rss_bytes is not None and cpu.process_rss_bytes > cpu.weights_bytes
    assert cpu.allocated_bytes is None and cpu.reserved_bytes is None
    assert 0 < cpu.free_bytes <= cpu.total_bytes
    assert snap.to_json_dict()["weights_bytes"] == cpu.weights_bytes


def test_the_backend_reports_the_accountings_rows_whole(tiny_nf4) -> None:  # type: ignore[no-untyped-def]
    from app.core.engines.local import EngineBackend
    from app.core.memory.accounting import model_kv_layout

    backend = EngineBackend(tiny_nf4)
    try:
        reading = backend.memory()
        fallback = backend._fallback_memory()  # what the panel shows if the accounting fails
    finally:
        backend.close()
    cpu = reading.devices[0]
    # One DeviceMemory type from the accounting to the panel: the details are not dropped on the way.
    assert cpu.device == "cpu" and cpu.total_bytes and cpu.process_rss_bytes
    assert cpu.used_bytes == cpu.weights_bytes + cpu.kv_bytes + cpu.overhead_bytes
    assert fallback.devices[0].total_bytes == cpu.total_bytes
    # One KV size: the monitor, the fallback and the planner's layout agree.
    per_token = model_kv_layout(tiny_nf4.model).bytes_per_token
    assert reading.kv_bytes_per_token == fallback.kv_bytes_per_token == per_token > 0


def test_slow_parts_refresh_at_most_every_interval(tiny_nf4) -> None:  # type: ignore[no-untyped-def]
    clock = FakeClock()
    kv = KVState()
    monitor = MemoryMonitor(tiny_nf4, lambda: kv, refresh_interval_s=0.25, clock=clock)
    for _ in range(50):
        monitor.snapshot()
    assert monitor.slow_refreshes == 1
    clock.now += 0.1
    assert monitor.snapshot().details_age_s == pytest.approx(0.1)
    assert monitor.slow_refreshes == 1
    clock.now += 0.2
    monitor.snapshot()
    assert monitor.slow_refreshes == 2
    # The KV cache is read on every snapshot, even between refreshes.
    _generate(tiny_nf4, kv, tokens=4)
    assert monitor.snapshot().kv_bytes == kv_cache_bytes(kv.cache)
    assert monitor.slow_refreshes == 2


def test_forecast_is_where_the_cache_uses_up_free_memory(tiny_nf4) -> None:  # type: ignore[no-untyped-def]
    from app.core.memory import calibration

    monitor = MemoryMonitor(tiny_nf4, lambda: None, clock=FakeClock())
    layout = monitor.layout
    free = 64 * 2**20
    at = monitor.forecast(100, free)
    assert at is not None and at > 100
    # One layer's append copy and the decode activations stay in reserve; the rest is what the cache may grow by.
    budget = free - calibration.ACTIVATION_FLOOR_BYTES - layout.largest_layer_at(100)
    assert layout.bytes_at(at) - layout.bytes_at(100) <= budget < layout.bytes_at(at + 1) - layout.bytes_at(100)
    # Less free memory: the cache fills sooner; none at all: it is full now.
    sooner = monitor.forecast(100, free // 2)
    assert sooner is not None and 100 < sooner < at
    assert monitor.forecast(100, 0) == 100


def test_forecast_is_none_when_every_layer_is_windowed(tiny_model_dir) -> None:
    loaded = load_model(str(tiny_model_dir("mistral")), quantization="bf16", device="cpu", ignore_fit=True)
    monitor = MemoryMonitor(loaded, lambda: None, clock=FakeClock())
    assert monitor.forecast(0, 64 * 2**20) is None  # the window (64 tokens) caps the cache far below that
    assert monitor.forecast(0, 1) == 0


def test_kv_helpers_accept_a_cache_or_nothing(tiny_nf4) -> None:  # type: ignore[no-untyped-def]
    assert kv_bytes_by_device(None) == {} and kv_tokens(None) == 0
    kv = KVState()
    _generate(tiny_nf4, kv, tokens=3)
    assert kv_bytes_by_device(kv.cache) == kv_bytes_by_device(kv) == {"cpu": kv_cache_bytes(kv.cache)}
    assert kv_tokens(kv.cache) == kv_tokens(kv) == len(kv.ids)
