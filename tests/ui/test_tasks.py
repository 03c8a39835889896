"""The one task runner of app/ui: results and failures come back on the GUI thread, and the tests' leak check sees
a job left running."""

from __future__ import annotations

import threading

import pytest
from PySide6.QtCore import QThread

from app.core.errors import HearthError
from app.ui.tasks import TaskRunner, busy_runners


def test_results_and_failures_arrive_on_the_gui_thread(qtbot) -> None:
    runner = TaskRunner("test")
    gui = QThread.currentThread()
    seen: list[tuple[str, object, bool]] = []
    job_threads: list[str] = []

    def work() -> int:
        job_threads.append(threading.current_thread().name)
        return 42

    def boom() -> None:
        raise HearthError("The file is gone.")

    runner.run("work", work, lambda result: seen.append(("done", result, QThread.currentThread() is gui)))
    runner.run("boom", boom, None, lambda exc: seen.append(("failed", str(exc), QThread.currentThread() is gui)))
    with qtbot.waitSignal(runner.idle, timeout=5000):
        pass
    assert sorted(seen) == [("done", 42, True), ("failed", "The file is gone.", True)]
    assert job_threads and job_threads[0] != threading.main_thread().name
    assert not runner.busy


def test_wait_delivers_follow_up_jobs_too(qtbot) -> None:
    runner = TaskRunner("test")
    order: list[str] = []
    runner.run("first", lambda: "listing", lambda _r: runner.run("second", lambda: "verdicts", order.append))
    assert runner.wait(5)
    assert order == ["verdicts"]


def test_the_leak_check_sees_a_job_still_running(qtbot) -> None:
    runner = TaskRunner("slow")
    release = threading.Event()
    runner.run("slow", lambda: release.wait(10))
    assert runner in busy_runners() and runner.running
    release.set()
    assert runner.wait(5) and runner not in busy_runners()


def test_shutdown_cancels_and_drops_undelivered_results(qtbot) -> None:
    runner = TaskRunner("cancellable")
    results: list[object] = []
    started = threading.Event()

    def until_cancelled() -> str:
        started.set()
        task.cancel.wait(10)
        return "stopped"

    task = runner.run("loop", until_cancelled, results.append)
    assert started.wait(5)
    assert runner.shutdown(5000)
    assert task.ended.is_set() and not runner.busy
    qtbot.wait(50)
    assert results == []


@pytest.mark.parametrize("count", [1, 5])
def test_jobs_beyond_the_thread_limit_queue_and_all_report(qtbot, count: int) -> None:
    runner = TaskRunner("limited", max_threads=1)
    results: list[int] = []
    for index in range(count):
        runner.run(f"job {index}", lambda index=index: index, results.append)  # type: ignore[misc]
    assert runner.wait(5)
    assert sorted(results) == list(range(count))
