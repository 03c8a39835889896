"""One long-lived QThread owns the model; the window talks to it only through queued signals.

The worker emits plain data (strings, ints, frozen dataclasses) and never touches widgets or Qt models. Each
request carries its own threading.Event for cancel: the GUI sets it directly (an Event is thread-safe), and the
backend checks it before every token, so Stop and quitting act within one token.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import QObject, Qt, QThread, Signal, Slot

from app.core.chat.events import ContextUsage, DoneEvent, PromptEvent, StatsEvent, TokenEvent
from app.core.crash import user_message
from app.core.engines.backend import BackendFactory, ChatBackend, LoadRequest, ReplyRequest
from app.core.engines.remote.pricing import compare_local_reply, unpriced_comparison
from app.core.errors import HearthError, ModelTooLargeError
from app.core.fastpath.compile_notice import announcing_compile
from app.ui.serving import NO_MODEL_MESSAGE, WindowServer

log = logging.getLogger(__name__)

MEMORY_EVERY_S = 0.25  # live memory readings while streaming: a few per second
TOKENS_EVERY_S = 0.015  # tokens go to the GUI in small batches: fewer wake-ups of the GUI thread than one per token


@dataclass(frozen=True)
class GenerateRequest:
    """A reply the window asked for: the backend's ReplyRequest, plus the id its signals carry and its cancel."""

    request_id: int
    reply: ReplyRequest
    cancel: threading.Event = field(default_factory=threading.Event, compare=False)
    compare_cost_with: str | None = None  # a local reply is also priced on this hosted model (Settings)


@dataclass(frozen=True)
class LoadJob:
    request: LoadRequest
    cancel: threading.Event = field(default_factory=threading.Event, compare=False)


def default_backend_factory() -> BackendFactory:
    """The real engine, imported inside the worker thread on first load (torch is never imported before)."""

    def load(request: LoadRequest, progress: Any, cancel: threading.Event) -> ChatBackend:
        from app.core.engines.opening import open_backend

        return open_backend(request, progress, cancel)

    return load


def settle_after_load() -> None:
    """Runs in the worker thread once a model has loaded, before the window hears of it.

    Freezes the long-lived objects (torch, transformers, the model: ~360,000 of them) so full collections
    mid-reply stop walking them (a 210-260 ms GUI freeze once per reply), and imports the Markdown renderer
    so the first finished reply does not import it on the GUI thread.
    """
    try:
        from pygments.lexers import get_lexer_by_name

        import app.ui.markdown  # noqa: F401 (markdown-it + pygments: imported for the side effect)

        get_lexer_by_name("python")  # pygments loads lexer modules lazily
    except Exception:
        log.exception("warming the Markdown renderer failed")
    gc.collect()
    gc.freeze()


Planner = Callable[[LoadRequest], Any]  # returns the planner's MemoryPlan; raises HearthError for user errors


def default_planner(request: LoadRequest) -> Any:
    """The plan of the runtime the load will take (app.core.engines.opening.plan_load: imports torch only where the
    torch-free runtime does not take the model, and this is only ever called in the worker thread)."""
    from app.core.engines.opening import plan_load

    return plan_load(request)


class InferenceWorker(QObject):
    """Lives in the worker thread. Slots run there, one at a time; signals carry plain data back."""

    load_progress = Signal(str, float)  # message, fraction (-1 = unknown)
    model_loaded = Signal(object)  # ModelInfo
    load_failed = Signal(str, bool)  # message, whether the memory planner refused it (loading anyway may work)
    model_unloaded = Signal()
    plan_ready = Signal(object)  # the planner's MemoryPlan
    plan_failed = Signal(str)
    plan_progress = Signal(str)  # a slow stage of planning the user should see (the CPU kernel's first compile)
    token = Signal(int, str, int)  # request id, text of one or more tokens, how many tokens
    stats = Signal(int, object)  # request id, ReplyStats
    context = Signal(int, object)  # request id, ContextUsage
    finished = Signal(int, str, str, str)  # request id, finish reason, whole reply text, error ("" if none)
    failed = Signal(int, str)  # request id, message: nothing was generated
    notice = Signal(str)  # something the user should know that did not stop the reply (a damaged cache entry)
    memory = Signal(object)  # MemoryReading
    stopped = Signal()
    # The window's server (app/ui/serving.py, app/ui/server_panel.py):
    server_started = Signal(str)  # the base URL clients use
    server_failed = Signal(str)  # why it did not start (one message for the panel)
    server_stopped = Signal(str)  # why it stopped ("" when asked to)
    server_request = Signal(object)  # RequestRecord; emitted from the server's thread, connect it queued

    def __init__(self, factory: BackendFactory, planner: Planner | None = None) -> None:
        super().__init__()
        self._factory = factory
        self._planner = planner or default_planner
        self._backend: ChatBackend | None = None
        self._server: WindowServer | None = None
        self.server_stop_requested = threading.Event()  # set by the GUI: a window request waiting in the queue yields

    @Slot(object)
    def load(self, job: LoadJob) -> None:
        self._stop_server("The server stopped: another model is loading. Switch it on again to serve that one.")
        self._close_backend()
        if job.cancel.is_set():
            self.load_failed.emit("Loading was cancelled.", False)
            return

        def progress(message: str, fraction: float | None) -> None:
            self.load_progress.emit(message, -1.0 if fraction is None else float(fraction))

        try:
            backend = self._factory(job.request, progress, job.cancel)
        except HearthError as exc:
            self.load_failed.emit(str(exc), isinstance(exc, ModelTooLargeError))
            return
        except Exception as exc:
            log.exception("model load failed")
            self.load_failed.emit(user_message(exc), False)
            return
        if job.cancel.is_set():  # cancelled during the last, uninterruptible step: honour it anyway
            backend.close()
            self.load_failed.emit("Loading was cancelled.", False)
            return
        self._backend = backend
        settle_after_load()
        self.model_loaded.emit(backend.info)
        self._emit_memory()

    @Slot()
    def unload(self) -> None:
        self._stop_server("The server stopped: the model was unloaded.")
        self._close_backend()
        self.model_unloaded.emit()

    @Slot(object)
    def plan(self, request: LoadRequest) -> None:
        """The memory planner's verdict before loading (torch-free, but may read a big file header)."""
        if request.remote is not None:
            self.plan_failed.emit(
                f"{request.remote.label} runs on the remote engine {request.remote.engine!r}: "
                "nothing is loaded into this machine's memory."
            )
            return
        try:
            with announcing_compile(self.plan_progress.emit):
                result = self._planner(request)
        except ImportError:
            self.plan_failed.emit("The memory planner is not available in this build.")
            return
        except HearthError as exc:
            self.plan_failed.emit(str(exc))
            return
        except Exception as exc:
            log.exception("memory plan failed")
            self.plan_failed.emit(user_message(exc))
            return
        self.plan_ready.emit(result)

    @Slot(int)
    def forget(self, conversation_id: int) -> None:
        if self._server is not None:
            self._server.model.forget(conversation_id)  # applied in the queue's thread, between requests
        elif self._backend is not None:
            self._backend.forget(conversation_id)

    @Slot(object)
    def generate(self, request: GenerateRequest) -> None:
        backend = self._backend
        rid = request.request_id
        if backend is None:
            self.failed.emit(rid, "No model is loaded: load one from the model bar first.")
            return
        pieces: list[str] = []
        usage = ContextUsage(0, 0, 0, 0, backend.info.context_window)
        try:
            server = self._server  # serving: the window's request waits its turn in the server's one queue
            if server is not None:
                events = server.stream(request.reply, request.cancel)
            else:
                events = backend.generate(request.reply, request.cancel)
            done: DoneEvent | None = None
            last_memory = last_tokens = time.monotonic()
            pending: list[str] = []
            pending_count = 0
            for event in events:
                if isinstance(event, TokenEvent):
                    pieces.append(event.text)
                    pending.append(event.text)
                    pending_count += event.token_count
                    now = time.monotonic()
                    if now - last_tokens >= TOKENS_EVERY_S:
                        last_tokens = now
                        self.token.emit(rid, "".join(pending), pending_count)
                        pending.clear()
                        pending_count = 0
                    if now - last_memory >= MEMORY_EVERY_S:
                        last_memory = now
                        self._emit_memory()
                    continue
                if pending:
                    self.token.emit(rid, "".join(pending), pending_count)
                    pending.clear()
                    pending_count = 0
                if isinstance(event, PromptEvent):
                    usage = event.usage
                    self.context.emit(rid, usage)
                elif isinstance(event, StatsEvent):
                    stats = compare_local_reply(event.stats, request.compare_cost_with, usage.system + usage.history)
                    if request.compare_cost_with and stats.cost is None and stats.memory_device != "remote":
                        self.notice.emit(unpriced_comparison(request.compare_cost_with))
                    self.stats.emit(rid, stats)
                    prompt = event.stats.prompt_tokens
                    history = max(prompt - usage.system - usage.current, 0)
                    self.context.emit(
                        rid,
                        ContextUsage(usage.system, history, usage.current, event.stats.generated_tokens, usage.window),
                    )
                elif isinstance(event, DoneEvent):
                    done = event
            if pending:
                self.token.emit(rid, "".join(pending), pending_count)
        except HearthError as exc:
            self._finish_failure(rid, pieces, str(exc))
            return
        except Exception as exc:
            log.exception("generation failed")
            self._finish_failure(rid, pieces, user_message(exc))
            return
        if done is None:
            done = DoneEvent("error", "".join(pieces), error="The model stopped without finishing the reply.")
        # The reading first: queued signals arrive in order, so the panel shows the reply's KV cache by the time the
        # window hears the reply finished (a short, fast reply may end before any reading while streaming).
        self._emit_memory()
        for line in done.notices:
            self.notice.emit(line)
        self.finished.emit(rid, done.finish_reason, done.text, done.error or "")

    def _finish_failure(self, rid: int, pieces: list[str], message: str) -> None:
        if pieces:  # part of a reply exists: keep it, marked as failed
            self.finished.emit(rid, "error", "".join(pieces), message)
        else:
            self.failed.emit(rid, message)

    def _emit_memory(self) -> None:
        if self._backend is None:
            return
        if self._server is not None:  # only the queue's thread reads the backend while serving
            reading = self._server.memory()
            if reading is not None:
                self.memory.emit(reading)
            return
        try:
            self.memory.emit(self._backend.memory())
        except Exception:  # a failed reading must not end a reply
            log.exception("memory reading failed")

    def _close_backend(self) -> None:
        backend, self._backend = self._backend, None
        if backend is not None:
            gc.unfreeze()  # the old model's frozen objects become collectable again once it is closed
            try:
                backend.close()
            except Exception:
                log.exception("closing the model failed")

    # --- the window's server -------------------------------------------------------------------------------------
    @Slot(int, int)
    def start_server(self, port: int, parallel: int = 1) -> None:
        """Serve the loaded model on 127.0.0.1:`port` (0 = any free port), up to `parallel` replies decoded together
        where the model can."""
        self.server_stop_requested.clear()
        if self._server is not None:
            self.server_started.emit(self._server.address)
            return
        if self._backend is None:
            self.server_failed.emit(NO_MODEL_MESSAGE)
            return
        server = WindowServer(self._backend, self._on_server_request, self.server_stop_requested, parallel=parallel)
        try:
            address = server.start(port)
        except HearthError as exc:
            self.server_failed.emit(str(exc))
            return
        except Exception as exc:
            log.exception("the server did not start")
            self.server_failed.emit(f"The server did not start: {user_message(exc)}")
            return
        self._server = server
        self.server_started.emit(address)

    @Slot()
    def stop_server(self) -> None:
        self._stop_server("")
        self.server_stop_requested.clear()

    def server_depth(self) -> tuple[int, int, int] | None:
        """(running, waiting, decoded together at most) requests in the server's queue, or None when not serving.
        Thread-safe."""
        server = self._server
        return server.depth() if server is not None else None

    def _on_server_request(self, record: Any) -> None:
        """In the server's thread: a request was answered."""
        self.server_request.emit(record)
        server = self._server
        reading = server.memory() if server is not None else None
        if reading is not None:
            self.memory.emit(reading)

    def _stop_server(self, reason: str) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop()
            self.server_stopped.emit(reason)

    @Slot()
    def shutdown(self) -> None:
        """Runs in the worker thread: stop the server, release the model, then end this thread's event loop."""
        self._stop_server("")
        self._close_backend()
        self.stopped.emit()
        thread = QThread.currentThread()
        if thread is not None:
            thread.quit()


class WorkerHost(QObject):
    """Lives in the GUI thread: starts the worker thread, forwards requests as queued signals, stops it cleanly."""

    _load_requested = Signal(object)
    _unload_requested = Signal()
    _plan_requested = Signal(object)
    _generate_requested = Signal(object)
    _forget_requested = Signal(int)
    _shutdown_requested = Signal()
    _start_server_requested = Signal(int, int)
    _stop_server_requested = Signal()

    def __init__(
        self, factory: BackendFactory | None = None, planner: Planner | None = None, parent: QObject | None = None
    ) -> None:
        super().__init__(parent)
        self.worker_thread = QThread()
        self.worker_thread.setObjectName("hearth-inference")
        self.worker = InferenceWorker(factory or default_backend_factory(), planner)
        self.worker.moveToThread(self.worker_thread)
        queued = Qt.ConnectionType.QueuedConnection
        self._load_requested.connect(self.worker.load, queued)
        self._unload_requested.connect(self.worker.unload, queued)
        self._plan_requested.connect(self.worker.plan, queued)
        self._generate_requested.connect(self.worker.generate, queued)
        self._forget_requested.connect(self.worker.forget, queued)
        self._shutdown_requested.connect(self.worker.shutdown, queued)
        self._start_server_requested.connect(self.worker.start_server, queued)
        self._stop_server_requested.connect(self.worker.stop_server, queued)
        self._load_job: LoadJob | None = None
        self._generation: GenerateRequest | None = None
        self._next_request_id = 1
        self.worker_thread.start()

    def next_request_id(self) -> int:
        rid = self._next_request_id
        self._next_request_id += 1
        return rid

    def load(self, request: LoadRequest) -> LoadJob:
        self.cancel_load()
        self.cancel_generation()
        job = LoadJob(request)
        self._load_job = job
        self._load_requested.emit(job)
        return job

    def cancel_load(self) -> None:
        if self._load_job is not None:
            self._load_job.cancel.set()
            self._load_job = None

    def unload(self) -> None:
        self.cancel_load()
        self.cancel_generation()
        self._unload_requested.emit()

    def plan(self, request: LoadRequest) -> None:
        self._plan_requested.emit(request)

    def generate(self, request: GenerateRequest) -> None:
        self._generation = request
        self._generate_requested.emit(request)

    def cancel_generation(self) -> None:
        if self._generation is not None:
            self._generation.cancel.set()
            self._generation = None

    def forget(self, conversation_id: int) -> None:
        self._forget_requested.emit(conversation_id)

    def start_server(self, port: int, parallel: int = 1) -> None:
        """Serve the loaded model on 127.0.0.1:`port`, up to `parallel` replies decoded together where the model can;
        the worker answers server_started or server_failed."""
        self._start_server_requested.emit(port, parallel)

    def stop_server(self) -> None:
        """The worker answers server_stopped. A window reply waiting behind API clients does not delay it: the
        worker stops the server and runs that reply directly."""
        self.worker.server_stop_requested.set()
        self._stop_server_requested.emit()

    def server_depth(self) -> tuple[int, int, int] | None:
        return self.worker.server_depth()

    def shutdown(self, timeout_ms: int = 30_000) -> bool:
        """Stop generation, then the thread; returns whether the thread ended within the timeout."""
        if not self.worker_thread.isRunning():
            return True
        self.cancel_load()
        self.cancel_generation()
        self._shutdown_requested.emit()
        ended = self.worker_thread.wait(timeout_ms)
        if not ended:
            log.error("the inference thread did not stop within %d ms", timeout_ms)
        return bool(ended)
