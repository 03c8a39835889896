"""One request queue in front of the one model: a single worker thread owns it. Requests start first in, first out
(the window's own before any client's); a request whose client went away is skipped (while waiting) or cancelled
(while generating, within one token).

A model that decodes replies together (app.core.engines.batching) runs up to `parallel` of them at once: every step
runs the pending steps of all running replies in one call (each weight block read once for all): a decode token of
each running reply and a chunk of each new request's prompt, so a request joins without stalling the others, and a
finished or cancelled reply leaves at the next step. Other models run one reply at a time.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Protocol, cast

from app.core.chat.events import Event
from app.core.engines.backend import MemoryReading, ModelInfo, ReplyRequest
from app.core.engines.batching import BatchedModel, BatchStep, DecodeStep, NoRoomYet, PrefillStep, ReplyItem

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
    priority: bool = False  # the window's own request: starts before any waiting client's
    enqueued_at: float = field(default_factory=time.perf_counter)
    started_at: float | None = None
    finished_at: float | None = None

    @property
    def queued_s(self) -> float:
        return (self.started_at or time.perf_counter()) - self.enqueued_at


@dataclass(eq=False)
class _Running:
    """A started job: its reply's items, and the model step it waits on (batched replies: its prompt, then each
    decode step)."""

    job: Job
    items: Generator[ReplyItem, None, None]
    step: BatchStep | None = None


class RequestQueue:
    """FIFO in front of `model`; `max_waiting` requests may wait behind the running ones, then submit raises
    QueueFullError. `parallel`: how many replies run at once where the model decodes them together (its own
    `max_batch` caps it). Sinks are called from the worker thread and must not block."""

    def __init__(self, model: ServedModel, max_waiting: int = 16, parallel: int = 1) -> None:
        self.model = model
        self.max_waiting = max_waiting
        batched = isinstance(model, BatchedModel)
        self.parallel = max(1, min(parallel, cast(BatchedModel, model).max_batch)) if batched else 1
        self._batched = batched and self.parallel > 1
        self._waiting: collections.deque[Job] = collections.deque()
        self._running: list[Job] = []
        self._no_room = False  # a client's request found no KV memory left: no more start until a reply ends
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
        """Cancel the running requests and every waiting one, then end the worker."""
        with self._lock:
            self._stopping = True
            for job in self._waiting:
                job.cancel.set()
                _deliver(job, END)
            self._waiting.clear()
            for job in self._running:
                job.cancel.set()
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
            return len(self._running)

    def retry_after_s(self) -> int:
        """Seconds until a slot is likely free: the recent mean request time times the requests ahead, over the
        replies that run at once."""
        mean = sum(self._recent_s) / len(self._recent_s) if self._recent_s else 1.0
        return max(1, math.ceil(mean * (self.waiting + self.running) / self.parallel))

    # --- submitting -----------------------------------------------------------------------------------------------
    def submit(self, request: ReplyRequest, cancel: threading.Event, sink: Sink, *, priority: bool = False) -> Job:
        """Queue a request; `priority` (the window's own) goes before every waiting client's and, where replies run
        together, joins the running ones at the next step even when all `parallel` slots are taken."""
        with self._lock:
            if self._stopping:
                raise QueueFullError(len(self._waiting), 1)
            live = [job for job in self._waiting if not job.cancel.is_set()]
            if len(live) >= self.max_waiting and not priority:
                raise QueueFullError(len(live), self.retry_after_s())
            job = Job(request, cancel, sink, priority=priority)
            if priority:
                self._waiting.appendleft(job)
            else:
                self._waiting.append(job)
            self._lock.notify_all()
            return job

    # --- the worker -----------------------------------------------------------------------------------------------
    def _admit(self) -> list[Job] | None:
        """The jobs to start now (waiting for one when nothing runs); None when the queue stops. Clients' requests
        fill the `parallel` slots; the window's own never takes a client's slot, and never waits for one where
        replies run together."""
        with self._lock:
            while True:
                if self._stopping:
                    return None
                started: list[Job] = []
                running = len(self._running)
                clients = sum(not job.priority for job in self._running)
                while self._waiting:
                    job = self._waiting[0]
                    if job.cancel.is_set():  # its client went away while it waited
                        self._waiting.popleft()
                        _deliver(job, END)
                        continue
                    if not self._batched:
                        if running + len(started) >= 1:
                            break
                    elif not job.priority:  # (the window's own is first in line: submit puts it there)
                        if clients >= self.parallel or self._no_room:
                            break
                        clients += 1
                    started.append(self._waiting.popleft())
                if started or running:
                    self._running.extend(started)
                    return started
                self._lock.wait()

    def _work(self) -> None:
        running: list[_Running] = []
        while (started := self._admit()) is not None:
            for job in started:
                job.started_at = time.perf_counter()
                slot = _Running(job, self._reply(job))
                if self._advance(slot):
                    running.append(slot)
            if not running:
                continue
            running = self._step(running)
        for slot in running:  # stopping: the running replies were cancelled; each ends after its pending step
            slot.job.cancel.set()
        while running:
            running = self._step(running)

    def _step(self, running: list[_Running]) -> list[_Running]:
        """One step of every running reply, in one call (a decode token each, a chunk of each new prompt); the replies
        still running after it."""
        # the window's own first: its prompt's chunk is taken before any client's
        steps = [slot.step for slot in sorted(running, key=lambda slot: not slot.job.priority) if slot.step is not None]
        failure: BaseException | None = None
        try:
            cast(BatchedModel, self.model).decode_batch(steps)
        except Exception as exc:  # each reply ends with it (its cache dropped); the worker carries on
            log.exception("batched decode step failed")
            failure = exc
        return [slot for slot in running if self._advance(slot, failure)]

    def _reply(self, job: Job) -> Generator[ReplyItem, None, None]:
        """The job's reply items; a generator, so that a request the model refuses raises inside _advance."""
        if self._batched:
            yield from cast(BatchedModel, self.model).reply_steps(job.request, job.cancel)
        else:
            yield from self.model.generate(job.request, job.cancel)

    def _advance(self, slot: _Running, failure: BaseException | None = None) -> bool:
        """Run a reply to its next model step, delivering its events; False once it has ended (its sink then has
        END)."""
        job = slot.job
        slot.step = None
        try:
            item = slot.items.throw(failure) if failure is not None else next(slot.items)
            while True:
                if isinstance(item, DecodeStep | PrefillStep):
                    slot.step = item
                    return True
                _deliver(job, item)
                item = next(slot.items)
        except StopIteration:
            pass
        except NoRoomYet:  # it waits at the head of the line until a running reply ends and frees its memory
            self._leave(job, requeue=True)
            return False
        except BaseException as exc:  # the handler turns it into an HTTP error; the worker carries on
            if not isinstance(exc, Exception):
                log.exception("server worker: %s", type(exc).__name__)
            _deliver(job, exc)
        job.finished_at = time.perf_counter()
        self._recent_s.append(job.finished_at - (job.started_at or job.finished_at))
        _deliver(job, END)
        self._leave(job, requeue=False)
        try:
            self.last_memory = self.model.memory()  # read here: the model's own thread, between steps
        except Exception:
            log.exception("memory reading failed")
        return False

    def _leave(self, job: Job, *, requeue: bool) -> None:
        """A job stops running: it ended (its memory is free, so a request waiting for room may start), or it found
        no room and goes back to the head of the line."""
        with self._lock:
            self._running = [other for other in self._running if other is not job]
            self._no_room = requeue
            if requeue:
                self._waiting.appendleft(job)
                job.started_at = None


def _deliver(job: Job, item: JobItem) -> None:
    try:
        job.sink(item)
    except Exception:  # the client's event loop is gone (server shutting down): nothing to tell
        job.cancel.set()
