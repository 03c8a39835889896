"""The Connections dialog, offscreen, against a real HTTP server on 127.0.0.1 and an in-memory keyring."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from pytestqt.qtbot import QtBot

from app.core.engines.remote import engines as registry
from app.ui.connections import ConnectionsDialog
from tests.helpers import memory_keyring
from tests.helpers.replay_server import ReplayServer

KEY = "sk-dialog-test-key-123456789"


@pytest.fixture
def keys() -> Iterator[memory_keyring.MemoryKeyring]:
    with memory_keyring.installed(memory_keyring.MemoryKeyring()) as backend:
        yield backend  # type: ignore[misc]


@pytest.fixture
def replay() -> Iterator[ReplayServer]:
    with ReplayServer().running() as server:
        yield server


@pytest.fixture
def dialog(qtbot: QtBot) -> Iterator[ConnectionsDialog]:
    widget = ConnectionsDialog()
    qtbot.addWidget(widget)
    yield widget
    widget.wait_idle()


def choose_preset(dialog: ConnectionsDialog, key: str) -> None:
    index = dialog.preset.findData(key)
    dialog.preset.setCurrentIndex(index)
    dialog.preset.activated.emit(index)


def test_presets_fill_the_form(dialog: ConnectionsDialog) -> None:
    choose_preset(dialog, "ollama")
    assert dialog.url.text() == "http://127.0.0.1:11434/v1" and dialog.response_cache.isChecked()
    choose_preset(dialog, "openai")
    assert dialog.url.text() == "https://api.openai.com/v1" and not dialog.response_cache.isChecked()
    assert "platform.openai.com" in dialog.hint.text()


def test_list_models_test_and_save_with_a_key(
    dialog: ConnectionsDialog, qtbot: QtBot, replay: ReplayServer, keys: memory_keyring.MemoryKeyring
) -> None:
    replay.models = ["alpha", "beta"]
    dialog.name.setText("box")
    dialog.url.setText(replay.base_url)
    dialog.key.setText(KEY)
    dialog.list_models()
    qtbot.waitUntil(lambda: dialog.models.count() == 2, timeout=20_000)
    assert dialog.status.text() == "2 models at GET /v1/models."
    assert replay.requests[-1].headers["authorization"] == f"Bearer {KEY}"
    dialog.models.setCurrentRow(1)
    replay.queue_file("ollama_stream.sse")
    dialog.test_connection()
    qtbot.waitUntil(lambda: dialog.status.text().startswith("Connection works"), timeout=20_000)
    assert "test reply 'Hi there'" in dialog.status.text()
    assert replay.requests[-1].body is not None and replay.requests[-1].body["model"] == "beta"
    with qtbot.waitSignal(dialog.engine_saved) as saved:
        dialog.save()
    assert saved.args == ["box"]
    engine = registry.load_engines().get("box")
    assert engine is not None and engine.default_model == "beta" and engine.key_name == "engine-key:box"
    assert keys.store[("hearth", "engine-key:box")] == KEY
    assert KEY not in registry.engines_path().read_text() and dialog.key.text() == ""
    assert [dialog.engine_list.item(i).text() for i in range(dialog.engine_list.count())] == ["box"]


def test_remove_takes_the_key_too(dialog: ConnectionsDialog, qtbot: QtBot, keys: memory_keyring.MemoryKeyring) -> None:
    dialog.name.setText("gone")
    dialog.key.setText(KEY)
    dialog.save()
    dialog.engine_list.setCurrentRow(0)
    assert dialog.key.placeholderText().startswith("(saved in the keyring")
    with qtbot.waitSignal(dialog.engine_removed) as removed:
        dialog.remove_button.click()
    assert removed.args == ["gone"] and ("hearth", "engine-key:gone") not in keys.store
    assert dialog.engine_list.count() == 0


def test_errors_show_in_the_dialog(dialog: ConnectionsDialog, qtbot: QtBot) -> None:
    dialog.save()
    assert dialog.status.text() == "Give the connection a name."
    dialog.name.setText("x")
    dialog.url.setText("gpu-box:8000")
    dialog.save()
    assert "base URL must start with http:// or https://" in dialog.status.text()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dialog.url.setText(f"http://127.0.0.1:{port}/v1")
    dialog.list_models()
    qtbot.waitUntil(lambda: "connection refused" in dialog.status.text(), timeout=20_000)
    assert dialog.list_button.isEnabled()


def test_a_damaged_engines_file_is_shown_and_never_saved_over(qtbot: QtBot) -> None:
    registry.engines_path().write_text("{not json")
    widget = ConnectionsDialog()
    qtbot.addWidget(widget)
    assert "is not valid JSON" in widget.status.text() and not widget.save_button.isEnabled()
    assert registry.engines_path().read_text() == "{not json"
