"""A full disk while a reply finishes: the window says which messages are not saved, retries, says when they are,
and asks before closing with any still held back."""

from __future__ import annotations

from typing import Any

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox

from app.core.engines.backend import ScriptedBackend
from app.ui import unsaved
from tests.helpers.full_disk import FullDiskConnection

REPLY = " ".join(f"word{i}" for i in range(60))


def reply_on_a_full_disk(make_window: Any, qtbot: Any) -> tuple[Any, Any]:
    """A window whose reply finished while the history's disk was full; (window, the real connection)."""
    window = make_window(ScriptedBackend(replies=[REPLY], tokens_per_s=150))
    window.input_box.editor.setPlainText("Talk a while")
    qtbot.keyClick(window.input_box.editor, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: window.chat_model.rowCount() == 2, timeout=5000)
    real = window.store._db
    window.store._db = FullDiskConnection(real)
    qtbot.waitUntil(lambda: window.input_box.button.text() == "Send", timeout=10_000)
    return window, real


def test_a_reply_held_back_by_a_full_disk_is_said_retried_and_saved(make_window: Any, qtbot: Any) -> None:
    window, real = reply_on_a_full_disk(make_window, qtbot)
    notice = window.store.unsaved_notice()
    assert notice.startswith("1 message is not saved yet: ") and "is full" in notice
    assert notice in window.banner.label.text() and window.banner.isVisible()
    assert window.unsaved.timer.isActive()
    window.unsaved.retry()  # still full: still said, still retrying
    assert window.unsaved.timer.isActive() and notice in window.banner.label.text()

    window.store._db = real  # space is back
    window.unsaved.retry()
    assert not window.unsaved.timer.isActive()
    assert notice not in window.banner.label.text() and unsaved.SAVED_LINE in window.banner.label.text()
    assert window.store.unsaved_notice() == ""
    message_id = window.chat_model.item(1).message_id
    row = real.execute("SELECT content FROM messages WHERE id = ?", (message_id,)).fetchone()
    assert row[0] == REPLY


@pytest.mark.parametrize(
    ("answer", "closes"), [(QMessageBox.StandardButton.Cancel, False), (QMessageBox.StandardButton.Discard, True)]
)
def test_closing_with_unsaved_messages_asks_first(
    make_window: Any, qtbot: Any, monkeypatch: pytest.MonkeyPatch, answer: QMessageBox.StandardButton, closes: bool
) -> None:
    window, real = reply_on_a_full_disk(make_window, qtbot)
    asked: list[str] = []

    def warning(parent: Any, title: str, text: str, *args: Any) -> QMessageBox.StandardButton:
        asked.append(text)
        return answer

    monkeypatch.setattr(unsaved.QMessageBox, "warning", warning)
    assert window.close() is closes
    assert len(asked) == 1 and asked[0].startswith("1 message is not saved yet")
    assert window.isVisible() is not closes
    if not closes:  # the fixture closes it at the end: nothing held back by then
        window.store._db = real
        assert window.store.save_pending()


def test_closing_retries_first_and_asks_nothing_once_saved(
    make_window: Any, qtbot: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    window, real = reply_on_a_full_disk(make_window, qtbot)
    monkeypatch.setattr(unsaved.QMessageBox, "warning", lambda *args: pytest.fail("asked although nothing was lost"))
    window.store._db = real
    assert window.close()
