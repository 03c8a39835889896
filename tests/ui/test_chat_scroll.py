"""Where the chat is scrolled (issue 27, points 5 and 6): a message sent while reading further up comes into view with
its reply, and Edit opens with its text in view, in a box as tall as the text."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QWidget

from app.core.engines.backend import ScriptedBackend
from app.ui.chat_view import ChatView
from app.ui.main_window import MainWindow

LONG = " ".join(f"word{i}" for i in range(160))


def shown_in_chat(view: ChatView, widget: QWidget) -> bool:
    """The widget's top line is inside the chat's visible area."""
    top = widget.mapTo(view.viewport(), widget.rect().topLeft()).y()
    return widget.isVisible() and top >= 0 and top + widget.fontMetrics().lineSpacing() <= view.viewport().height()


def long_chat(make_window, qtbot, backend: ScriptedBackend) -> MainWindow:  # type: ignore[no-untyped-def]
    window = make_window(backend)
    window.resize(1366, 740)
    for i in range(4):
        with qtbot.waitSignal(window.reply_finished, timeout=10_000):
            window.chat.send(f"Question {i}")
    assert window.chat_view.verticalScrollBar().maximum() > 0  # long enough to scroll
    return window


def test_a_message_sent_while_scrolled_up_comes_into_view(make_window, qtbot) -> None:
    backend = ScriptedBackend(replies=[LONG] * 4 + ["A slow reply " * 40])
    window = long_chat(make_window, qtbot, backend)
    backend.tokens_per_s = 60  # only the last reply streams slowly: it is still streaming when checked
    view = window.chat_view
    view.verticalScrollBar().setValue(0)  # the user scrolled up to read an earlier answer
    qtbot.wait(20)
    window.input_box.editor.setPlainText("One more question")
    qtbot.keyClick(window.input_box.editor, Qt.Key.Key_Return)
    sent = view.widgets()[-2]
    assert sent.item.content == "One more question"
    qtbot.waitUntil(lambda: shown_in_chat(view, sent), timeout=2_000)  # while the reply streams, not after
    assert window.chat.reply is not None
    qtbot.waitUntil(lambda: view.verticalScrollBar().value() == view.verticalScrollBar().maximum(), timeout=2_000)
    with qtbot.waitSignal(window.reply_finished, timeout=20_000):
        pass


def test_edit_opens_with_its_text_in_view_in_a_box_as_tall_as_the_text(make_window, qtbot) -> None:
    window = long_chat(make_window, qtbot, ScriptedBackend(replies=[LONG] * 4))
    view = window.chat_view
    qtbot.wait(20)  # the view follows the end of the chat
    message = view.widgets()[-2]  # the last question, near the bottom
    message.edit_button.click()
    qtbot.wait(50)
    editor = message.editor
    assert editor.toPlainText() == "Question 3"
    assert shown_in_chat(view, editor)  # was: scrolled past its own text, an empty box in view
    assert editor.verticalScrollBar().value() == 0
    line = editor.fontMetrics().lineSpacing()
    assert editor.height() <= 5 * line  # one line of text: no tall empty box under it
    assert message.save_edit.isVisible() and view.viewport().rect().contains(
        message.save_edit.mapTo(view.viewport(), message.save_edit.rect().bottomRight())
    )


def test_a_long_message_edits_in_a_box_that_scrolls_inside_the_chat(make_window, qtbot) -> None:
    window = long_chat(make_window, qtbot, ScriptedBackend(replies=[LONG] * 5))
    text = "\n".join(f"line {i}" for i in range(80))
    with qtbot.waitSignal(window.reply_finished, timeout=10_000):
        window.chat.send(text)
    view = window.chat_view
    message = view.widgets()[-2]
    view.verticalScrollBar().setValue(view.verticalScrollBar().maximum())
    message.edit_button.click()
    qtbot.wait(50)
    editor = message.editor
    assert shown_in_chat(view, editor)
    assert editor.height() <= view.viewport().height() * 0.6 + 1  # the box scrolls, the chat does not grow past
    assert editor.verticalScrollBar().maximum() > 0 and editor.verticalScrollBar().value() == 0


def test_a_long_line_of_code_wraps_inside_its_box_instead_of_being_cut(make_window, qtbot) -> None:
    code = "def kv_cache_bytes(layers: int, kv_heads: int, head_dim: int, tokens: int, dtype_bytes: int = 2) -> int:"
    window = make_window(ScriptedBackend(replies=[f"```python\n{code}\n    return 0\n```"]))
    window.resize(960, 600)
    with qtbot.waitSignal(window.reply_finished, timeout=10_000):
        window.chat.send("Show me the function")
    qtbot.wait(20)
    body = window.chat_view.widgets()[-1].body
    assert "dtype_bytes" in body.toPlainText()
    assert body.document().size().width() <= body.viewport().width() + 1  # nothing runs past the right edge
