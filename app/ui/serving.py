"""The window's server, seen from the inference worker: one request queue in front of the one loaded model.

While the window serves, the server's queue thread is the only thread that calls the backend: API clients and the
window's own chat are jobs in the same FIFO queue. The worker submits the window's requests with a sink that feeds a
thread-safe queue, and drains it in its own thread (`WindowServer.stream`), so the window's signals do not change.
Plain Python (no Qt); app.core.server is imported only when the server starts, in the worker thread.
"""

from __future__ import annotations

import collections
import errno
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

from app.core.chat.events import DoneEvent, Event
from app.core.engines.backend import ChatBackend, MemoryReading, ReplyRequest
from app.core.engines.batching import BatchedModel, DecodeStep, ReplyItem
from app.core.errors import HearthError

if TYPE_CHECKING:
    from app.core.server import RequestRecord, ServerHandle

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"  # the window never listens beyond this machine (that is `hearth serve --allow-network`)
POLL_S = 0.05  # how often a waiting window request looks at its cancel and at a request to stop the server
MAX_WAITING = 16  # requests that may wait behind the running one (hearth serve's --max-queue default)
NO_MODEL_MESSAGE = "No model is loaded: load one from the model bar, then switch the server on."
NO_SERVER_LIBRARIES_MESSAGE = (
    "This build of Hearth cannot serve: the server's libraries (uvicorn, starlette) are missing."
)


def port_in_use_message(port: int) -> str:
    return f"Port {port} is already in use by another program. Choose another port, or 0 for any free port."


def port_in_use(host: str, port: int) -> bool:
    """Whether another socket listens on host:port (SO_REUSEADDR, as uvicorn binds: a closed socket's leftovers
    do not count)."""
    if port == 0:
        return False
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


class QueuedCancel(threading.Event):
    """The cancel a window request carries in the server's queue: set when the window cancels it, or by the queue
    when the server stops. Stopping the server must not cancel the window's own reply, which then runs directly."""

    def __init__(self, window_cancel: threading.Event) -> None:
        super().__init__()
        self.window_cancel = window_cancel

    def is_set(self) -> bool:
        return super().is_set() or self.window_cancel.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            left = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
            if left <= 0:
                return False
            super().wait(left)
        return True


class SharedModel:
    """The ServedModel the server's queue calls: the window's backend, with the window's `forget`s deferred to the
    queue's thread (the only one that may touch the backend while serving) and the last memory reading kept for the
    window's panel."""

    def __init__(self, backend: ChatBackend) -> None:
        self.backend = backend
        self.info = backend.info
        self._forgets: collections.deque[int] = collections.deque()
        self.last_memory: MemoryReading | None = None

    def generate(self, request: ReplyRequest, cancel: threading.Event) -> Iterator[Event]:
        self.apply_forgets()  # in the queue's thread, between requests
        return self.backend.generate(request, cancel)

    @property
    def max_batch(self) -> int:
        """How many replies the backend decodes together (1: one at a time)."""
        return int(getattr(self.backend, "max_batch", 1))

    def reply_steps(self, request: ReplyRequest, cancel: threading.Event) -> Iterator[ReplyItem]:
        self.apply_forgets()  # in the queue's thread, as a reply starts
        return cast(BatchedModel, self.backend).reply_steps(request, cancel)

    def decode_batch(self, steps: Sequence[DecodeStep]) -> None:
        cast(BatchedModel, self.backend).decode_batch(steps)

    def compile_grammar(self, request: ReplyRequest) -> None:
        """In the server's compile thread: the backend's grammars are its own (thread-safe), not its model."""
        compile_grammar = getattr(self.backend, "compile_grammar", None)
        if compile_grammar is not None:
            compile_grammar(request)

    def memory(self) -> MemoryReading:
        reading = self.backend.memory()
        self.last_memory = reading
        return reading

    def forget(self, conversation_id: int) -> None:
        self._forgets.append(conversation_id)  # deque.append is thread-safe

    def apply_forgets(self) -> None:
        while self._forgets:
            self.backend.forget(self._forgets.popleft())


class WindowServer:
    """A running server over the worker's backend. Created, used and stopped in the worker thread; `depth` and
    `stop_requested` may be used from any thread."""

    def __init__(
        self,
        backend: ChatBackend,
        on_request: Callable[[RequestRecord], None],
        stop_requested: threading.Event,
        max_waiting: int = MAX_WAITING,
        parallel: int = 1,
    ) -> None:
        self.backend = backend
        self.max_waiting = max_waiting
        self.parallel = parallel  # asked for; the model's max_batch caps it (1 where it has no batched step)
        self.model = SharedModel(backend)
        self.on_request = on_request
        self.handle: ServerHandle | None = None
        self.stop_requested = stop_requested  # set by the GUI thread: stop even while a window request waits

    def start(self, port: int) -> str:
        """Listen on 127.0.0.1:`port` (0 = any free port); returns the base URL. Raises HearthError with the
        message the panel shows."""
        try:
            from app.core.server import ServerConfig, ServerHandle

            handle = ServerHandle(
                ServerConfig(host=LOOPBACK, port=port, max_queue=self.max_waiting, parallel=self.parallel),
                on_request=self.on_request,
            )
            address = handle.start(self.model)
        except ImportError as exc:  # a build without the HTTP stack (uvicorn is imported by start)
            log.warning("serving unavailable: %s", exc)
            raise HearthError(NO_SERVER_LIBRARIES_MESSAGE) from None
        except HearthError:
            if port_in_use(LOOPBACK, port):
                raise HearthError(port_in_use_message(port)) from None
            raise
        self.handle = handle
        return address

    @property
    def address(self) -> str:
        return self.handle.address if self.handle is not None else ""

    def stop(self) -> None:
        """Cancel the running and waiting requests, close the socket, end the server's threads; then apply the
        forgets that arrived meanwhile (in the caller's thread: the worker's, which owns the backend again)."""
        handle, self.handle = self.handle, None
        if handle is not None:
            handle.stop()
        self.model.apply_forgets()

    def depth(self) -> tuple[int, int, int]:
        """(running, waiting, decoded together at most) requests, thread-safe."""
        handle = self.handle
        request_queue = handle.queue if handle is not None else None
        if request_queue is None:
            return (0, 0, 1)
        return (request_queue.running, request_queue.waiting, request_queue.parallel)

    def memory(self) -> MemoryReading | None:
        """The last reading the queue's thread took (the worker must not read the backend while serving)."""
        return self.model.last_memory

    def stream(self, request: ReplyRequest, cancel: threading.Event) -> Iterator[Event]:
        """The window's own request, through the server's queue: events as the backend yields them.

        It goes before every waiting client's request, however many wait (where replies are decoded together it
        joins the running ones at their next step); cancelled while waiting, it ends at once (the queue skips it).
        Asked to stop the server while it waits, it stops the server and runs the request directly on the backend."""
        from app.core.server.queue import End

        handle = self.handle
        assert handle is not None and handle.queue is not None
        items: queue.SimpleQueue[Any] = queue.SimpleQueue()
        job = handle.queue.submit(request, QueuedCancel(cancel), items.put, priority=True)
        while True:
            try:
                item = items.get(timeout=POLL_S)
            except queue.Empty:
                if job.started_at is not None:
                    continue  # running: the backend honours cancel within one token and the queue sends End
                if cancel.is_set():
                    yield DoneEvent("cancelled", "")
                    return
                if self.stop_requested.is_set():
                    self.stop()
                    if job.started_at is None:  # never reached the model: run it here, the server is gone
                        yield from self.backend.generate(request, cancel)
                        return
                continue
            if isinstance(item, End):
                return
            if isinstance(item, BaseException):
                raise item
            yield item
