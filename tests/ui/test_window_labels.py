"""What the window's figures and labels say, and the keyboard (issue 27, points 7, 8 and 12, and its keyboard list):
the model's name read from its start, the context gauge on a first message and after a relaunch, the memory panel
while the chosen model is checked, a sidebar that keeps its width, menu shortcuts, focus back in the input."""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QMenu
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from app.core.engines.backend import ModelInfo, ScriptedBackend, scripted_factory
from app.core.fastpath.compile_notice import COMPILE_NOTICE, say_compiling
from app.core.settings import Settings
from app.core.storage.history import HistoryStore
from app.ui.main_window import MainWindow
from app.ui.memory_panel import PLAN_PENDING, MemoryPanel
from app.ui.model_bar import DEFAULT_LABEL, ModelBar
from app.ui.theme import LIGHT
from tests.ui.conftest import fake_planner

LONG_STATUS = "Converting SmolLM2-135M-Instruct.Q4_1.gguf once (cached for later launches)…"


@dataclass
class CountingBackend(ScriptedBackend):
    """A scripted model with a tokenizer.json for the window to count with. Like the real engine, its reply's figures
    count the chat template's tokens (4 a message here) with the history."""

    tokenizer_file: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self.info = replace(self.info, tokenizer_file=self.tokenizer_file)


def word_tokenizer(folder: Path) -> str:
    """A real tokenizers.json: one token per word (the window's counter loads it with the tokenizers library)."""
    words = ["hi", "hello", "how", "are", "you", "tell", "me", "about", "cats", "dogs", "sure"]
    tokenizer = Tokenizer(WordLevel({word: i for i, word in enumerate(["[UNK]", *words])}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    path = folder / "tokenizer.json"
    tokenizer.save(str(path))
    return str(path)


def labels(panel: MemoryPanel) -> dict[str, float]:
    return {segment.label: segment.value for segment in panel.context_bar.segments}


@pytest.mark.qt_log_ignore(  # the offscreen platform, as in conftest.py, and its popup
    "This plugin does not support propagateSizeHints",
    "This plugin does not support raise",
    "This plugin does not support grabbing the keyboard",
)
def test_the_models_name_reads_from_its_start_in_the_box_and_whole_in_the_list(qtbot) -> None:
    bar = ModelBar(Settings())
    qtbot.addWidget(bar)
    bar.show()
    combo = bar.model_combo
    combo.setFixedWidth(150)  # narrower than "SmolLM2-135M-Instruct (built in)"
    qtbot.wait(10)
    assert combo.currentText() == DEFAULT_LABEL
    assert combo.lineEdit().cursorPosition() == 0  # shows "SmolLM2-1…", not "M-Instruct (built in)"
    assert DEFAULT_LABEL in combo.toolTip()
    path = "/home/user/models/Qwen2.5-Coder-14B-Instruct-GGUF/qwen2.5-coder-14b-instruct-q4_k_m.gguf"
    bar.set_local_models([path])
    combo.showPopup()
    needed = combo.view().fontMetrics().horizontalAdvance(path)
    assert combo.view().width() >= needed  # the list is as wide as its longest name: nothing cut in its middle
    combo.hidePopup()
    combo.setCurrentIndex(combo.findText(path))  # chosen from the list
    assert combo.lineEdit().cursorPosition() == 0


def test_a_first_message_counts_the_chat_templates_tokens_as_such_not_as_history(make_window, qtbot) -> None:
    window = make_window(ScriptedBackend(replies=["Sure."]))
    with qtbot.waitSignal(window.reply_finished, timeout=10_000):
        window.chat.send("Tell me about cats")
    segments = labels(window.memory_panel)
    usage = window.memory_panel.usage
    assert usage is not None and usage.history > 0  # the template's tokens: was shown as "History 8 tok"
    assert segments["Chat template"] == usage.history and "History" not in segments
    assert "no earlier turns" in window.memory_panel.context_bar.toolTip()
    with qtbot.waitSignal(window.reply_finished, timeout=10_000):
        window.chat.send("And dogs?")
    assert "History" in labels(window.memory_panel)  # earlier turns now, with the template's tokens


def test_a_reopened_conversation_shows_its_context_once_the_model_loads(qtbot, tmp_path: Path) -> None:
    history = tmp_path / "history.sqlite"
    tokenizer = word_tokenizer(tmp_path)

    def launch() -> MainWindow:
        window = MainWindow(
            Settings(system_prompt="You are terse."),
            store=HistoryStore(history),
            backend_factory=scripted_factory(CountingBackend(replies=["Sure."], tokenizer_file=tokenizer)),
            planner=fake_planner,  # type: ignore[arg-type]
            autoload=False,
            save_settings_to_disk=False,
        )
        qtbot.addWidget(window)
        window.show()
        return window

    first = launch()
    with qtbot.waitSignal(first.model_ready, timeout=20_000):
        first.load_model(first.model_bar.request())
    for text in ("Tell me about cats", "how are you"):
        with qtbot.waitSignal(first.reply_finished, timeout=10_000):
            first.chat.send(text)
    first.close()

    second = launch()  # the last conversation is open, its gauge empty until a model can count it
    assert second.conversation_id is not None and second.memory_panel.usage is None
    with qtbot.waitSignal(second.model_ready, timeout=20_000):
        second.load_model(second.model_bar.request())
    qtbot.waitUntil(lambda: second.memory_panel.usage is not None, timeout=5_000)
    usage = second.memory_panel.usage
    assert usage is not None and (usage.current, usage.reply) == (3, 2)  # "how are you", "Sure" "."
    assert usage.history == 4 + 2 and usage.system == 4  # "Tell me about cats", "Sure" "."; "You are terse"
    assert second.memory_panel.context_bar.caption.startswith("about ")
    assert "History" in labels(second.memory_panel)
    second.close()


def test_the_memory_panel_checks_the_chosen_model_while_it_loads(make_window, qtbot) -> None:
    gate = threading.Event()

    def slow_planner(request: Any) -> Any:
        gate.wait(10)
        return fake_planner(request)

    assert MemoryPanel(LIGHT).plan_label.text() == PLAN_PENDING  # never "Choose a model…": one always is
    window = make_window(load=False, planner=slow_planner)
    qtbot.wait(500)  # the plan is asked for after the first paint (and a 300 ms debounce)
    assert window.memory_panel.plan_label.text() == PLAN_PENDING
    gate.set()
    qtbot.waitUntil(lambda: "Fits in memory" in window.memory_panel.plan_label.text(), timeout=10_000)


def test_a_first_kernel_compile_while_planning_is_said_in_the_panel_and_the_model_bar(make_window, qtbot) -> None:
    gate = threading.Event()

    def compiling_planner(request: Any) -> Any:
        say_compiling()  # what the kernel module does before its one compile, on the worker's thread
        gate.wait(10)
        return fake_planner(request)

    window = make_window(load=False, planner=compiling_planner)
    window.chat.model_loading()  # a load asked for at launch waits behind the plan in the worker's queue
    qtbot.waitUntil(lambda: COMPILE_NOTICE in window.memory_panel.plan_label.text(), timeout=10_000)
    assert window.memory_panel.plan_label.text() == f"{PLAN_PENDING} {COMPILE_NOTICE}"
    assert window.model_bar.status.full_text() == COMPILE_NOTICE
    assert window.model_bar.progress.maximum() == 0  # a busy bar: no fraction is known
    gate.set()
    qtbot.waitUntil(lambda: "Fits in memory" in window.memory_panel.plan_label.text(), timeout=10_000)


def test_a_first_kernel_compile_while_loading_is_said_in_the_panel_whose_plan_waits_behind_the_load(
    make_window, qtbot
) -> None:
    compiled, gate = threading.Event(), threading.Event()
    scripted = scripted_factory(ScriptedBackend())

    def compiling_load(request: Any, progress: Any, cancel: Any) -> Any:
        progress(COMPILE_NOTICE, None)  # what open_backend says when the kernel module is about to compile
        compiled.set()
        gate.wait(10)
        progress("Reading the weights…", 0.5)
        return scripted(request, progress, cancel)

    window = make_window(load=False, factory=compiling_load)
    window.load_model(window.model_bar.request())  # before the first paint: the plan is queued behind the load
    assert compiled.wait(10)
    qtbot.waitUntil(lambda: COMPILE_NOTICE in window.memory_panel.plan_label.text(), timeout=10_000)
    qtbot.wait(500)  # the plan is asked for after the first paint and a 300 ms debounce: it keeps the stage
    assert window.memory_panel.plan_label.text() == f"{PLAN_PENDING} {COMPILE_NOTICE}"
    assert window.model_bar.status.full_text() == COMPILE_NOTICE
    gate.set()  # the compile is over: the load's next stage is not the plan's to say
    qtbot.waitUntil(lambda: "Fits in memory" in window.memory_panel.plan_label.text(), timeout=10_000)
    panel = MemoryPanel(LIGHT)
    panel.load_stage(COMPILE_NOTICE)
    panel.load_stage("Reading the weights…")
    assert panel.plan_label.text() == PLAN_PENDING
    panel.set_plan_message("No plan")
    panel.load_stage(COMPILE_NOTICE)  # no plan is waiting: nothing to say
    assert panel.plan_label.text() == "No plan"


def test_the_sidebar_keeps_its_width_while_a_model_loads_and_after(make_window, qtbot) -> None:
    window = make_window(load=False)
    window.resize(1366, 740)
    qtbot.wait(20)
    before = window.sidebar.width()
    window.model_bar.set_loading(LONG_STATUS, 0.4)
    qtbot.wait(20)
    loading = window.sidebar.width()
    window.model_bar.set_loaded(ModelInfo("SmolLM2-135M-Instruct", "q4_1", "cpu", 8192))
    qtbot.wait(20)
    assert before == loading == window.sidebar.width()


def test_menu_items_have_the_shortcuts_of_lm_studio_and_jan(make_window) -> None:
    window = make_window(load=False)
    shortcuts = {
        action.text(): action.shortcut().toString()
        for menu in window.menuBar().findChildren(QMenu)
        for action in menu.actions()
        if action.text()
    }
    expected = {
        "&New chat": "Ctrl+N",
        "&Quit": "Ctrl+Q",
        "S&top generating": "Esc",
        "&Settings…": "Ctrl+,",
        "&Choose model…": "Ctrl+L",
        "&Eject model": "Ctrl+E",
        "Model &library…": "Ctrl+Shift+M",
        "&Conversations": "Ctrl+B",
        "&Memory panel": "Ctrl+Shift+B",
    }
    assert {text: shortcuts.get(text) for text in expected} == expected


def test_the_shortcuts_act(make_window, qtbot) -> None:
    window = make_window()
    window.activateWindow()
    qtbot.waitActive(window)
    with qtbot.waitSignal(window.reply_finished, timeout=10_000):
        window.chat.send("Hi")
    qtbot.keyClick(window, Qt.Key.Key_B, Qt.KeyboardModifier.ControlModifier)
    assert not window.panels.sidebar_action.isChecked() and window.sidebar.compact
    qtbot.keyClick(window, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert window.conversation_id is None and window.input_box.editor.hasFocus()
    assert window.menus.eject_model.isEnabled()
    qtbot.keyClick(window, Qt.Key.Key_E, Qt.KeyboardModifier.ControlModifier)  # (the worker's signal is not waited
    # on here: it is emitted in the worker's thread)
    qtbot.waitUntil(lambda: window.model_info is None and not window.menus.eject_model.isEnabled(), timeout=10_000)


def test_focus_returns_to_the_input_after_send(make_window, qtbot) -> None:
    window = make_window()
    window.activateWindow()
    qtbot.waitActive(window)
    window.input_box.editor.setPlainText("Hi")
    with qtbot.waitSignal(window.reply_finished, timeout=10_000):
        qtbot.mouseClick(window.input_box.button, Qt.MouseButton.LeftButton)
    assert QApplication.focusWidget() is window.input_box.editor  # type the next message at once
