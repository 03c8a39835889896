"""One request queue in front of the one model: a single worker thread owns it, requests are served first in,
first out, and a request whose client went away is skipped (while waiting) or cancelled (while generating)."""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from app.core.chat.events import Event
from app.core.engines.backend import MemoryReading, ModelInfo, ReplyRequest

log = logging.getLogger(__name__)


class ServedModel(Protocol):
    """What the server needs of a backend: every ChatBackend fits; the window can pass an adapter that forwards
    to its own worker thread."""

    info: ModelInfo

    def generate(self, request: ReplyRequest, cancel: threading.Event) -> Iterator[Event]: ...

    def memory(self) -> MemoryReading: ...


class End:
    """The last item a job's sink receives."""


END = End()
JobItem = Event | BaseException | End
Sink = Callable[[JobItem], None]


class QueueFullError(Exception):
    def __init__(self, waiting: int, retry_after_s: int) -> None:
        self.waiting = waiting
        self.retry_after_s = retry_after_s
        super().__init__(f"The server is busy: {waiting} requests are already waiting. Retry in {retry_after_s} s.")


@dataclass
class Job:
    request: ReplyRequest
    cancel: threading.Event
    sink: Sink
    enqueued_at: float = field(default_factory=time.perf_counter)
    started_at: float | None = None
    finished_at: float | None = None

    @property
    def queued_s(self) -> float:
        return (self.started_at or time.perf_counter()) - self.enqueued_at


class RequestQueue:
    """FIFO in front of `model`; `max_waiting` requests may wait behind the running one, then submit raises
    QueueFullError. Sinks are called from the worker thread and must not block."""

    def __init__(self, model: ServedModel, max_waiting: int = 16) -> None:
        self.model = model
        self.max_waiting = max_waiting
        self._waiting: collections.deque[Job] = collections.deque()
        self._running: Job | None = None
        self._lock = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._recent_s: collections.deque[float] = collections.deque(maxlen=16)
        self.last_memory: MemoryReading | None = None

    # --- lifecycle ------------------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._stopping = False
        self._thread = threading.Thread(target=self._work, name="hearth-server-model", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Cancel the running request and every waiting one, then end the worker."""
        with self._lock:
            self._stopping = True
            for job in self._waiting:
                job.cancel.set()
                _deliver(job, END)
            self._waiting.clear()
            if self._running is not None:
                self._running.cancel.set()
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    # --- state ----------------------------------------------------------------------------------------------------
    @property
    def waiting(self) -> int:
        with self._lock:
            return sum(1 for job in self._waiting if not job.cancel.is_set())

    @property
    def running(self) -> int:
        with self._lock:
            return 1 if self._running is not None else 0

    def retry_after_s(self) -> int:
        """Seconds until a slot is likely free: the recent mean request time times the requests ahead."""
        mean = sum(self._recent_s) / len(self._recent_s) if self._recent_s else 1.0
        return max(1, math.ceil(mean * (self.waiting + self.running)))

    # --- submitting -----------------------------------------------------------------------------------------------
    def submit(self, request: ReplyRequest, cancel: threading.Event, sink: Sink) -> Job:
        with self._lock:
            if self._stopping:
                raise QueueFullError(len(self._waiting), 1)
            live = [job for job in self._waiting if not job.cancel.is_set()]
            if len(live) >= self.max_waiting:
                raise QueueFullError(len(live), self.retry_after_s())
            job = Job(request, cancel, sink)
            self._waiting.append(job)
            self._lock.notify_all()
            return job

    # --- the worker -----------------------------------------------------------------------------------------------
    def _next(self) -> Job | None:
        with self._lock:
            while True:
                if self._stopping:
                    return None
                while self._waiting:
                    job = self._waiting.popleft()
                    if job.cancel.is_set():  # its client went away while it waited
                        _deliver(job, END)
                        continue
                    self._running = job
                    return job
                self._lock.wait()

    def _work(self) -> None:
        while (job := self._next()) is not None:
            job.started_at = time.perf_counter()
            try:
                for event in self.model.generate(job.request, job.cancel):
                    _deliver(job, event)
            except BaseException as exc:  # the handler turns it into an HTTP error; the worker carries on
                if not isinstance(exc, Exception):
                    log.exception("server worker: %s", type(exc).__name__)
                _deliver(job, exc)
            finally:
                job.finished_at = time.perf_counter()
                self._recent_s.append(job.finished_at - job.started_at)
                _deliver(job, END)
                with self._lock:
                    self._running = None
            try:
                self.last_memory = self.model.memory()  # read here: the model's own thread, between requests
            except Exception:
                log.exception("memory reading failed")


def _deliver(job: Job, item: JobItem) -> None:
    try:
        job.sink(item)
    except Exception:  # the client's event loop is gone (server shutting down): nothing to tell
        job.cancel.set()
