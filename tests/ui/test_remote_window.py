"""Remote engines in the window, offscreen with real widgets: the model bar lists an engine's models, picking one
loads a RemoteBackend through the worker's own load path, replies stream from a real HTTP server on 127.0.0.1
(recorded vLLM shapes) with their cost, and a conversation moves between a local model and a remote one."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.core.engines.backend import ChatBackend, LoadRequest, ScriptedBackend, scripted_factory
from app.core.engines.remote import engines as registry
from app.core.settings import Settings
from app.ui.connections import ConnectionsDialog
from app.ui.main_window import MainWindow
from app.ui.model_bar import DEFAULT_LABEL
from app.ui.settings_dialog import SettingsDialog
from app.ui.worker import default_backend_factory
from tests.helpers import memory_keyring
from tests.helpers.replay_server import ReplayServer
from tests.ui.test_attachment_links import linked_files, read

KEY = "sk-window-test-KEY-0c1d2e3f4a5b"
REMOTE = "gpt-4o-mini @ hosted"
# vllm_stream.sse reports 1,200 prompt tokens (1,152 cached) and 4 completion tokens. gpt-4o-mini's list prices:
# $0.15 / M input, $0.075 / M cached input, $0.60 / M output: 48 x 0.15 + 1,152 x 0.075 + 4 x 0.6 = $96 / 1e6.
VLLM_REPLY_USD = 96e-6


@pytest.fixture
def keys() -> Iterator[memory_keyring.MemoryKeyring]:
    with memory_keyring.installed(memory_keyring.MemoryKeyring()) as backend:
        yield backend  # type: ignore[misc]


@pytest.fixture
def replay() -> Iterator[ReplayServer]:
    with ReplayServer().running() as server:
        server.models = ["gpt-4o-mini", "gpt-4.1-mini", "my-finetune-zz9"]
        yield server


@pytest.fixture
def hosted(replay: ReplayServer, keys: memory_keyring.MemoryKeyring) -> registry.EngineConfig:
    """An engine priced as OpenAI, with its key in the (in-memory) keyring."""
    registry.save_key(registry.key_name_for("hosted"), KEY)
    engine = registry.EngineConfig(
        name="hosted", base_url=replay.base_url, key_name=registry.key_name_for("hosted"), price_provider="openai"
    )
    registry.add_engine(engine)
    return engine


def mixed_factory(local: ScriptedBackend) -> Any:
    """The scripted model for local loads; the real open_backend for remote ones."""
    scripted = scripted_factory(local)
    real = default_backend_factory()

    def load(request: LoadRequest, progress: Any, cancel: threading.Event) -> ChatBackend:
        return real(request, progress, cancel) if request.remote is not None else scripted(request, progress, cancel)

    return load


def send(window: MainWindow, qtbot: QtBot, text: str) -> str:
    with qtbot.waitSignal(window.reply_finished, timeout=20_000) as blocker:
        window.input_box.editor.setPlainText(text)
        qtbot.keyClick(window.input_box.editor, Qt.Key.Key_Return)
    return str(blocker.args[0])


def choose(window: MainWindow, qtbot: QtBot, label: str) -> None:
    """Pick a model in the model bar and press Load (Unload first when one is loaded)."""
    bar = window.model_bar
    if label != DEFAULT_LABEL:  # picked from the list (the listing's own GET /v1/models is over)
        qtbot.waitUntil(lambda: label in listed(window), timeout=20_000)
        window.remote.model_list.tasks.wait()
    if bar.loaded is not None:
        qtbot.mouseClick(bar.load_button, Qt.MouseButton.LeftButton)  # "Unload"
        qtbot.waitUntil(lambda: bar.loaded is None, timeout=10_000)
    bar.model_combo.setCurrentText(label)
    with qtbot.waitSignal(window.model_ready, timeout=120_000):
        qtbot.mouseClick(bar.load_button, Qt.MouseButton.LeftButton)


def listed(window: MainWindow) -> list[str]:
    return [model.label for model in window.model_bar.remote_models()]


def stats_line(window: MainWindow, row: int) -> str:
    return window.chat_view.widgets()[row].stats_label.text()


def test_a_remote_model_picked_in_the_window_streams_its_reply_with_the_cost(
    make_window: Any, qtbot: QtBot, replay: ReplayServer, hosted: registry.EngineConfig, hearth_home: Path
) -> None:
    replay.metrics = 'vllm:kv_cache_usage_perc{engine="0"} 0.125\n'
    window = make_window(load=False, factory=default_backend_factory())
    # sorted; a priced (hosted) engine lists only the models its price list knows
    qtbot.waitUntil(lambda: listed(window) == ["gpt-4.1-mini @ hosted", REMOTE], timeout=20_000)
    window.model_bar.model_combo.setCurrentText(REMOTE)
    assert not window.model_bar.quant_combo.isEnabled() and not window.model_bar.device_combo.isEnabled()
    qtbot.waitUntil(lambda: "runs on the remote engine 'hosted'" in window.memory_panel.plan_label.text())
    choose(window, qtbot, REMOTE)
    assert window.model_info is not None and window.model_info.name == REMOTE
    assert window.model_bar.status.full_text() == "Loaded: remote engine"
    assert REMOTE in window.model_bar.status.toolTip()
    panel = window.memory_panel
    qtbot.waitUntil(lambda: panel.reading is not None)  # the first reading follows the load
    assert panel.remote_label.text() == "remote: hosted KV cache 12% used (server /metrics)"
    assert not panel.remote_label.isHidden() and not panel.device_bars and panel.no_model.isHidden()

    replay.queue_file("vllm_stream.sse")
    assert send(window, qtbot, "What is the capital of France?") == "stop"
    assert [(i.role, i.content) for i in window.chat_model.items()] == [
        ("user", "What is the capital of France?"),
        ("assistant", "Paris is the capital."),
    ]
    sent = replay.requests[-1]
    assert sent.headers["authorization"] == f"Bearer {KEY}" and sent.body is not None
    assert sent.body["model"] == "gpt-4o-mini"
    reply = window.store.active_branch(window.conversation_id)[-1]
    assert reply.model == REMOTE  # which engine and model made it
    assert reply.stats is not None and reply.stats["cost"]["total_usd"] == pytest.approx(VLLM_REPLY_USD)
    line = stats_line(window, 1)
    assert "prompt 1,200 tok (1,152 cached / 48 new)" in line
    assert "cost ~$0.0001 on openai/gpt-4o-mini (estimate)" in line and "caching saved $0.0001" in line
    assert window.chat_view.widgets()[1].role_label.text() == REMOTE  # the reply's header names engine and model
    cost = window.remote.cost_label
    assert not cost.isHidden() and cost.text().startswith("This conversation cost ~$0.0001 (estimate, 1 priced reply)")

    replay.queue_file("vllm_stream.sse")
    assert send(window, qtbot, "And of Italy?") == "stop"
    history = [(m["role"], m["content"]) for m in replay.requests[-1].body["messages"]]  # type: ignore[index]
    assert ("assistant", "Paris is the capital.") in history  # the conversation so far was sent again
    assert cost.text().startswith("This conversation cost ~$0.0002 (estimate, 2 priced replies)")
    assert "re-sent history $" in cost.text()
    assert panel.context_bar.caption.endswith("(window unknown)")  # the server does not say its context window
    window.new_conversation()
    assert cost.isHidden()

    window.close()
    for path in hearth_home.rglob("*"):  # what the window wrote (history, engines.json, logs) never holds the key
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), f"engine key written to {path}"


def test_a_conversation_moves_between_a_local_and_a_remote_model(
    make_window: Any, qtbot: QtBot, replay: ReplayServer, hosted: registry.EngineConfig
) -> None:
    local = ScriptedBackend(replies=["Local answer."])
    window = make_window(local, factory=mixed_factory(local))
    assert send(window, qtbot, "First question") == "stop"
    qtbot.waitUntil(lambda: REMOTE in listed(window), timeout=20_000)
    choose(window, qtbot, REMOTE)
    replay.queue_file("vllm_stream.sse")
    assert send(window, qtbot, "Second question") == "stop"
    remote_saw = [(m["role"], m["content"]) for m in replay.requests[-1].body["messages"]]  # type: ignore[index]
    assert remote_saw[-3:] == [("user", "First question"), ("assistant", "Local answer."), ("user", "Second question")]
    choose(window, qtbot, DEFAULT_LABEL)
    assert send(window, qtbot, "Third question") == "stop"
    assert ("assistant", "Paris is the capital.") in [(m.role, m.content) for m in local.calls[-1]]
    branch = window.store.active_branch(window.conversation_id)
    assert [(m.role, m.model) for m in branch if m.role == "assistant"] == [
        ("assistant", "Scripted model"),
        ("assistant", REMOTE),
        ("assistant", "Scripted model"),
    ]
    assert "cost ~$" in stats_line(window, 3) and "cost" not in stats_line(window, 1)


@pytest.mark.parametrize(
    ("fixture", "status", "expected"),
    [
        ("openai_401.json", 401, "rejected the API key (401 Unauthorized)"),
        ("openai_404.json", 404, "has no model 'gpt-4o-mini' (404 Not Found"),
    ],
)
def test_a_failing_remote_says_so_once_in_the_chat(
    make_window: Any,
    qtbot: QtBot,
    replay: ReplayServer,
    hosted: registry.EngineConfig,
    fixture: str,
    status: int,
    expected: str,
) -> None:
    window = make_window(load=False, factory=default_backend_factory())
    choose(window, qtbot, REMOTE)
    replay.queue_file(fixture, status=status)
    assert send(window, qtbot, "Hi") == "error"
    items = window.chat_model.items()
    assert [i.role for i in items] == ["user", "error"]  # the empty reply was taken back
    assert expected in items[1].content and "Engine 'hosted'" in items[1].content
    assert "Traceback" not in items[1].content and not window.banner.isVisible()
    assert [m.role for m in window.store.active_branch(window.conversation_id)] == ["user"]


def test_a_missing_key_stops_the_load_with_one_sentence(make_window: Any, qtbot: QtBot, hosted: Any, keys: Any) -> None:
    keys.store.clear()
    window = make_window(load=False, factory=default_backend_factory())
    window.model_bar.model_combo.setCurrentText(REMOTE)
    qtbot.mouseClick(window.model_bar.load_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.banner.isVisible(), timeout=120_000)
    assert window.model_info is None and window.model_bar.status.full_text() == "Not loaded"
    assert "Engine 'hosted' needs an API key, but the system keyring has none for it" in window.banner.label.text()


def test_the_models_menu_opens_connections_and_a_saved_engine_joins_the_model_bar(
    make_window: Any, qtbot: QtBot, replay: ReplayServer, keys: Any
) -> None:
    window = make_window()
    action = next(a for a in window.models_menu.actions() if a.text() == "&Connections…")
    action.trigger()
    dialog = window.remote.dialog
    assert isinstance(dialog, ConnectionsDialog) and dialog.isVisible()
    dialog.name.setText("box")
    dialog.url.setText(replay.base_url)
    with qtbot.waitSignal(dialog.engine_saved):
        dialog.save()
    box = ["gpt-4.1-mini @ box", "gpt-4o-mini @ box", "my-finetune-zz9 @ box"]  # a local server: every model
    qtbot.waitUntil(lambda: listed(window) == box, timeout=20_000)
    dialog.engine_list.setCurrentRow(0)
    with qtbot.waitSignal(dialog.engine_removed):
        dialog.remove_button.click()
    qtbot.waitUntil(lambda: listed(window) == [], timeout=20_000)
    dialog.close()
    assert window.remote.dialog is None


def test_an_engine_that_cannot_be_listed_keeps_its_default_model(make_window: Any, qtbot: QtBot, keys: Any) -> None:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    registry.add_engine(registry.EngineConfig(name="down", base_url=f"http://127.0.0.1:{port}/v1", default_model="m"))
    window = make_window(load=False)
    qtbot.waitUntil(lambda: bool(window.remote.model_list.problems), timeout=20_000)
    window.remote.model_list.tasks.wait()
    assert listed(window) == ["m @ down"]
    assert "connection refused" in window.model_bar.model_combo.toolTip()


def test_the_compare_cost_setting_prices_local_replies(make_window: Any, qtbot: QtBot) -> None:
    backend = ScriptedBackend(replies=["One two three four."])
    window = make_window(backend)
    assert send(window, qtbot, "Hi") == "stop"
    assert "cost" not in stats_line(window, 1) and window.remote.cost_label.isHidden()  # off by default

    window.settings_store.update(compare_cost_with="openai/gpt-4o-mini")
    assert send(window, qtbot, "Again") == "stop"
    line = stats_line(window, 3)
    assert "would cost ~$0.0000 on openai/gpt-4o-mini (estimate)" in line
    stats = window.store.active_branch(window.conversation_id)[-1].stats
    assert stats is not None and stats["cost"]["hypothetical"] is True
    new = stats["prompt_tokens"] - stats["cached_tokens"]
    expected = (new * 0.15 + stats["cached_tokens"] * 0.075 + stats["generated_tokens"] * 0.6) / 1e6
    assert stats["cost"]["total_usd"] == pytest.approx(expected)
    assert "its 1 local reply would have cost ~$0.0000 hosted (estimate)" in window.remote.cost_label.text()

    window.settings_store.update(compare_cost_with="anthropic/claude-haiku-4-5")
    assert send(window, qtbot, "Once more") == "stop"
    assert "would cost ~$0.0000 on anthropic/claude-haiku-4-5 (estimate)" in stats_line(window, 5)
    assert not window.banner.isVisible()

    window.settings_store.update(compare_cost_with="openai/no-such-model")
    assert send(window, qtbot, "And again") == "stop"
    assert "cost" not in stats_line(window, 7)
    qtbot.waitUntil(window.banner.isVisible)
    assert window.banner.label.text().startswith("No price for openai/no-such-model in the genai-prices ")


def test_the_settings_dialog_edits_the_compare_cost_model(qtbot: QtBot) -> None:
    dialog = SettingsDialog(Settings())
    qtbot.addWidget(dialog)
    assert dialog.compare_cost.currentText() == "Off" and dialog.build().compare_cost_with is None
    dialog.compare_cost.setCurrentText("openai/gpt-4.1-mini")
    assert dialog.build().compare_cost_with == "openai/gpt-4.1-mini"
    dialog.compare_cost.setCurrentText("gpt-4.1-mini")
    dialog.accept()
    assert dialog.result_settings is None
    assert (
        dialog.error.text() == 'compare cost with must be provider/model, e.g. openai/gpt-4o-mini (got "gpt-4.1-mini")'
    )


def test_a_default_model_saved_as_model_at_engine_is_listed_once_and_loads_remotely(
    make_window: Any, qtbot: QtBot, replay: ReplayServer, hosted: registry.EngineConfig
) -> None:
    window = make_window(load=False, settings=Settings(model=REMOTE), factory=default_backend_factory())
    qtbot.waitUntil(lambda: REMOTE in listed(window), timeout=20_000)
    window.remote.model_list.tasks.wait()
    combo = window.model_bar.model_combo
    assert [combo.itemText(i) for i in range(combo.count())].count(REMOTE) == 1 and combo.currentText() == REMOTE
    with qtbot.waitSignal(window.model_ready, timeout=120_000):
        window.load_model(window.model_bar.request())  # what the autoload after the first paint does
    assert window.model_info is not None and window.model_info.name == REMOTE


@pytest.mark.qt_log_ignore(  # the offscreen platform, as in conftest.py, and its popup
    "This plugin does not support propagateSizeHints",
    "This plugin does not support raise",
    "This plugin does not support grabbing the keyboard",
)
def test_the_library_models_join_the_list_when_it_opens(make_window: Any, qtbot: QtBot, tmp_path: Path) -> None:
    from app.core.models import library

    folders = {}
    for name, weights in (("complete", True), ("paused-download", False)):
        folder = folders[name] = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text('{"model_type": "llama", "max_position_embeddings": 2048}')
        if weights:
            (folder / "model.safetensors").write_bytes(b"")
        library.add_path(folder)
    window = make_window(load=False)
    bar = window.model_bar
    assert bar.local_models() == []  # not listed at start: listing reads every model's config
    bar.model_combo.showPopup()
    qtbot.waitUntil(lambda: str(folders["complete"]) in bar.local_models(), timeout=30_000)
    bar.model_combo.hidePopup()
    assert str(folders["paused-download"]) not in bar.local_models()  # no weights yet: not loadable
    assert bar.model_combo.itemText(0) == DEFAULT_LABEL and bar.model_combo.currentText() == DEFAULT_LABEL
    bar.model_combo.setCurrentIndex(bar.model_combo.findText(str(folders["complete"])))
    assert bar.request().model == str(folders["complete"]) and bar.request().remote is None


def test_with_a_remote_model_the_attachments_say_which_files_leave_the_computer(
    make_window: Any,
    qtbot: QtBot,
    hosted: registry.EngineConfig,
    tmp_path: Path,
) -> None:
    window = make_window(factory=mixed_factory(ScriptedBackend()))
    qtbot.waitUntil(lambda: window.attachments is not None, timeout=5_000)
    plain, link, target = linked_files(tmp_path)
    read(qtbot, window.attachments, [plain, link])
    assert not window.attachments.destination_label.isVisible()  # the scripted model is local
    choose(window, qtbot, REMOTE)
    notice = window.attachments.destination_label
    assert notice.isVisible()
    assert f"for engine hosted ({hosted.base_url}) when sent" in notice.text() and str(target) in notice.text()
    window.unload_model()
    qtbot.waitUntil(lambda: not notice.isVisible(), timeout=10_000)
