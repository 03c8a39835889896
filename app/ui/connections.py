"""Connections: remote engines (an OpenAI-compatible server, OpenAI, Anthropic) added, tested and removed.

A dialog over app.core.engines.remote.engines: name, base URL and an optional API key (saved to the OS keyring,
never to a file), presets for the common servers, the server's models from GET /v1/models, and a connection test
(the same probe as `hearth engines test`). Network calls run on a TaskRunner (app/ui/tasks.py); results come back
to the GUI thread through a queued signal.

Signals: engine_saved(str) (an engine was added or changed; its name), engine_removed(str).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QSize, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.core.engines.remote import engines as registry
from app.core.engines.remote.backend import RemoteBackend, probe_engine
from app.core.errors import HearthError
from app.ui.dialogs import fit_to_screen
from app.ui.tasks import TaskRunner

_KEEP_KEY = "(saved in the keyring — leave empty to keep it)"
NO_ENGINES_HINT = (
    "No remote engines yet. Choose a preset on the right, give the engine a name (and its URL and key if the preset "
    "has none), test it, then Save."
)
NO_MODELS_HINT = "List models asks the server which models it serves; choose one as this engine's default."


def _models(count: int) -> str:
    return f"{count:,} model" + ("" if count == 1 else "s")


def _caption(text: str) -> QLabel:
    label = QLabel(text)
    label.setObjectName("SectionTitle")
    return label


def _hint(text: str) -> QLabel:
    label = QLabel(text)
    label.setObjectName("Hint")
    label.setWordWrap(True)
    return label


class ConnectionsDialog(QDialog):
    engine_saved = Signal(str)
    engine_removed = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Connections")
        self._tasks = TaskRunner("connections", parent=self)
        layout = QHBoxLayout(self)

        left = QVBoxLayout()
        left.addWidget(_caption("Engines"))
        self.engine_list = QListWidget()
        self.engine_list.currentTextChanged.connect(self._show_engine)
        left.addWidget(self.engine_list, 1)
        self.engines_hint = _hint(NO_ENGINES_HINT)
        left.addWidget(self.engines_hint)
        self.new_button = QPushButton("New")
        self.new_button.clicked.connect(self._new)
        self.remove_button = QPushButton("Remove")
        self.remove_button.clicked.connect(self._remove)
        buttons = QHBoxLayout()
        buttons.addWidget(self.new_button)
        buttons.addWidget(self.remove_button)
        left.addLayout(buttons)
        layout.addLayout(left, 1)

        right = QVBoxLayout()
        form = QFormLayout()
        self.preset = QComboBox()
        for key, preset in registry.PRESETS.items():
            self.preset.addItem(preset.label, key)
        self.preset.setCurrentIndex(list(registry.PRESETS).index("custom"))
        self.preset.activated.connect(self._apply_preset)
        form.addRow("Preset", self.preset)
        self.name = QLineEdit()
        self.name.setPlaceholderText("e.g. gpu-box")
        form.addRow("Name", self.name)
        self.url = QLineEdit(registry.PRESETS["custom"].base_url)
        form.addRow("Base URL", self.url)
        self.key = QLineEdit()
        self.key.setEchoMode(QLineEdit.EchoMode.Password)
        self.key.setPlaceholderText("optional: kept in the system keyring only")
        form.addRow("API key", self.key)
        self.include_usage = QCheckBox("Ask for token usage in streams (stream_options)")
        self.include_usage.setChecked(True)
        form.addRow("", self.include_usage)
        self.response_cache = QCheckBox("Replay identical greedy replies from the response cache")
        form.addRow("", self.response_cache)
        self.hint = QLabel(registry.PRESETS["custom"].hint)
        self.hint.setWordWrap(True)
        form.addRow("", self.hint)
        right.addLayout(form)

        actions = QHBoxLayout()
        self.list_button = QPushButton("List models")
        self.list_button.clicked.connect(self.list_models)
        self.test_button = QPushButton("Test connection")
        self.test_button.clicked.connect(self.test_connection)
        self.save_button = QPushButton("Save")
        self.save_button.clicked.connect(self.save)
        for button in (self.list_button, self.test_button, self.save_button):
            actions.addWidget(button)
        right.addLayout(actions)
        self.status = QLabel("")  # right under the buttons: a test's result is read where it was asked for
        self.status.setObjectName("ConnectionStatus")
        self.status.setWordWrap(True)
        right.addWidget(self.status)
        right.addWidget(_caption("Models on the server"))
        self.models = QListWidget()
        right.addWidget(self.models, 1)
        self.models_hint = _hint(NO_MODELS_HINT)
        right.addWidget(self.models_hint)
        layout.addLayout(right, 2)
        self._price_provider: str | None = None
        self._kind: registry.EngineKind = "openai-compatible"
        self.refresh()
        fit_to_screen(self, QSize(760, 480))

    # --- the list ---------------------------------------------------------------------------------------------

    def refresh(self) -> None:
        found = registry.read_engines()
        self.engine_list.clear()
        self.engine_list.addItems([e.name for e in found.engines])
        self.engines_hint.setVisible(not found.engines)
        if not found.ok:
            self._say(found.problems[0], error=True)
            self.save_button.setEnabled(False)  # the file is the user's to fix: never saved over

    def _show_engine(self, name: str) -> None:
        engine = registry.read_engines().get(name)
        if engine is None:
            return
        self.name.setText(engine.name)
        self.url.setText(engine.base_url)
        self.key.clear()
        self.key.setPlaceholderText(_KEEP_KEY if engine.key_name else "optional: kept in the system keyring only")
        self.include_usage.setChecked(engine.include_usage)
        self.response_cache.setChecked(engine.response_cache)
        self._kind = engine.kind
        self._price_provider = engine.price_provider

    def _new(self) -> None:
        self.engine_list.clearSelection()
        self.name.clear()
        self.key.clear()
        self._apply_preset(self.preset.currentIndex())

    def _apply_preset(self, index: int) -> None:
        preset = registry.PRESETS[str(self.preset.itemData(index))]
        self.url.setText(preset.base_url)
        self.include_usage.setChecked(preset.include_usage)
        self.response_cache.setChecked(preset.response_cache)
        self.hint.setText(preset.hint)
        self._kind = preset.kind
        self._price_provider = preset.price_provider

    # --- building an engine from the form -----------------------------------------------------------------------

    def _engine(self) -> registry.EngineConfig:
        name = self.name.text().strip()
        if not name:
            raise HearthError("Give the connection a name.")
        existing = registry.read_engines().get(name)
        key_name = registry.key_name_for(name) if self.key.text().strip() or (existing and existing.key_name) else None
        return registry.EngineConfig(
            name=name,
            kind=self._kind,
            base_url=self.url.text().strip().rstrip("/"),
            key_name=key_name,
            include_usage=self.include_usage.isChecked(),
            response_cache=self.response_cache.isChecked(),
            default_model=self.models.currentItem().text() if self.models.currentItem() else None,
            price_provider=self._price_provider,
        )

    def _key(self, engine: registry.EngineConfig) -> str | None:
        typed = self.key.text().strip()
        if typed:
            return typed
        return registry.read_key(engine.key_name) if engine.key_name else None

    def save(self) -> None:
        try:
            engine = self._engine()
            if self.key.text().strip():
                registry.save_key(engine.key_name or "", self.key.text())
            registry.add_engine(engine, replace=True)
        except HearthError as exc:
            self._say(str(exc), error=True)
            return
        self.key.clear()
        self.refresh()
        self._say(f"Saved {engine.name!r}" + (" (key in the system keyring)." if engine.key_name else "."))
        self.engine_saved.emit(engine.name)

    def _remove(self) -> None:
        item = self.engine_list.currentItem()
        if item is None:
            return
        name = item.text()
        try:
            registry.remove_engine(name)
        except HearthError as exc:
            self._say(str(exc), error=True)
            return
        self.refresh()
        self._say(f"Removed {name!r} and its key.")
        self.engine_removed.emit(name)

    # --- network work off the GUI thread ------------------------------------------------------------------------

    def list_models(self) -> None:
        self._start("models", lambda backend: backend.list_models())

    def test_connection(self) -> None:
        def probe(backend: RemoteBackend) -> Any:
            if not backend.model:
                models = backend.list_models()
                if not models:
                    raise HearthError("The server lists no models at GET /v1/models.")
                backend.model = models[0]
            return probe_engine(backend)

        self._start("test", probe)

    def _start(self, job: str, work: Callable[[RemoteBackend], Any]) -> None:
        try:
            engine = self._engine()
            key = self._key(engine)
        except HearthError as exc:
            self._say(str(exc), error=True)
            return
        model = self.models.currentItem().text() if self.models.currentItem() else ""
        self._busy(True)
        self._say("Connecting…")

        def run() -> Any:
            backend = RemoteBackend(engine, model or "?", api_key=key, timeout_s=20.0)
            if not model:
                backend.model = ""
            try:
                return work(backend)
            finally:
                backend.close()

        def failed(exc: BaseException) -> None:
            # never a traceback in the window
            self._finished(job, None, str(exc) if isinstance(exc, HearthError) else f"{type(exc).__name__}: {exc}")

        self._tasks.run(job, run, lambda result: self._finished(job, result, ""), failed)

    def _finished(self, job: str, result: object, error: str) -> None:
        self._busy(False)
        if error:
            self._say(error, error=True)
            return
        if job == "models":
            assert isinstance(result, list)
            self.models.clear()
            self.models.addItems(result)
            self.models_hint.setVisible(not result)
            self._say(f"{_models(len(result))} at GET /v1/models.")
        else:
            assert isinstance(result, tuple)
            models, reply = result
            self._say(f"Connection works: {_models(len(models))}; test reply {reply.strip()!r}.")

    def _busy(self, busy: bool) -> None:
        for button in (self.list_button, self.test_button):
            button.setEnabled(not busy)

    def _say(self, text: str, *, error: bool = False) -> None:
        self.status.setText(text)
        self.status.setProperty("error", error)

    def wait_idle(self, timeout_s: float = 30.0) -> None:
        """For tests and closing: wait for the network jobs to end and report."""
        self._tasks.wait(timeout_s)
