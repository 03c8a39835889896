"""UI test fixtures: a window over a scripted backend, and a check that no QThread or background task (app/ui/tasks.py)
outlives its test. The offscreen screen is a 1366x768 laptop's (Qt's own default is 800x800): windows open, fit and
lay out as they would on the most common laptop screen."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from PySide6.QtCore import QThread

from app.core.engines.backend import LoadRequest, ScriptedBackend, scripted_factory
from app.core.settings import Settings
from app.core.storage.history import HistoryStore
from app.ui.main_window import MainWindow
from app.ui.tasks import busy_runners

LAPTOP_SCREEN = Path(__file__).with_name("offscreen-1366x768.json")
if os.environ.get("QT_QPA_PLATFORM") == "offscreen":  # set before pytest-qt creates the QApplication
    os.environ["QT_QPA_PLATFORM"] = f"offscreen:configfile={LAPTOP_SCREEN}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The offscreen platform plugin warns whenever a window's size constraints change; real platforms do not.
    for item in items:
        if "tests/ui/" in item.nodeid:
            item.add_marker(
                pytest.mark.qt_log_ignore(
                    "This plugin does not support propagateSizeHints", "This plugin does not support raise"
                )
            )


@pytest.fixture(autouse=True)
def no_dangling_qthreads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[QThread]]:
    """Fails a test that leaves a QThread running (napari's _dangling_qthreads, simplified), or a TaskRunner's job:
    the worker thread and the task runners are the only ways app/ui runs background work."""
    started: list[QThread] = []
    original = QThread.start

    def tracking_start(self: QThread, *args: object) -> None:
        started.append(self)
        original(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(QThread, "start", tracking_start)
    yield started
    running = [t.objectName() or repr(t) for t in started if t.isRunning()]
    for thread in started:
        if thread.isRunning():
            thread.quit()
            thread.wait(5000)
    tasks = [runner.name for runner in busy_runners()]
    for runner in busy_runners():
        runner.shutdown(5000)
    assert not running, f"QThreads left running: {running}"
    assert not tasks, f"Background tasks left running: {tasks}"


WindowFactory = Callable[..., MainWindow]


def fake_planner(request: LoadRequest) -> SimpleNamespace:
    """The planner's verdict for the scripted model (the real planner imports torch and reads the model)."""
    return SimpleNamespace(
        fits="yes", total_bytes=512 * 2**20, free_bytes=6 * 2**30, weights_bytes=270 * 2**20, max_context=8192
    )


@pytest.fixture
def make_window(qtbot) -> Iterator[WindowFactory]:  # type: ignore[no-untyped-def]
    """Build a MainWindow over a scripted backend, loaded and shown; closed (thread stopped) after the test."""
    windows: list[MainWindow] = []

    def build(
        backend: ScriptedBackend | None = None,
        *,
        settings: Settings | None = None,
        load: bool = True,
        factory: object = None,
        planner: object = None,
    ) -> MainWindow:
        backend = backend or ScriptedBackend()
        window = MainWindow(
            settings or Settings(system_prompt="You are terse."),
            store=HistoryStore(),
            backend_factory=factory or scripted_factory(backend),  # type: ignore[arg-type]
            planner=planner or fake_planner,  # type: ignore[arg-type]
            autoload=False,
            save_settings_to_disk=False,
        )
        window.confirm_deletes = False
        qtbot.addWidget(window)
        windows.append(window)
        window.show()
        if load:
            with qtbot.waitSignal(window.model_ready, timeout=120_000):
                window.load_model(window.model_bar.request())
        return window

    yield build
    for window in windows:
        if window.host.worker_thread.isRunning():
            window.close()
