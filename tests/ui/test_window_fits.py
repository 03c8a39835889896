"""The window fits the screen it opens on (issue 27, points 1-3): it opens inside a 1366x768 laptop screen with Send in
view, comes back at the size and place the user left it, fitted to a screen that is smaller now, and can be made
960x600 (half a 1920 screen) with nothing overlapping: the panels collapse instead of forcing the window wider."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PySide6.QtCore import QRect, QSize
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QWidget

from app.core.engines.backend import ScriptedBackend, scripted_factory
from app.core.settings import Settings
from app.core.storage import paths
from app.core.storage.history import HistoryStore
from app.ui.main_window import MainWindow
from app.ui.window_geometry import TITLE_BAR_ALLOWANCE, fit_rect
from tests.ui.conftest import fake_planner
from tests.ui.layout_audit import fits, problems
from tests.ui.screen_process import run_gui_on_screen


def available() -> QRect:
    screen = QGuiApplication.primaryScreen()
    assert screen is not None
    return screen.availableGeometry()


def in_view(widget: QWidget, window: QWidget) -> bool:
    """Shown, and wholly inside the window."""
    top_left = widget.mapTo(window, widget.rect().topLeft())
    return widget.isVisible() and window.rect().contains(QRect(top_left, widget.size()))


def remembering_window(qtbot) -> MainWindow:  # type: ignore[no-untyped-def]
    """A window as `hearth-gui` opens it: it reads and writes window.json (in this test's HEARTH_HOME)."""
    window = MainWindow(
        Settings(),
        store=HistoryStore(),
        backend_factory=scripted_factory(ScriptedBackend()),
        planner=fake_planner,  # type: ignore[arg-type]
        autoload=False,
    )
    qtbot.addWidget(window)
    window.show()
    qtbot.waitExposed(window)
    qtbot.wait(20)  # the frame is fitted once shown
    return window


def chat(window: MainWindow, qtbot, count: int = 3) -> None:  # type: ignore[no-untyped-def]
    for i in range(count):
        with qtbot.waitSignal(window.reply_finished, timeout=10_000):
            window.chat.send(f"Question {i}: how does a context window work?")


def test_the_window_opens_inside_a_laptop_screen_with_send_in_view(make_window, qtbot) -> None:
    window = make_window(load=False)
    qtbot.wait(20)
    assert available().size() == QSize(1366, 768)  # the tests' screen (conftest.py)
    assert fits(window, available()), window.frameGeometry()
    assert in_view(window.input_box.button, window) and in_view(window.input_box.editor, window)


def test_the_size_and_place_the_user_left_come_back(qtbot) -> None:
    first = remembering_window(qtbot)
    first.setGeometry(100, 80, 1000, 640)
    qtbot.wait(20)
    first.close()
    saved = json.loads((paths.config_dir() / "window.json").read_text(encoding="utf-8"))
    assert saved == {"x": 100, "y": 80, "width": 1000, "height": 640, "maximized": False}
    second = remembering_window(qtbot)
    assert second.geometry() == QRect(100, 80, 1000, 640)


def test_a_window_left_on_a_bigger_screen_is_fitted_to_this_one(qtbot) -> None:
    # Closed on a 2560x1440 monitor to the right of the laptop's screen; that monitor is gone now.
    saved = {"x": 1500, "y": 200, "width": 1800, "height": 1100, "maximized": False}
    (paths.config_dir() / "window.json").write_text(json.dumps(saved), encoding="utf-8")
    window = remembering_window(qtbot)
    assert fits(window, available()), window.frameGeometry()
    assert window.width() <= 1366 and window.height() <= 768 - TITLE_BAR_ALLOWANCE.top()


def test_fitting_moves_and_shrinks_onto_the_screen_and_keeps_the_minimum() -> None:
    half_screen = QRect(0, 0, 960, 600)
    fitted = fit_rect(QRect(1500, 200, 1800, 1100), half_screen, QSize(620, 320))
    assert half_screen.marginsRemoved(TITLE_BAR_ALLOWANCE).contains(fitted)
    assert fit_rect(QRect(40, 60, 300, 200), half_screen, QSize(620, 320)).size() == QSize(620, 320)
    assert fit_rect(QRect(40, 60, 700, 400), half_screen, QSize(620, 320)) == QRect(40, 60, 700, 400)


def test_a_damaged_window_file_is_ignored_and_written_again(qtbot, caplog: pytest.LogCaptureFixture) -> None:
    path = paths.config_dir() / "window.json"
    path.write_text('{"x": "left", "width": 1e9', encoding="utf-8")
    window = remembering_window(qtbot)
    assert fits(window, available())
    assert "ignoring" in caplog.text and "window.json" in caplog.text
    window.close()
    assert json.loads(path.read_text(encoding="utf-8"))["width"] == window.width()


def test_at_960x600_the_panels_give_way_and_nothing_overlaps(make_window, qtbot) -> None:
    window = make_window()
    chat(window, qtbot)
    window.resize(960, 600)
    qtbot.wait(50)
    assert window.size() == QSize(960, 600)  # nothing forces it wider or taller
    assert window.sidebar.compact and not window.panels.side_tabs.isVisible()
    assert window.memory_summary.isVisible() and "context" in window.memory_summary.text()
    assert problems(window) == []
    assert in_view(window.input_box.button, window)

    window.panels.server_action.trigger()  # View ▸ Server: a tab beside Memory, not a wider window
    qtbot.wait(50)
    assert window.size() == QSize(960, 600)
    assert window.server_panel.isVisible() and in_view(window.server_panel.copy_button, window)
    assert problems(window) == []


def test_at_1366x768_every_panel_shows_and_the_server_tab_fits(make_window, qtbot) -> None:
    window = make_window()
    chat(window, qtbot, 2)
    window.resize(1366, 740)
    qtbot.wait(50)
    assert not window.sidebar.compact and window.memory_panel.isVisible() and not window.memory_summary.isVisible()
    assert problems(window) == []
    window.panels.server_action.trigger()
    qtbot.wait(50)
    assert window.width() == 1366 and window.minimumSizeHint().width() <= 1366
    assert window.server_panel.isVisible() and in_view(window.server_panel.port, window)
    assert problems(window) == []


def test_narrowing_collapses_the_panels_and_widening_brings_back_only_what_the_width_collapsed(
    make_window, qtbot
) -> None:
    window = make_window(load=False)
    window.resize(1366, 740)
    qtbot.wait(20)
    window.panels.memory_action.trigger()  # collapsed by hand: stays collapsed
    assert window.memory_summary.isVisible()
    window.resize(960, 600)
    qtbot.wait(20)
    assert window.sidebar.compact
    window.resize(1366, 740)
    qtbot.wait(20)
    assert not window.sidebar.compact and window.panels.sidebar_action.isChecked()
    assert not window.panels.side_tabs.isVisible() and window.memory_summary.isVisible()
    window.memory_summary.click()  # the one-line summary opens the panel again
    assert window.panels.side_tabs.isVisible() and not window.memory_summary.isVisible()


def test_opening_a_panel_on_a_narrow_window_closes_the_other_instead_of_widening_it(make_window, qtbot) -> None:
    window = make_window(load=False)
    window.resize(960, 600)
    qtbot.wait(20)
    window.panels.memory_action.trigger()  # the memory panel, by hand, at 960 px
    qtbot.wait(20)
    assert window.panels.side_tabs.isVisible() and window.sidebar.compact
    window.panels.sidebar_action.trigger()  # then the full sidebar: no room for both beside the chat
    qtbot.wait(20)
    assert not window.sidebar.compact and not window.panels.side_tabs.isVisible()
    assert window.size() == QSize(960, 600) and problems(window) == []


@pytest.mark.parametrize(("width", "height"), [(960, 600), (1366, 768)])
def test_the_real_window_opens_inside_the_screen_and_comes_back_there(tmp_path: Path, width: int, height: int) -> None:
    probe = """
import json
from tests.ui.layout_audit import problems
screen = app.primaryScreen().availableGeometry()
frame = w.frameGeometry()
print('RESULT=' + json.dumps({'inside': screen.contains(frame), 'size': [w.width(), w.height()],
      'problems': problems(w), 'send': w.input_box.button.isVisible()}))
"""
    home = tmp_path / "home"
    for run in ("first launch", "relaunch"):
        result = run_gui_on_screen(home, width, height, probe)
        assert result.returncode == 0, result.stderr
        line = next(line for line in result.stdout.splitlines() if line.startswith("RESULT="))
        seen = json.loads(line.removeprefix("RESULT="))
        assert seen["inside"] and seen["send"] and seen["problems"] == [], (run, seen)
        assert seen["size"][0] <= width and seen["size"][1] <= height, (run, seen)
    assert (home / "config" / "window.json").is_file()
