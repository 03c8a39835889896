"""Fault suite, window: damaged files never stop the window; it shows a banner, offers the fix for user data, keeps
that data byte-identical, and marks replies a crash cut short."""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt

from app.core.chat.events import DoneEvent, Event
from app.core.engines.backend import ScriptedBackend, scripted_factory
from app.core.settings import Settings, read_settings, settings_path
from app.core.storage.history import HistoryStore, default_history_path
from app.ui.main_window import MainWindow
from tests.helpers.damage import flipped, history_with_conversations, random_bytes, truncated
from tests.helpers.gui_process import run_gui_and_probe
from tests.ui.conftest import fake_planner


@pytest.fixture
def open_window(qtbot: Any) -> Iterator[Any]:
    """A window that opens the history at its default path itself (store=None), as `hearth-gui` does."""
    windows: list[MainWindow] = []

    def build(backend: ScriptedBackend | None = None, **kwargs: Any) -> MainWindow:
        window = MainWindow(
            kwargs.pop("settings", Settings()),
            backend_factory=scripted_factory(backend or ScriptedBackend()),
            planner=fake_planner,  # type: ignore[arg-type]
            autoload=False,
            **kwargs,
        )
        window.confirm_deletes = False
        qtbot.addWidget(window)
        windows.append(window)
        window.show()
        return window

    yield build
    for window in windows:
        if window.host.worker_thread.isRunning():
            window.close()


DAMAGES = [
    ("random bytes", lambda data: random_bytes(len(data))),
    ("cut to 8 KiB", lambda data: truncated(data, 8192)),
    ("header flipped", lambda data: flipped(data, 16, 2)),
]


@pytest.mark.parametrize(("case", "damage"), DAMAGES, ids=[case for case, _ in DAMAGES])
def test_a_damaged_history_opens_the_window_with_a_banner_and_is_left_byte_identical(
    open_window: Any, qtbot: Any, case: str, damage: Any
) -> None:
    path = default_history_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    damaged = damage(history_with_conversations(path))
    path.write_bytes(damaged)
    window = open_window()
    assert window.store.in_memory and window.banner.isVisible()
    text = window.banner.label.text()
    assert str(path) in text and "kept in memory only" in text
    assert window.banner.action_button.isVisible()
    with qtbot.waitSignal(window.model_ready, timeout=10_000):
        window.load_model(window.model_bar.request())
    with qtbot.waitSignal(window.reply_finished, timeout=10_000):
        window.chat.send("Hello")  # the window works meanwhile, its conversations in memory
    assert len(window.store.list_conversations()) == 1
    window.close()
    assert path.read_bytes() == damaged


def test_moving_a_damaged_history_aside_keeps_it_and_this_windows_conversations(
    open_window: Any, qtbot: Any, hearth_home: Path
) -> None:
    path = default_history_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    damaged = random_bytes(64 * 1024)
    path.write_bytes(damaged)
    window = open_window()
    with qtbot.waitSignal(window.model_ready, timeout=10_000):
        window.load_model(window.model_bar.request())
    with qtbot.waitSignal(window.reply_finished, timeout=10_000):
        window.chat.send("Written while the history was damaged")
    qtbot.mouseClick(window.banner.action_button, Qt.MouseButton.LeftButton)
    [moved] = list(path.parent.glob("history.sqlite.damaged-*"))
    assert moved.read_bytes() == damaged
    assert not window.store.in_memory and window.store.path == path
    assert f"The old file is kept, unchanged, at {moved}" in window.banner.label.text()
    window.close()
    with HistoryStore(path) as store:
        [conversation] = store.list_conversations()
        contents = [m.content for m in store.active_branch(conversation.id)]
    assert contents[0] == "Written while the history was damaged" and len(contents) == 2


def test_another_programs_database_is_not_taken_over(open_window: Any) -> None:
    path = default_history_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
    original = path.read_bytes()
    window = open_window()
    assert "a SQLite database of another program" in window.banner.label.text()
    window.close()
    assert path.read_bytes() == original


def test_a_newer_history_is_explained_without_offering_to_move_it(
    open_window: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = default_history_path()
    HistoryStore(path).close()
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA user_version = 99")
    original = path.read_bytes()
    window = open_window()
    assert "written by a newer version of Hearth" in window.banner.label.text()
    assert not window.banner.action_button.isVisible()
    window.close()
    assert path.read_bytes() == original


def test_a_reply_cut_short_by_a_crash_shows_as_interrupted_and_can_be_continued(open_window: Any, qtbot: Any) -> None:
    with HistoryStore(default_history_path()) as store:
        conversation = store.create_conversation("Cut short")
        question = store.add_message(conversation.id, "user", "Count to five.", None)
        store.add_message(conversation.id, "assistant", "One, two,", question.id)  # finish_reason never written
    window = open_window(ScriptedBackend(replies=[" three, four, five."]))
    [_, reply] = window.chat_model.items()
    assert reply.finish_reason == "interrupted" and reply.content == "One, two,"
    widget = window.chat_view.widgets()[1]
    assert "interrupted" in widget.stats_label.text() and widget.continue_button.isVisibleTo(window)
    with qtbot.waitSignal(window.model_ready, timeout=10_000):
        window.load_model(window.model_bar.request())
    with qtbot.waitSignal(window.reply_finished, timeout=10_000):
        window.chat.continue_reply(reply.message_id)
    assert window.chat_model.items()[1].content == "One, two, three, four, five."
    assert window.chat_model.items()[1].finish_reason == "stop"


def test_saving_settings_over_a_rejected_file_keeps_that_file(open_window: Any) -> None:
    path = settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b'{"trust_remote_code": "false", "theme": 3}')
    found = read_settings()
    window = open_window(settings=found.settings, settings_file_rejected=not found.ok)
    window.apply_settings(window.settings.with_changes(theme="dark"))
    kept = path.with_name("settings.json.rejected")
    assert kept.read_bytes() == b'{"trust_remote_code": "false", "theme": 3}'
    assert f"The file Hearth could not read is kept at {kept}" in window.banner.label.text()
    assert read_settings().ok and read_settings().settings.theme == "dark"


@dataclasses.dataclass
class NoticingBackend(ScriptedBackend):
    """A backend whose reply ends with a notice, as the engine's does after dropping a damaged cache entry."""

    def generate(self, *args: Any, **kwargs: Any) -> Iterator[Event]:
        for event in super().generate(*args, **kwargs):
            if isinstance(event, DoneEvent):
                event = dataclasses.replace(event, notices=("A damaged entry in the response cache was dropped.",))
            yield event


def test_notices_from_the_backend_reach_the_banner(open_window: Any, qtbot: Any) -> None:
    backend = NoticingBackend()
    backend.info = dataclasses.replace(backend.info, recovered=("The response cache was damaged and rebuilt.",))
    window = open_window(backend)
    with qtbot.waitSignal(window.model_ready, timeout=10_000):
        window.load_model(window.model_bar.request())
    assert "The response cache was damaged and rebuilt." in window.banner.label.text()
    with qtbot.waitSignal(window.reply_finished, timeout=10_000):
        window.chat.send("Hi")
    qtbot.waitUntil(lambda: "entry in the response cache was dropped" in window.banner.label.text(), timeout=5000)


def test_hearth_gui_starts_with_a_damaged_settings_file_and_history(tmp_path: Path) -> None:
    """The real entry point, in its own process: both problems in the banner, both files untouched."""
    (tmp_path / "config").mkdir()
    (tmp_path / "data").mkdir()
    settings_bytes = b'{"trust_remote_code": "false", "mystery": 1}'
    (tmp_path / "config" / "settings.json").write_bytes(settings_bytes)
    history_bytes = random_bytes(32 * 1024)
    (tmp_path / "data" / "history.sqlite").write_bytes(history_bytes)
    result = run_gui_and_probe(
        tmp_path,
        "print('BANNER=' + w.banner.label.text().replace(chr(10), ' '))\n"
        "print('OPT_IN=' + str(w.settings.trust_remote_code))",
    )
    assert result.returncode == 0, result.stderr
    banner = next(line for line in result.stdout.splitlines() if line.startswith("BANNER="))
    assert 'trust_remote_code must be true or false (got "false"), so it stays off' in banner
    assert "unknown setting mystery ignored" in banner
    assert "is not a SQLite database" in banner
    assert "OPT_IN=False" in result.stdout
    assert (tmp_path / "config" / "settings.json").read_bytes() == settings_bytes
    assert (tmp_path / "data" / "history.sqlite").read_bytes() == history_bytes
