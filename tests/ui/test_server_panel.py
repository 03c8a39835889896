"""The window's Server switch: the official openai client over real HTTP on 127.0.0.1, real widgets, one queue."""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import openai
import pytest
from PySide6.QtCore import QThread
from PySide6.QtWidgets import QApplication

from app.core.chat.events import ChatMessage, DoneEvent, Event
from app.core.chat.sampling import SamplingParams
from app.core.engines.backend import LoadRequest, ModelInfo, ReplyRequest, ScriptedBackend
from app.core.engines.local import EngineBackend
from app.core.server.queue import End, QueueFullError
from app.core.settings import Settings
from app.ui.server_panel import ServerPanel, capacity_text
from app.ui.serving import (
    NO_MODEL_MESSAGE,
    NO_SERVER_LIBRARIES_MESSAGE,
    WindowServer,
    port_in_use_message,
)

HELLO = [{"role": "user", "content": "Hi"}]
SERVER_THREADS = ("hearth-server-http", "hearth-server-model")


class ThreadRecordingBackend(ScriptedBackend):
    """A scripted backend that notes which thread called generate and forget. With `gate`, the first reply holds
    after its first token until the gate opens (or it is cancelled): the test decides when it ends, not the clock."""

    def __init__(self, gate: threading.Event | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.gate = gate
        self.threads: list[str] = []
        self.forgotten: list[tuple[int, str]] = []

    def generate(self, request: ReplyRequest, cancel: threading.Event) -> Iterator[Event]:
        self.threads.append(thread_name())
        events = super().generate(request, cancel)
        if self.gate is None or len(self.threads) > 1:
            return events
        return self._held(events, self.gate, cancel)

    @staticmethod
    def _held(events: Iterator[Event], gate: threading.Event, cancel: threading.Event) -> Iterator[Event]:
        for event in events:
            yield event
            if event.type == "token":
                while not gate.is_set() and not cancel.is_set():
                    gate.wait(0.01)

    def forget(self, conversation_id: int) -> None:
        self.forgotten.append((conversation_id, thread_name()))
        super().forget(conversation_id)


def thread_name() -> str:
    """The worker's QThread by its object name, the server's Python threads by theirs."""
    return QThread.currentThread().objectName() or threading.current_thread().name


@pytest.fixture(autouse=True)
def no_server_threads_left() -> Iterator[None]:
    yield
    left = [t.name for t in threading.enumerate() if t.name in SERVER_THREADS]
    assert not left, f"server threads left running: {left}"


def switch_on(qtbot: Any, panel: ServerPanel, port: int = 0) -> str:
    panel.port.setValue(port)
    with qtbot.waitSignal(panel.state_changed, timeout=30_000, check_params_cb=lambda s: s in ("on", "off")):
        panel.switch.click()
    return panel.address.text()


def client(address: str) -> Any:
    return openai.OpenAI(base_url=address, api_key="none", max_retries=0, timeout=60)


def connection_refused(address: str) -> bool:
    port = int(address.rsplit(":", 1)[1].split("/")[0])
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


def test_switch_serves_the_loaded_model_and_logs_each_request_with_its_stats(make_window, qtbot) -> None:
    backend = ThreadRecordingBackend(replies=["Hello there, friend."])
    window = make_window(backend)
    panel = window.server_panel
    address = switch_on(qtbot, panel)
    assert panel.state == "on" and address.startswith("http://127.0.0.1:") and address.endswith("/v1")
    assert not panel.port.isEnabled()  # the port is chosen before switching on
    assert "Serving at " + address in panel.status.text()

    api = client(address)
    assert [model.id for model in api.models.list()] == ["Scripted model"]
    reply = api.chat.completions.create(model="any", messages=HELLO, max_tokens=50)
    assert reply.choices[0].message.content == "Hello there, friend."
    assert backend.threads == ["hearth-server-model"]  # the server's one queue called the model

    qtbot.waitUntil(lambda: panel.log_table.rowCount() == 1, timeout=10_000)
    cells = [panel.log_table.item(0, column).text() for column in range(panel.log_table.columnCount())]
    assert cells[1:3] == ["chat/completions", "200"]
    record = panel.records[0]
    assert int(cells[3]) == record.prompt_tokens > 0
    assert cells[4] == "0" and cells[5] == "3"  # cached, completion tokens
    assert float(cells[7]) == pytest.approx(record.decode_tokens_per_s, rel=0.01)
    assert panel.depth_label.text() == "Queue: 0 running, 0 waiting (one at a time)"  # no batched step

    panel.copy_button.click()
    assert QApplication.clipboard().text() == address


def test_window_chat_answers_while_a_client_streams_both_through_the_one_queue(make_window, qtbot) -> None:
    long_reply = " ".join(f"word{i}" for i in range(60))
    gate = threading.Event()
    backend = ThreadRecordingBackend(gate, replies=[long_reply, "The window's own answer."])
    window = make_window(backend)
    panel = window.server_panel
    address = switch_on(qtbot, panel)
    streamed: list[str] = []
    failures: list[BaseException] = []
    first_token = threading.Event()

    def stream() -> None:
        try:
            chunks = client(address).chat.completions.create(model="any", messages=HELLO, stream=True)
            for chunk in chunks:
                if chunk.choices and chunk.choices[0].delta.content:
                    streamed.append(chunk.choices[0].delta.content)
                    first_token.set()
        except BaseException as exc:
            failures.append(exc)
            first_token.set()

    streamer = threading.Thread(target=stream)
    streamer.start()
    try:
        assert first_token.wait(30)
        with qtbot.waitSignal(window.reply_finished, timeout=30_000) as finished:
            window.chat.send("And you?")
            # The window's request waits its turn behind the client's stream, and the panel shows it waiting.
            qtbot.waitUntil(
                lambda: panel.depth_label.text() == "Queue: 1 running, 1 waiting (one at a time)", timeout=10_000
            )
            gate.set()
    finally:
        gate.set()
        streamer.join(30)
    assert not failures
    assert "".join(streamed) == long_reply  # the client's stream was served whole, first
    assert finished.args[0] == "stop"
    assert window.chat_model.item(1).content == "The window's own answer."
    assert backend.threads == ["hearth-server-model", "hearth-server-model"]
    assert [len(messages) for messages in backend.calls] == [1, 2]  # the client's Hi, then the window's system + user
    qtbot.waitUntil(lambda: panel.log_table.rowCount() == 1, timeout=10_000)  # the log lists API clients only


def test_switching_off_stops_serving_and_the_window_chats_directly_again(make_window, qtbot) -> None:
    backend = ThreadRecordingBackend(replies=["Served.", "Direct."])
    window = make_window(backend)
    panel = window.server_panel
    address = switch_on(qtbot, panel)
    assert client(address).chat.completions.create(model="any", messages=HELLO).choices[0].message.content
    with qtbot.waitSignal(panel.state_changed, timeout=30_000, check_params_cb=lambda s: s == "off"):
        panel.switch.click()
    assert panel.status.text() == "Stopped." and not panel.switch.isChecked() and panel.address.text() == ""
    assert panel.port.isEnabled() and not panel.copy_button.isEnabled()
    assert connection_refused(address)
    with pytest.raises(openai.APIConnectionError):
        client(address).models.list()
    assert not [t for t in threading.enumerate() if t.name in SERVER_THREADS]
    with qtbot.waitSignal(window.reply_finished, timeout=30_000):
        window.chat.send("Still there?")
    assert window.chat_model.item(1).content == "Direct."
    assert backend.threads[-1] == "hearth-inference"  # the worker calls the model itself again


def test_switching_off_while_the_window_waits_behind_a_client_runs_its_reply_at_once(make_window, qtbot) -> None:
    long_reply = " ".join(f"word{i}" for i in range(400))
    backend = ThreadRecordingBackend(threading.Event(), replies=[long_reply, "Not kept waiting."])  # never opens
    window = make_window(backend)
    panel = window.server_panel
    address = switch_on(qtbot, panel)
    streamed: list[str] = []
    started = threading.Event()

    def stream() -> None:
        try:
            for chunk in client(address).chat.completions.create(model="any", messages=HELLO, stream=True):
                if chunk.choices and chunk.choices[0].delta.content:
                    streamed.append(chunk.choices[0].delta.content)
                    started.set()
        except openai.APIError:
            pass  # the server went away mid-stream
        finally:
            started.set()

    streamer = threading.Thread(target=stream)
    streamer.start()
    try:
        assert started.wait(30)
        with qtbot.waitSignal(window.reply_finished, timeout=30_000) as finished:
            window.chat.send("Are you busy?")
            qtbot.waitUntil(lambda: "1 waiting" in panel.depth_label.text(), timeout=10_000)
            panel.switch.click()
    finally:
        streamer.join(30)
    assert finished.args[0] == "stop" and window.chat_model.item(1).content == "Not kept waiting."
    assert backend.threads == ["hearth-server-model", "hearth-inference"]
    assert len(streamed) == 1  # the client's stream was cut when the server stopped (held after a token)
    qtbot.waitUntil(lambda: panel.state == "off", timeout=10_000)
    assert connection_refused(address)


def test_a_port_in_use_is_one_clear_message(make_window, qtbot) -> None:
    window = make_window()
    panel = window.server_panel
    with socket.socket() as other_program:
        other_program.bind(("127.0.0.1", 0))
        other_program.listen()
        port = other_program.getsockname()[1]
        switch_on(qtbot, panel, port)
    assert panel.state == "off" and not panel.switch.isChecked()
    assert panel.status.text() == port_in_use_message(port)
    assert panel.status.text() == (
        f"Port {port} is already in use by another program. Choose another port, or 0 for any free port."
    )


def test_the_port_is_a_setting_remembered_when_the_switch_is_used(make_window, qtbot) -> None:
    window = make_window(settings=Settings(server_port=8123))
    panel = window.server_panel
    assert panel.port.value() == 8123
    switch_on(qtbot, panel, 0)
    assert window.settings.server_port == 0
    assert panel.address.text() != "http://127.0.0.1:0/v1"  # 0 asked for any free port: the chosen one is shown
    assert int(panel.address.text().rsplit(":", 1)[1].removesuffix("/v1")) > 0


class BatchingBackend(ScriptedBackend):
    """A model that says it decodes up to 8 replies together (the torch-free runtime's cap), its served replies'
    KV caches within 64 MiB at 16 KiB a token."""

    max_batch = 8

    def __post_init__(self) -> None:
        super().__post_init__()
        self.info = replace(self.info, served_together=8, served_kv_budget_bytes=64 << 20, kv_bytes_per_token=16 << 10)


def test_what_replies_at_once_allow_is_said_in_the_runtime_s_terms() -> None:
    info = ModelInfo("m", "Q4_1", "cpu", 8192, served_together=8, served_kv_budget_bytes=64 << 20,
                     kv_bytes_per_token=16 << 10)  # fmt: skip
    assert capacity_text(info, 4) == (
        "4 at once, each up to 1,024 tokens: their KV caches take at most 64.0 MiB. Longer requests wait for a turn."
    )
    assert capacity_text(info, 1).startswith("1 at once, each up to 4,096 tokens")
    assert capacity_text(replace(info, served_kv_budget_bytes=1 << 40), 2).startswith("2 at once, each up to 8,192")
    assert capacity_text(info, 12).startswith("8 at once (this runtime's most: 8), each up to 512 tokens")
    assert capacity_text(replace(info, served_together=1), 4) == "This model's runtime answers one request at a time."


def test_replies_at_once_is_a_setting_the_window_s_server_decodes_with(make_window, qtbot) -> None:
    window = make_window(BatchingBackend(), settings=Settings(server_parallel=3))
    panel = window.server_panel
    assert panel.parallel.value() == 3
    assert not panel.capacity.isHidden() and panel.capacity.text().startswith("3 at once, each up to 1,365 tokens")
    panel.parallel.setValue(12)
    assert panel.capacity.text().startswith("8 at once (this runtime's most: 8)")
    switch_on(qtbot, panel)
    assert window.settings.server_parallel == 12 and not panel.parallel.isEnabled()  # remembered, fixed while on
    assert window.host.server_depth() == (0, 0, 8)  # the model's own cap bounds what was asked
    qtbot.waitUntil(lambda: panel.depth_label.text() == "Queue: 0 running, 0 waiting (up to 8 together)")
    with qtbot.waitSignal(panel.state_changed, timeout=30_000, check_params_cb=lambda s: s == "off"):
        panel.switch.click()
    assert panel.parallel.isEnabled()
    window.unload_model()
    qtbot.waitUntil(lambda: panel.capacity.isHidden(), timeout=10_000)  # no model: nothing to say


def test_the_memory_tab_s_plan_follows_replies_at_once(make_window) -> None:
    window = make_window(ScriptedBackend(), settings=Settings(server_parallel=3))
    assert window.memory_panel.served_replies == 3
    window.memory_panel.set_plan(
        SimpleNamespace(fits="yes", served_together=8, served_kv_budget_bytes=2**30, kv_bytes_per_token=2**16,
                        context=8192)
    )  # fmt: skip
    assert "served: 3 replies at once, each up to 5,461 tokens" in window.memory_panel.plan_label.text()
    window.server_panel.parallel.setValue(6)
    assert "served: 6 replies at once, each up to 2,730 tokens" in window.memory_panel.plan_label.text()


def test_a_model_that_answers_one_at_a_time_says_so_in_the_server_tab(make_window) -> None:
    panel = make_window(ScriptedBackend()).server_panel
    assert panel.capacity.text() == "This model's runtime answers one request at a time."


def test_switching_on_without_a_model_says_to_load_one(make_window, qtbot) -> None:
    window = make_window(load=False)
    panel = window.server_panel
    switch_on(qtbot, panel)
    assert panel.state == "off" and not panel.switch.isChecked()
    assert panel.status.text() == NO_MODEL_MESSAGE


def test_unloading_or_loading_a_model_stops_the_server(make_window, qtbot) -> None:
    window = make_window()
    panel = window.server_panel
    address = switch_on(qtbot, panel)
    with qtbot.waitSignal(panel.state_changed, timeout=30_000, check_params_cb=lambda s: s == "off"):
        window.unload_model()
    assert panel.status.text() == "The server stopped: the model was unloaded."
    assert connection_refused(address)

    with qtbot.waitSignal(window.model_ready, timeout=30_000):
        window.load_model(window.model_bar.request())
    address = switch_on(qtbot, panel)
    with qtbot.waitSignal(panel.state_changed, timeout=30_000, check_params_cb=lambda s: s == "off"):
        window.load_model(window.model_bar.request())
    assert panel.status.text().startswith("The server stopped: another model is loading.")
    assert connection_refused(address)


def test_closing_the_window_while_serving_ends_every_server_thread(make_window, qtbot) -> None:
    window = make_window()
    address = switch_on(qtbot, window.server_panel)
    window.close()
    assert not window.host.worker_thread.isRunning()
    assert connection_refused(address)  # and no_server_threads_left checks the threads


def test_a_conversation_forgotten_while_serving_is_forgotten_in_the_queues_thread(make_window, qtbot) -> None:
    backend = ThreadRecordingBackend(replies=["One.", "Two."])
    window = make_window(backend)
    with qtbot.waitSignal(window.reply_finished, timeout=30_000):
        window.chat.send("Remember me")
    conversation = window.conversation_id
    assert conversation is not None
    switch_on(qtbot, window.server_panel)
    window.host.forget(conversation)
    qtbot.wait(100)  # the worker has taken the forget by now; the backend must not have been touched yet
    assert backend.forgotten == []
    with qtbot.waitSignal(window.reply_finished, timeout=30_000):
        window.chat.send("Another turn")
    assert backend.forgotten == [(conversation, "hearth-server-model")]


def test_the_real_model_serves_a_client_and_the_window(make_window, qtbot, default_loaded) -> None:
    def factory(request: LoadRequest, progress, cancel: threading.Event) -> EngineBackend:  # type: ignore[no-untyped-def]
        return EngineBackend(default_loaded)  # the session's model: never loaded twice

    settings = Settings(sampling=SamplingParams(temperature=0.0, max_new_tokens=12), response_cache=False)
    window = make_window(factory=factory, settings=settings)
    panel = window.server_panel
    address = switch_on(qtbot, panel)
    api = client(address)
    assert [model.id for model in api.models.list()] == ["SmolLM2-135M-Instruct"]
    question = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    reply = api.chat.completions.create(model="any", messages=question, max_tokens=8, temperature=0)
    assert "paris" in (reply.choices[0].message.content or "").lower()
    with qtbot.waitSignal(window.reply_finished, timeout=120_000):
        window.chat.send("What is the capital of Italy? Answer in one word.")
    assert "rome" in window.chat_model.item(1).content.lower()
    qtbot.waitUntil(lambda: panel.log_table.rowCount() == 1, timeout=10_000)
    record = panel.records[0]
    assert record.status == 200 and record.prompt_tokens > 10 and 0 < record.completion_tokens <= 8
    assert record.ttft_ms > 0


def test_switching_on_in_a_build_without_the_server_libraries_says_so(make_window, qtbot, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # `import uvicorn` raises ImportError, as in such a build
    panel = make_window().server_panel
    switch_on(qtbot, panel)
    assert panel.state == "off" and panel.status.text() == NO_SERVER_LIBRARIES_MESSAGE


def test_the_windows_request_goes_before_the_clients_waiting_in_a_full_queue() -> None:
    gate = threading.Event()
    backend = ThreadRecordingBackend(gate, replies=["Held until the gate opens.", "The window's answer.", "Client."])
    server = WindowServer(backend, lambda record: None, threading.Event(), max_waiting=1)
    server.start(0)
    hello = ReplyRequest([ChatMessage("user", "Hi")])
    try:
        running = server.stream(hello, threading.Event())
        assert [next(running).type, next(running).type] == ["prompt", "token"]  # running, held after one token
        assert server.handle is not None and server.handle.queue is not None
        client: list[object] = []
        server.handle.queue.submit(hello, threading.Event(), client.append)  # a client waits behind it
        with pytest.raises(QueueFullError):  # the queue is full for clients
            server.handle.queue.submit(hello, threading.Event(), lambda item: None)
        window: list[Event] = []
        waiter = threading.Thread(target=lambda: window.extend(server.stream(hello, threading.Event())))
        waiter.start()
        deadline = time.monotonic() + 10
        while server.depth() != (1, 2, 1) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.depth() == (1, 2, 1)  # the window's request is taken although clients filled the queue
        gate.set()
        list(running)
        waiter.join(30)
        assert [event.text for event in window if isinstance(event, DoneEvent)] == ["The window's answer."]
        while not any(isinstance(item, End) for item in client) and time.monotonic() < deadline + 30:
            time.sleep(0.01)
        assert [item.text for item in client if isinstance(item, DoneEvent)] == ["Client."]  # the third reply
    finally:
        gate.set()
        server.stop()


def test_switching_off_before_the_server_has_started_leaves_it_off(make_window, qtbot) -> None:
    window = make_window()
    panel = window.server_panel
    panel.port.setValue(0)
    with qtbot.waitSignal(panel.state_changed, timeout=30_000, check_params_cb=lambda s: s == "off"):
        panel.switch.click()  # on: the worker starts the server...
        panel.switch.click()  # ...and off before its answer arrives (started, then stopped, arrive in order)
    assert panel.state == "off" and not panel.switch.isChecked() and panel.address.text() == ""
    assert panel.status.text() == "Stopped."
    assert window.host.server_depth() is None


def test_the_view_menu_shows_the_server_panel(make_window) -> None:
    window = make_window(load=False)
    action = next(a for a in window.view_menu.actions() if a.text() == "&Server")
    assert not window.server_panel.isVisible()
    action.trigger()
    assert window.server_panel.isVisible()
