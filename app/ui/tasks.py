"""One way to run background work in app/ui (besides the inference worker, which owns the model).

A TaskRunner runs plain callables on its own small thread pool and hands each result, or the exception, back to
the GUI thread through a queued signal: the job never touches widgets, the callbacks run on the GUI thread.
The library (listing, planning, downloads), the attachment bar (reading documents) and the connections dialog
(network probes) all use one. Tests see every runner: `busy_runners()` lists those with a job still running
(tests/ui/conftest.py fails a test that leaves one).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import QCoreApplication, QObject, QRunnable, QThreadPool, Signal, Slot

log = logging.getLogger(__name__)

_RUNNERS: weakref.WeakSet[TaskRunner] = weakref.WeakSet()


@dataclass
class Task:
    """One job handed to a runner; `cancel` is the job's to check if it takes long."""

    name: str
    job: Callable[[], Any]
    on_done: Callable[[Any], None] | None
    on_failed: Callable[[BaseException], None] | None
    cancel: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)  # the job returned or raised
    result: Any = None
    error: BaseException | None = None


class _Relay(QObject):
    """Emitted from the pool's thread; the runner (GUI thread) receives it queued."""

    done = Signal(object)  # Task


class _Run(QRunnable):
    def __init__(self, task: Task, relay: _Relay) -> None:
        super().__init__()
        self.task, self.relay = task, relay

    def run(self) -> None:
        task = self.task
        try:
            task.result = task.job()
        except BaseException as exc:  # every failure reaches the GUI thread
            task.error = exc
        task.ended.set()
        with contextlib.suppress(RuntimeError):  # the runner was deleted meanwhile: nobody is left to tell
            self.relay.done.emit(task)


class TaskRunner(QObject):
    """Runs jobs off the GUI thread; `on_done(result)` / `on_failed(exception)` run on the GUI thread."""

    idle = Signal()  # every job's result has been delivered

    def __init__(self, name: str, *, max_threads: int = 2, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.setObjectName(name)
        self.name = name
        self._pool = QThreadPool(self)
        self._pool.setMaxThreadCount(max_threads)
        self._relay = _Relay()  # no parent: it outlives the runner while a job may still emit on it
        self._relay.done.connect(self._deliver)
        self._tasks: list[Task] = []
        _RUNNERS.add(self)

    def run(
        self,
        name: str,
        job: Callable[[], Any],
        on_done: Callable[[Any], None] | None = None,
        on_failed: Callable[[BaseException], None] | None = None,
    ) -> Task:
        task = Task(name, job, on_done, on_failed)
        self._tasks.append(task)
        self._pool.start(_Run(task, self._relay))
        return task

    @property
    def busy(self) -> bool:
        """A job is queued or running, or its result is not delivered yet."""
        return bool(self._tasks)

    @property
    def running(self) -> bool:
        """A job is queued or running (its thread is in use)."""
        return any(not task.ended.is_set() for task in self._tasks)

    def cancel_all(self) -> None:
        for task in self._tasks:
            task.cancel.set()

    @Slot(object)
    def _deliver(self, task: Task) -> None:
        if task not in self._tasks:
            return
        self._tasks.remove(task)
        if task.error is None:
            if task.on_done is not None:
                task.on_done(task.result)
        elif task.on_failed is not None:
            task.on_failed(task.error)
        else:
            log.error("background task %s/%s failed", self.name, task.name, exc_info=task.error)
        if not self._tasks:
            self.idle.emit()

    def wait(self, timeout_s: float = 30.0) -> bool:
        """Block until every job has ended and its result was delivered, follow-up jobs included (tests, close).
        Delivers only this runner's results; returns whether it got there within the timeout."""
        deadline = time.monotonic() + timeout_s
        while self._tasks and time.monotonic() < deadline:
            self._pool.waitForDone(20)
            QCoreApplication.sendPostedEvents(self, 0)
        return not self._tasks

    def shutdown(self, timeout_ms: int = 5000) -> bool:
        """Cancel the jobs and wait for their threads; results not yet delivered are dropped."""
        self.cancel_all()
        ended = bool(self._pool.waitForDone(timeout_ms))
        self._tasks.clear()
        return ended


def busy_runners() -> list[TaskRunner]:
    """Runners with a job still running (for the tests' leaked-thread check)."""
    alive: list[TaskRunner] = []
    for runner in list(_RUNNERS):
        with contextlib.suppress(RuntimeError):  # its C++ object is gone: so are its threads
            if runner.running:
                alive.append(runner)
    return alive
