"""The window end to end over a scripted backend: send, stream, stop, regenerate, branch, continue, delete,
persistence, export/import and errors."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication

from app.core.chat.sampling import SamplingParams
from app.core.engines.backend import ScriptedBackend
from app.core.errors import ContextOverflowError, HearthError
from app.core.settings import Settings
from app.core.storage.history import HistoryStore
from app.ui.chat_model import Roles
from app.ui.main_window import MainWindow

LONG_REPLY = " ".join(f"word{i}" for i in range(400))


def send(window: MainWindow, qtbot, text: str, timeout: int = 10_000) -> str:  # type: ignore[no-untyped-def]
    with qtbot.waitSignal(window.reply_finished, timeout=timeout) as blocker:
        window.input_box.editor.setPlainText(text)
        qtbot.keyClick(window.input_box.editor, Qt.Key.Key_Return)
    return str(blocker.args[0])


def rows(window: MainWindow) -> list[tuple[str, str]]:
    return [(item.role, item.content) for item in window.chat_model.items()]


def test_send_streams_reply_with_stats_and_saves_it(make_window, qtbot) -> None:
    backend = ScriptedBackend(replies=["Hello **there**, friend."])
    window = make_window(backend)
    assert send(window, qtbot, "Hi") == "stop"
    assert rows(window) == [("user", "Hi"), ("assistant", "Hello **there**, friend.")]
    # the engine got the system prompt and the user message
    assert [(m.role, m.content) for m in backend.calls[0]] == [("system", "You are terse."), ("user", "Hi")]
    reply = window.chat_model.item(1)
    assert reply.stats is not None and reply.stats["generated_tokens"] == 3
    widget = window.chat_view.widgets()[1]
    stats_text = widget.stats_label.text()
    assert (
        "first token" in stats_text and "cached" in stats_text and "decode" in stats_text and "finished" in stats_text
    )
    assert "<b>there</b>" in widget.body.toHtml() or "font-weight:700" in widget.body.toHtml()
    stored = window.store.active_branch(window.conversation_id)
    assert [(m.role, m.content, m.finish_reason) for m in stored] == [
        ("user", "Hi", None),
        ("assistant", "Hello **there**, friend.", "stop"),
    ]
    assert stored[1].stats is not None and stored[1].stats["generated_tokens"] == 3
    assert window.sidebar.list.count() == 1 and window.sidebar.list.item(0).text() == "Hi"
    # the memory panel got live readings and the context gauge a split
    assert window.memory_panel.reading is not None and window.memory_panel.reading.devices[0].weights_bytes > 0
    usage = window.memory_panel.usage
    assert usage is not None and usage.system > 0 and usage.current == 1 and usage.reply == 3


def test_shift_enter_inserts_a_new_line_and_does_not_send(make_window, qtbot) -> None:
    window = make_window()
    window.input_box.editor.setPlainText("line one")
    window.input_box.editor.moveCursor(window.input_box.editor.textCursor().MoveOperation.End)
    qtbot.keyClick(window.input_box.editor, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    assert window.input_box.text() == "line one\n"
    assert window.chat_model.rowCount() == 0


def test_stop_keeps_partial_reply_and_send_becomes_stop(make_window, qtbot) -> None:
    window = make_window(ScriptedBackend(replies=[LONG_REPLY], tokens_per_s=200))
    window.input_box.editor.setPlainText("Talk a lot")
    qtbot.keyClick(window.input_box.editor, Qt.Key.Key_Return)
    assert window.input_box.button.text() == "Stop"
    qtbot.waitUntil(lambda: len(window.chat_model.item(1).content) > 20, timeout=5000)
    with qtbot.waitSignal(window.reply_finished, timeout=5000) as blocker:
        qtbot.keyClick(window.input_box.editor, Qt.Key.Key_Escape)
    assert blocker.args == ["cancelled"]
    assert window.input_box.button.text() == "Send"
    item = window.chat_model.item(1)
    assert 0 < len(item.content) < len(LONG_REPLY) and LONG_REPLY.startswith(item.content)
    stored = window.store.get_message(item.message_id)
    assert stored.finish_reason == "cancelled" and stored.content == item.content
    assert "stopped by you" in window.chat_view.widgets()[1].stats_label.text()


def test_streaming_appends_batches_without_rerendering(make_window, qtbot) -> None:
    window = make_window(ScriptedBackend(replies=[LONG_REPLY], tokens_per_s=400))
    changes: list[list[int]] = []
    window.chat_model.dataChanged.connect(lambda top, bottom, roles: changes.append(list(roles)))
    assert send(window, qtbot, "Go") == "stop"
    text_updates = [r for r in changes if r == [int(Roles.Text)]]
    # 400 tokens arrive as far fewer batches (one dataChanged per 40 ms flush, text role only)
    assert 2 <= len(text_updates) < 200
    assert window.chat_model.item(1).content == LONG_REPLY


def test_regenerate_adds_a_sibling_and_both_stay_reachable(make_window, qtbot) -> None:
    backend = ScriptedBackend(replies=["First answer.", "Second answer."])
    window = make_window(backend)
    send(window, qtbot, "Question")
    first_id = window.chat_model.item(1).message_id
    with qtbot.waitSignal(window.reply_finished, timeout=10_000):
        window.chat_view.widgets()[1].regenerate_button.click()
    assert rows(window)[1] == ("assistant", "Second answer.")
    assert (window.chat_model.item(1).sibling_index, window.chat_model.item(1).sibling_count) == (1, 2)
    widget = window.chat_view.widgets()[1]
    assert widget.branch_label.text() == "2 / 2" and widget.prev_branch.isVisible()
    widget.prev_branch.click()
    assert window.chat_model.item(1).message_id == first_id
    assert rows(window)[1] == ("assistant", "First answer.")


def test_edit_resends_as_a_branch(make_window, qtbot) -> None:
    backend = ScriptedBackend(replies=["About cats.", "About dogs."])
    window = make_window(backend)
    send(window, qtbot, "Tell me about cats")
    original_user = window.chat_model.item(0).message_id
    widget = window.chat_view.widgets()[0]
    widget.edit_button.click()
    assert widget.editor.isVisible() and widget.editor.toPlainText() == "Tell me about cats"
    widget.editor.setPlainText("Tell me about dogs")
    with qtbot.waitSignal(window.reply_finished, timeout=10_000):
        widget.save_edit.click()
    assert rows(window) == [("user", "Tell me about dogs"), ("assistant", "About dogs.")]
    assert [m.content for m in backend.calls[-1]] == ["You are terse.", "Tell me about dogs"]
    assert window.chat_model.item(0).sibling_count == 2
    window.chat.switch_branch(window.chat_model.item(0).message_id, -1)
    assert window.chat_model.item(0).message_id == original_user
    assert rows(window) == [("user", "Tell me about cats"), ("assistant", "About cats.")]


def test_continue_extends_a_reply_cut_at_the_length_limit(make_window, qtbot) -> None:
    backend = ScriptedBackend(replies=["one two three four five six"])
    window = make_window(backend, settings=Settings(sampling=SamplingParams(max_new_tokens=3)))
    assert send(window, qtbot, "Count") == "length"
    widget = window.chat_view.widgets()[1]
    assert widget.continue_button.isVisible() and "length limit" in widget.stats_label.text()
    message_id = window.chat_model.item(1).message_id
    with qtbot.waitSignal(window.reply_finished, timeout=10_000):
        widget.continue_button.click()
    assert backend.prefixes[-1] == "one two three"
    assert window.chat_model.rowCount() == 2 and window.chat_model.item(1).message_id == message_id
    assert window.chat_model.item(1).content == "one two threeone two three"
    assert window.store.get_message(message_id).content == "one two threeone two three"


def test_delete_removes_message_and_what_follows(make_window, qtbot) -> None:
    window = make_window(ScriptedBackend(replies=["A.", "B."]))
    send(window, qtbot, "first")
    send(window, qtbot, "second")
    assert len(rows(window)) == 4
    window.chat_view.widgets()[2].delete_button.click()
    assert rows(window) == [("user", "first"), ("assistant", "A.")]
    assert len(window.store.active_branch(window.conversation_id)) == 2


def test_copy_message_and_code_block(make_window, qtbot) -> None:
    reply = "Here:\n\n```python\nprint('hi')\n```\n\nand\n\n```\nplain\n```\n"
    window = make_window(ScriptedBackend(replies=[reply]))
    send(window, qtbot, "code please")
    widget = window.chat_view.widgets()[1]
    assert widget.code_blocks == ("print('hi')", "plain")
    assert "copy:1" in widget.body.toHtml()
    from PySide6.QtCore import QUrl

    widget.body.anchorClicked.emit(QUrl("copy:0"))
    assert QGuiApplication.clipboard().text() == "print('hi')"
    widget.copy_button.click()
    assert QGuiApplication.clipboard().text() == reply


def test_context_overflow_shows_message_in_chat_and_app_stays_usable(make_window, qtbot) -> None:
    backend = ScriptedBackend(replies=["Fine."], error_before_first=ContextOverflowError(5000, 2048))
    window = make_window(backend)
    assert send(window, qtbot, "too long") == "error"
    assert rows(window)[0] == ("user", "too long")
    assert rows(window)[-1][0] == "error" and "context window is 2,048 tokens" in rows(window)[-1][1]
    # no empty assistant message was left behind
    assert [m.role for m in window.store.active_branch(window.conversation_id)] == ["user"]
    backend.error_before_first = None
    assert send(window, qtbot, "short") == "stop"
    assert rows(window)[-1] == ("assistant", "Fine.")


def test_crash_mid_stream_keeps_partial_text_and_says_so(make_window, qtbot) -> None:
    window = make_window(ScriptedBackend(replies=["a b c d e f"], fail_mid_stream=3))
    assert send(window, qtbot, "go") == "error"
    assert rows(window)[1] == ("assistant", "a b c")
    assert rows(window)[2] == ("error", "RuntimeError: scripted failure")
    assert window.store.get_message(window.chat_model.item(1).message_id).finish_reason == "error"


def test_unexpected_exception_in_worker_becomes_a_chat_message(make_window, qtbot) -> None:
    window = make_window(ScriptedBackend(error_before_first=RuntimeError("GPU on fire")))
    assert send(window, qtbot, "hi") == "error"
    assert rows(window)[-1] == ("error", "Unexpected error: RuntimeError: GPU on fire")


def test_sending_without_a_model_says_so_and_keeps_the_text(make_window, qtbot) -> None:
    window = make_window(load=False)
    window.input_box.editor.setPlainText("hello?")
    qtbot.keyClick(window.input_box.editor, Qt.Key.Key_Return)
    assert rows(window) == [("error", "No model is loaded: load one from the model bar first.")]
    assert window.input_box.text() == "hello?"


def test_load_failure_is_shown_and_message_sent_while_loading_gets_its_reply(make_window, qtbot) -> None:
    gate = threading.Event()
    backend = ScriptedBackend(replies=["Loaded and answering."])

    def slow_factory(request, progress, cancel):  # type: ignore[no-untyped-def]
        progress("Loading weights", 0.5)
        gate.wait(10)
        if request.model == "missing":
            raise HearthError("No model named 'missing' was found.")
        return backend

    window = make_window(load=False, factory=slow_factory)
    window.model_bar.model_combo.setCurrentText("missing")
    window.load_model(window.model_bar.request())
    assert window.model_bar.cancel_button.isVisibleTo(window)
    gate.set()
    qtbot.waitUntil(lambda: window.banner.isVisible(), timeout=5000)
    assert window.banner.label.text() == "No model named 'missing' was found."
    assert window.model_bar.load_button.text() == "Load"

    gate.clear()
    window.model_bar.model_combo.setCurrentIndex(0)
    window.load_model(window.model_bar.request())
    window.input_box.editor.setPlainText("early question")
    qtbot.keyClick(window.input_box.editor, Qt.Key.Key_Return)
    assert rows(window) == [("user", "early question")]
    with qtbot.waitSignal(window.reply_finished, timeout=10_000):
        gate.set()
    assert rows(window)[-1] == ("assistant", "Loaded and answering.")


def test_cancel_load(make_window, qtbot) -> None:
    started = threading.Event()

    def cancellable(request, progress, cancel):  # type: ignore[no-untyped-def]
        started.set()
        while not cancel.wait(0.01):
            progress("Loading weights", None)
        raise HearthError("Loading was cancelled.")

    window = make_window(load=False, factory=cancellable)
    window.load_model(window.model_bar.request())
    assert started.wait(5)
    window.model_bar.cancel_button.click()
    qtbot.waitUntil(lambda: window.banner.isVisible(), timeout=5000)
    assert window.banner.label.text() == "Loading was cancelled."
    assert window.model_info is None and not window.model_bar.progress.isVisible()


def test_history_persists_across_a_restart_of_the_window(make_window, qtbot) -> None:
    window = make_window(ScriptedBackend(replies=["Remembered."]))
    send(window, qtbot, "Remember me")
    conversation_id = window.conversation_id
    window.close()
    again = make_window(ScriptedBackend(replies=["x"]))
    assert again.conversation_id == conversation_id
    assert rows(again) == [("user", "Remember me"), ("assistant", "Remembered.")]
    assert "finished" in again.chat_view.widgets()[1].stats_label.text()


def test_reply_is_saved_while_streaming(make_window, qtbot) -> None:
    window = make_window(ScriptedBackend(replies=[LONG_REPLY], tokens_per_s=150))
    window.input_box.editor.setPlainText("stream")
    qtbot.keyClick(window.input_box.editor, Qt.Key.Key_Return)
    message_id = window.chat_model.item(1).message_id
    # a second connection, like a restarted app, sees the partial reply within about a second
    reader = HistoryStore()
    qtbot.waitUntil(lambda: len(reader.get_message(message_id).content) > 0, timeout=5000)
    partial = reader.get_message(message_id)
    assert partial.finish_reason is None and LONG_REPLY.startswith(partial.content)
    reader.close()
    with qtbot.waitSignal(window.reply_finished, timeout=10_000):
        window.chat.stop()


def test_quitting_mid_reply_stops_generation_and_keeps_the_text(make_window, qtbot) -> None:
    window = make_window(ScriptedBackend(replies=[LONG_REPLY], tokens_per_s=100))
    window.input_box.editor.setPlainText("long one")
    qtbot.keyClick(window.input_box.editor, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: len(window.chat_model.item(1).content) > 10, timeout=5000)
    message_id = window.chat_model.item(1).message_id
    window.close()
    assert not window.host.worker_thread.isRunning()
    saved = HistoryStore().get_message(message_id)
    assert saved.finish_reason == "cancelled" and LONG_REPLY.startswith(saved.content) and saved.content


def test_conversations_new_rename_search_delete(make_window, qtbot) -> None:
    window = make_window(ScriptedBackend(replies=["ok"]))
    send(window, qtbot, "About apples")
    window.new_conversation()
    assert window.chat_model.rowCount() == 0
    send(window, qtbot, "About pears")
    assert window.sidebar.list.count() == 2
    pears = window.conversation_id
    window.chat.rename_conversation(pears, "Pear talk")
    assert window.store.get_conversation(pears).title == "Pear talk"
    window.sidebar.search.setText("apple")
    assert [window.sidebar.list.item(i).text() for i in range(window.sidebar.list.count())] == ["About apples"]
    window.sidebar.search.clear()
    window.delete_conversation(pears)
    assert window.conversation_id is None and window.chat_model.rowCount() == 0
    assert [c.title for c in window.store.list_conversations()] == ["About apples"]


def test_rename_to_empty_title_shows_the_error(make_window, qtbot) -> None:
    window = make_window()
    send(window, qtbot, "hello")
    window.chat.rename_conversation(window.conversation_id, "   ")
    assert window.banner.isVisible() and "title cannot be empty" in window.banner.label.text()


def test_export_markdown_json_and_import(make_window, qtbot, tmp_path: Path) -> None:
    window = make_window(ScriptedBackend(replies=["Paris."]))
    send(window, qtbot, "Capital of France?")
    window.transfer.export_conversation(tmp_path / "c.md", "md")
    window.transfer.export_conversation(tmp_path / "c.json", "json")
    markdown = (tmp_path / "c.md").read_text(encoding="utf-8")
    assert "Capital of France?" in markdown and "Paris." in markdown
    data = json.loads((tmp_path / "c.json").read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    window.transfer.import_conversation(tmp_path / "c.json")
    assert window.sidebar.list.count() == 2
    assert rows(window) == [("user", "Capital of France?"), ("assistant", "Paris.")]


def test_export_without_conversation_and_bad_import_are_reported(make_window, qtbot, tmp_path: Path) -> None:
    window = make_window()
    with pytest.raises(HearthError, match="no conversation to export"):
        window.transfer.export_conversation(tmp_path / "x.md", "md")
    window.transfer.export_dialog("md")
    assert window.banner.label.text() == "There is no conversation to export: open or start one first."
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(HearthError, match="not valid JSON"):
        window.transfer.import_conversation(bad)
    assert window.store.list_conversations() == []


def test_browsing_while_a_reply_streams_and_sending_is_refused(make_window, qtbot) -> None:
    window = make_window(ScriptedBackend(replies=["Short.", LONG_REPLY], tokens_per_s=150))
    send(window, qtbot, "older chat")
    older = window.conversation_id
    window.new_conversation()
    window.input_box.editor.setPlainText("busy")
    qtbot.keyClick(window.input_box.editor, Qt.Key.Key_Return)
    busy = window.conversation_id
    qtbot.waitUntil(lambda: len(window.chat_model.item(1).content) > 10, timeout=5000)
    window.chat.open_conversation(older)  # browsing is fine: the reply keeps streaming into its own conversation
    assert rows(window) == [("user", "older chat"), ("assistant", "Short.")]
    window.chat.send("another question")
    assert window.banner.label.text() == "A reply is being generated: stop it first (Esc)."
    window.chat.open_conversation(busy)
    shown = window.chat_model.item(1)
    assert shown.streaming and LONG_REPLY.startswith(shown.content) and len(shown.content) > 10
    with qtbot.waitSignal(window.reply_finished, timeout=10_000):
        window.chat.stop()
    final = window.chat_model.item(1).content
    assert (
        LONG_REPLY.startswith(final) and window.store.get_message(window.chat_model.item(1).message_id).content == final
    )


def test_settings_change_theme_and_sampling(make_window, qtbot) -> None:
    window = make_window(ScriptedBackend(replies=["a b c d e"]))
    window.apply_settings(window.settings.with_changes(theme="dark", sampling=SamplingParams(max_new_tokens=2)))
    assert window.palette_.name == "dark"
    assert send(window, qtbot, "x") == "length"
    assert window.chat_model.item(1).content == "a b"


def test_attached_document_goes_to_the_model_and_into_history(make_window, qtbot, tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("The launch code is 4321.", encoding="utf-8")
    backend = ScriptedBackend(replies=["It is 4321.", "Still 4321."])
    window = make_window(backend)
    qtbot.waitUntil(lambda: window.attachments is not None, timeout=5000)
    window.attachments.add_paths([notes])
    qtbot.waitUntil(lambda: not window.attachments.busy and len(window.attachments.documents()) == 1, timeout=10_000)
    assert send(window, qtbot, "What is the launch code?") == "stop"
    sent = backend.calls[-1][-1]
    assert sent.role == "user" and "The launch code is 4321." in sent.content
    assert sent.content.endswith("What is the launch code?") and 'name="notes.txt"' in sent.content
    stored = window.store.active_branch(window.conversation_id)[0]
    assert stored.content == "What is the launch code?" and [a.name for a in stored.attachments] == ["notes.txt"]
    assert "attached: notes.txt" in window.chat_view.widgets()[0].role_label.text()
    assert window.attachments.documents() == []  # the bar is cleared once the message went out
    # the same document is not sent a second time in the same conversation
    window.attachments.add_paths([notes])
    qtbot.waitUntil(lambda: not window.attachments.busy and len(window.attachments.documents()) == 1, timeout=10_000)
    send(window, qtbot, "Sure?")
    assert window.store.active_branch(window.conversation_id)[2].attachments == ()
    assert backend.calls[-1][1].content.count("4321") == 1  # in the first message only
