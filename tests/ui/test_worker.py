"""The worker thread on its own: queued signals carrying plain data, cancel per token, clean shutdown."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QObject, QThread, Signal, Slot

from app.core.chat.events import ChatMessage, ReplyStats
from app.core.engines.backend import ContextUsage, ModelInfo, ReplyRequest, ScriptedBackend, scripted_factory
from app.ui.worker import GenerateRequest, WorkerHost


class Relay(QObject):
    """Receives the worker's signals in the GUI thread, as the window does (a plain lambda connected to a
    cross-thread signal would run in the worker thread under PySide6), and records what arrived where."""

    loaded = Signal(object)
    finished = Signal(int, str, str, str)
    failed = Signal(int, str)
    plan_failed = Signal(str)
    token_seen = Signal()

    def __init__(self, host: WorkerHost) -> None:
        super().__init__()
        self.received: list[object] = []
        self.threads: set[object] = set()
        worker = host.worker
        worker.model_loaded.connect(self.on_loaded)
        worker.token.connect(self.on_token)
        worker.stats.connect(self.on_data)
        worker.context.connect(self.on_data)
        worker.finished.connect(self.on_finished)
        worker.failed.connect(self.on_failed)
        worker.plan_failed.connect(self.on_plan_failed)

    @Slot(object)
    def on_loaded(self, info: object) -> None:
        self.loaded.emit(info)

    @Slot(int, str, int)
    def on_token(self, rid: int, text: str, count: int) -> None:
        self.threads.add(QThread.currentThread())
        self.received.append(text)
        self.token_seen.emit()

    @Slot(int, object)
    def on_data(self, rid: int, data: object) -> None:
        self.received.append(data)

    @Slot(int, str, str, str)
    def on_finished(self, rid: int, reason: str, text: str, error: str) -> None:
        self.finished.emit(rid, reason, text, error)

    @Slot(int, str)
    def on_failed(self, rid: int, message: str) -> None:
        self.failed.emit(rid, message)

    @Slot(str)
    def on_plan_failed(self, message: str) -> None:
        self.plan_failed.emit(message)


def make_request(host: WorkerHost, text: str = "hi") -> GenerateRequest:
    return GenerateRequest(host.next_request_id(), ReplyRequest((ChatMessage("user", text),), conversation_id=1))


def load(host: WorkerHost, relay: Relay, qtbot) -> ModelInfo:  # type: ignore[no-untyped-def]
    from app.core.engines.backend import LoadRequest

    with qtbot.waitSignal(relay.loaded, timeout=5000) as blocker:
        host.load(LoadRequest(None))
    return blocker.args[0]


def test_worker_streams_plain_data_from_its_own_thread(qtbot) -> None:
    host = WorkerHost(scripted_factory(ScriptedBackend(replies=["one two three"])))
    relay = Relay(host)
    try:
        info = load(host, relay, qtbot)
        assert isinstance(info, ModelInfo)
        received = relay.received
        with qtbot.waitSignal(relay.finished, timeout=5000) as blocker:
            host.generate(make_request(host))
        _rid, reason, text, error = blocker.args
        assert (reason, text, error) == ("stop", "one two three", "")
        assert "".join(r for r in received if isinstance(r, str)) == "one two three"
        assert any(isinstance(r, ReplyStats) for r in received)
        assert any(isinstance(r, ContextUsage) for r in received)
        assert host.worker.thread() is host.worker_thread and host.worker_thread is not QThread.currentThread()
        assert relay.threads == {QThread.currentThread()}  # queued: delivered in the GUI thread
    finally:
        assert host.shutdown()
    assert not host.worker_thread.isRunning()


def test_cancel_is_checked_per_token(qtbot) -> None:
    backend = ScriptedBackend(replies=[" ".join(["w"] * 2000)], tokens_per_s=500)
    host = WorkerHost(scripted_factory(backend))
    relay = Relay(host)
    try:
        load(host, relay, qtbot)
        request = make_request(host)
        with qtbot.waitSignal(relay.finished, timeout=10_000) as blocker:
            with qtbot.waitSignal(relay.token_seen, timeout=5000):
                host.generate(request)
            host.cancel_generation()
        assert blocker.args[1] == "cancelled"
        assert 0 < len(blocker.args[2].split()) < 2000
    finally:
        host.shutdown()


def test_generate_without_a_model_fails_with_a_message(qtbot) -> None:
    host = WorkerHost(scripted_factory(ScriptedBackend()))
    relay = Relay(host)
    try:
        with qtbot.waitSignal(relay.failed, timeout=5000) as blocker:
            host.generate(make_request(host))
        assert blocker.args[1] == "No model is loaded: load one from the model bar first."
    finally:
        host.shutdown()


def test_shutdown_mid_generation_stops_the_thread(qtbot) -> None:
    backend = ScriptedBackend(replies=[" ".join(["w"] * 5000)], tokens_per_s=200)
    host = WorkerHost(scripted_factory(backend))
    relay = Relay(host)
    load(host, relay, qtbot)
    with qtbot.waitSignal(relay.token_seen, timeout=5000):
        host.generate(make_request(host))
    assert host.shutdown(timeout_ms=5000)
    assert not host.worker_thread.isRunning()


def test_planner_errors_and_missing_planner_are_reported(qtbot) -> None:
    from app.core.engines.backend import LoadRequest
    from app.core.errors import ModelNotFoundError

    def failing(request: LoadRequest) -> object:
        raise ModelNotFoundError("No model at /nope.")

    def missing(request: LoadRequest) -> object:
        raise ImportError("no planner")

    for planner, expected in ((failing, "No model at /nope."), (missing, "The memory planner is not available")):
        host = WorkerHost(scripted_factory(ScriptedBackend()), planner)
        relay = Relay(host)
        try:
            with qtbot.waitSignal(relay.plan_failed, timeout=5000) as blocker:
                host.plan(LoadRequest(None))
            assert blocker.args[0].startswith(expected)
        finally:
            host.shutdown()


def test_the_window_plans_a_torch_free_load_with_the_runtime_s_own_figures(monkeypatch: pytest.MonkeyPatch) -> None:
    """Choosing a model the torch-free runtime will run shows that runtime's plan, not the torch loader's."""
    from app.core.engines.backend import LoadRequest
    from app.core.engines.lite.backend import lite_plan
    from app.ui.worker import default_planner

    request = LoadRequest(None, device="cpu")
    shown, expected = default_planner(request), lite_plan(request)
    assert not isinstance(expected, str)
    assert shown.notes[0] == expected.notes[0] == "torch-free runtime: the GGUF file's Q4_1 blocks, mapped"
    assert shown.notes[1].startswith("served (`hearth serve`): replies decoded together reserve at most")
    assert shown.weights_bytes == expected.weights_bytes
    monkeypatch.setenv("HEARTH_RUNTIME", "torch")
    assert not any("torch-free" in note for note in default_planner(request).notes)
