"""The chat controller: a send appends rows instead of rebuilding the conversation, so its cost (widgets built,
Markdown renders) is the same at 2 messages as at 20; the settings store's change signal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QWidget

from app.core.chat.sampling import SamplingParams
from app.core.engines.backend import LoadRequest, ScriptedBackend, scripted_factory
from app.core.settings import Settings
from app.core.storage.history import HistoryStore
from app.ui.chat_controller import ChatController
from app.ui.main_window import MainWindow
from app.ui.settings_store import SettingsStore
from app.ui.worker import WorkerHost

REPLY = "A reply with **bold** text and `code`."


def send(window: MainWindow, qtbot, text: str) -> str:  # type: ignore[no-untyped-def]
    with qtbot.waitSignal(window.reply_finished, timeout=10_000) as blocker:
        window.input_box.editor.setPlainText(text)
        qtbot.keyClick(window.input_box.editor, Qt.Key.Key_Return)
    return str(blocker.args[0])


def open_conversation_with(window: MainWindow, pairs: int) -> int:
    """A stored conversation of `pairs` finished question/answer pairs, opened in the window."""
    store = window.store
    conversation = store.create_conversation(f"{pairs} pairs")
    parent = None
    for index in range(pairs):
        question = store.add_message(conversation.id, "user", f"question {index}", parent)
        answer = store.add_message(
            conversation.id,
            "assistant",
            f"answer **{index}**",
            question.id,
            model="Scripted model",
            finish_reason="stop",
        )
        parent = answer.id
    window.chat.open_conversation(conversation.id)
    return conversation.id


def work_of_one_send(window: MainWindow, qtbot, pairs: int) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    view = window.chat_view
    open_conversation_with(window, pairs)
    assert window.chat_model.rowCount() == 2 * pairs
    view.widgets_built = view.markdown_renders = 0
    assert send(window, qtbot, "one more") == "stop"
    assert window.chat_model.rowCount() == 2 * pairs + 2
    return view.widgets_built, view.markdown_renders


def test_the_work_of_a_send_does_not_grow_with_the_conversation(make_window, qtbot) -> None:
    window = make_window(ScriptedBackend(replies=[REPLY]))
    short = work_of_one_send(window, qtbot, pairs=1)  # 2 messages
    long = work_of_one_send(window, qtbot, pairs=10)  # 20 messages
    # the question's row and the reply's row are built; only the finished reply is rendered as Markdown
    assert short == long == (2, 1)


def test_opening_a_conversation_rebuilds_it_once(make_window, qtbot) -> None:
    window = make_window()
    view = window.chat_view
    view.widgets_built = view.markdown_renders = 0
    open_conversation_with(window, pairs=10)
    assert (view.widgets_built, view.markdown_renders) == (20, 10)


def test_sending_keeps_the_widgets_of_earlier_messages(make_window, qtbot) -> None:
    window = make_window(ScriptedBackend(replies=["first", "second"]))
    send(window, qtbot, "one")
    before = window.chat_view.widgets()
    send(window, qtbot, "two")
    after = window.chat_view.widgets()
    assert len(after) == 4 and all(a is b for a, b in zip(before, after[:2], strict=True))


def test_regenerate_replaces_only_the_reply_row(make_window, qtbot) -> None:
    window = make_window(ScriptedBackend(replies=["first", "second"]))
    send(window, qtbot, "one")
    question_widget = window.chat_view.widgets()[0]
    view = window.chat_view
    view.widgets_built = view.markdown_renders = 0
    with qtbot.waitSignal(window.reply_finished, timeout=10_000):
        window.chat.regenerate(window.chat_model.item(1).message_id)
    assert window.chat_view.widgets()[0] is question_widget
    assert [(item.content, item.sibling_count) for item in window.chat_model.items()] == [("one", 1), ("second", 2)]
    assert (view.widgets_built, view.markdown_renders) == (1, 1)


def test_an_error_note_goes_away_with_the_next_send(make_window, qtbot) -> None:
    window = make_window(ScriptedBackend(replies=["ok"]), load=False)
    window.chat.send("nobody is listening")
    assert [item.role for item in window.chat_model.items()] == ["error"]
    with qtbot.waitSignal(window.model_ready, timeout=10_000):
        window.load_model(window.model_bar.request())
    send(window, qtbot, "now?")
    assert [(item.role, item.content) for item in window.chat_model.items()] == [("user", "now?"), ("assistant", "ok")]


def test_the_controller_reads_the_settings_store_at_each_request(make_window, qtbot) -> None:
    backend = ScriptedBackend(replies=["a b c d e"])
    window = make_window(backend)
    window.settings_store.update(system_prompt="Be brief.", sampling=SamplingParams(max_new_tokens=2))
    assert send(window, qtbot, "x") == "length"
    assert backend.calls[-1][0].content == "Be brief."


def test_the_controller_drives_a_chat_without_the_window(qtbot) -> None:
    """Input -> controller -> worker -> backend -> events -> rows, with no window: another front end (or a
    remote engine behind the same worker) plugs in at the controller."""
    backend = ScriptedBackend(replies=["Hi there."])
    owner = QWidget()  # deleted by qtbot on the GUI thread, with the host and the controller
    qtbot.addWidget(owner)
    host = WorkerHost(scripted_factory(backend), parent=owner)
    settings = SettingsStore(Settings(system_prompt=""), persist=False, parent=owner)
    controller = ChatController(HistoryStore(), settings, host, parent=owner)
    try:
        # the window's wiring: the worker's signals arrive queued, on the GUI thread
        host.worker.model_loaded.connect(controller.model_loaded, Qt.ConnectionType.QueuedConnection)
        host.load(LoadRequest(None))
        qtbot.waitUntil(lambda: controller.model_info is not None, timeout=10_000)
        generating: list[bool] = []
        controller.generating_changed.connect(generating.append)
        with qtbot.waitSignal(controller.reply_finished, timeout=10_000) as finished:
            controller.send("Hello")
        assert finished.args == ["stop"] and generating == [True, False]
        assert [(i.role, i.content) for i in controller.chat_model.items()] == [
            ("user", "Hello"),
            ("assistant", "Hi there."),
        ]
        stored = controller.store.active_branch(controller.conversation_id or -1)
        assert [(m.role, m.content, m.model) for m in stored] == [
            ("user", "Hello", None),
            ("assistant", "Hi there.", "Scripted model"),
        ]
        assert [(m.role, m.content) for m in backend.calls[0]] == [("user", "Hello")]
    finally:
        controller.close()
        assert host.shutdown()
        controller.store.close()


# -- the settings store ---------------------------------------------------------------------------------------------


def test_settings_store_emits_each_changed_key_once_and_saves(qtbot, tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    store = SettingsStore(Settings(), path=path)
    changed: list[str] = []
    store.changed.connect(changed.append)
    store.update(theme="dark", context_policy="drop-oldest", device="auto")  # device: unchanged
    assert changed == ["context_policy", "theme"]
    assert store.current.theme == "dark"
    assert json.loads(path.read_text(encoding="utf-8"))["theme"] == "dark"


def test_settings_store_refuses_a_bad_value_and_keeps_the_old_one(qtbot, tmp_path: Path) -> None:
    store = SettingsStore(Settings(), path=tmp_path / "settings.json")
    with pytest.raises(Exception, match="theme"):
        store.update(theme="purple")
    assert store.current.theme == "system" and not (tmp_path / "settings.json").exists()


def test_settings_store_says_when_it_cannot_save(qtbot, tmp_path: Path) -> None:
    blocked = tmp_path / "settings.json"
    blocked.mkdir()  # a folder where the file should be
    store = SettingsStore(Settings(), path=blocked)
    notices: list[str] = []
    store.notice.connect(notices.append)
    store.update(theme="dark")
    assert store.current.theme == "dark"  # the window keeps working with the new value
    assert len(notices) == 1 and notices[0].startswith("The settings could not be saved:")


def test_settings_store_keeps_a_rejected_file_before_saving(qtbot, tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text('{"theme": "purple"}', encoding="utf-8")
    store = SettingsStore(Settings(), path=path, file_rejected=True)
    notices: list[str] = []
    store.notice.connect(notices.append)
    store.update(theme="dark")
    kept = tmp_path / "settings.json.rejected"
    assert kept.read_text(encoding="utf-8") == '{"theme": "purple"}'
    assert notices == [f"Settings saved. The file Hearth could not read is kept at {kept}."]
    store.update(theme="light")
    assert len(notices) == 1  # kept once


def test_the_model_bar_follows_the_settings_store(make_window, qtbot) -> None:
    window = make_window(load=False)
    window.settings_store.update(model="/models/elsewhere.gguf")
    assert window.model_bar.model_combo.currentText() == "/models/elsewhere.gguf"
