"""Remote engines in the main window: Models ▸ Connections…, the engines' models in the model bar (with the
library's local models, listed when the list opens), and the conversation's cost above the chat.

Choosing "MODEL @ ENGINE" needs nothing here: the model bar's LoadRequest names a RemoteModel and the worker's
open_backend returns a RemoteBackend, so the controller, the worker and the views treat it like a local model.
What is here is the window's side: listing each engine's models (GET /v1/models, off the GUI thread), opening
the Connections dialog, and summing the conversation's cost from the history after each reply.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QWidget

from app.core.engines.backend import RemoteModel
from app.core.engines.remote import engines as registry
from app.core.errors import HearthError
from app.ui.chat_controller import ChatController
from app.ui.cost import ConversationCostLabel
from app.ui.model_bar import ModelBar
from app.ui.tasks import TaskRunner

if TYPE_CHECKING:
    from app.ui.connections import ConnectionsDialog

log = logging.getLogger(__name__)
LIST_TIMEOUT_S = 5.0  # a server that does not answer GET /v1/models soon is listed by its default model only


def list_engine_models(engine: registry.EngineConfig) -> list[str]:
    """The engine's models (GET /v1/models), its default model first; HearthError (one sentence) on failure.
    Anthropic's listing needs a beta endpoint on some accounts: its default model stands for it. A priced (hosted)
    engine lists only the models its price list knows."""
    from app.core.engines.remote.backend import RemoteBackend

    if engine.kind == "anthropic":
        return [engine.default_model] if engine.default_model else []
    key = registry.read_key(engine.key_name) if engine.key_name else None
    backend = RemoteBackend(engine, engine.default_model or "?", api_key=key, timeout_s=LIST_TIMEOUT_S)
    try:
        listed = backend.list_models()
    finally:
        backend.close()
    if engine.price_provider is not None:
        # A hosted API lists every model it has (embeddings, audio, images…): keep those its price list knows.
        # Any other model can still be typed as "MODEL @ ENGINE".
        from app.core.engines.remote.pricing import TokenUsage, try_price_reply

        usage = TokenUsage(1, 0, 1)
        listed = [model for model in listed if try_price_reply(usage, model, engine.price_provider) is not None]
    first = [engine.default_model] if engine.default_model else []
    return first + [model for model in listed if model not in first]


def remote_destination(remote: RemoteModel) -> str:
    """Where a remote model's requests go, in words: "engine gpu-box (http://10.0.0.5:8000/v1)"."""
    engine = registry.read_engines().get(remote.engine)
    where = f" ({engine.base_url})" if engine is not None else ""
    return f"engine {remote.engine}{where}"


class RemoteModelList(QObject):
    """The registered engines' models. `refresh` lists the default models at once and then asks each server."""

    models_changed = Signal(list)  # list[RemoteModel]

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.tasks = TaskRunner("remote-models", parent=self)
        self.models: list[RemoteModel] = []
        self.problems: list[str] = []  # why an engine could not be listed (shown in the model list's tooltip)
        self._generation = 0

    def refresh(self) -> None:
        found = registry.read_engines()
        self._generation += 1
        generation = self._generation
        engines = list(found.engines)
        self.problems = list(found.problems)
        self._publish([RemoteModel(e.name, e.default_model) for e in engines if e.default_model])
        if not engines:
            return

        def job() -> dict[str, list[str] | str]:
            listed: dict[str, list[str] | str] = {}
            for engine in engines:
                try:
                    listed[engine.name] = list_engine_models(engine)
                except HearthError as exc:
                    listed[engine.name] = str(exc)
            return listed

        self.tasks.run("list", job, lambda listed: self._listed(generation, engines, listed))

    def _listed(self, generation: int, engines: list[registry.EngineConfig], listed: dict[str, Any]) -> None:
        if generation != self._generation:  # the engines changed meanwhile: a newer listing is on its way
            return
        models: list[RemoteModel] = []
        for engine in engines:
            result = listed.get(engine.name)
            if isinstance(result, str):
                log.info("listing the models of engine %s failed: %s", engine.name, result)
                self.problems.append(result)
                result = [engine.default_model] if engine.default_model else []
            models.extend(RemoteModel(engine.name, model) for model in result or [])
        self._publish(models)

    def _publish(self, models: list[RemoteModel]) -> None:
        self.models = models
        self.models_changed.emit(list(models))

    def shutdown(self) -> None:
        self.tasks.shutdown()


class RemoteEngines(QObject):
    """The remote-engine parts of a window, kept in step: it knows the model bar and the chat controller, never the
    window. The window puts `connections_action` in a menu, `cost_label` above the chat, and calls
    `model_list.refresh` once it has painted."""

    def __init__(self, model_bar: ModelBar, chat: ChatController, parent: QWidget) -> None:
        super().__init__(parent)
        self.parent_widget = parent  # the Connections dialog's parent
        self.model_bar = model_bar
        self.chat = chat
        self.model_list = RemoteModelList(parent=self)
        self.model_list.models_changed.connect(self._models_listed)
        self.library_tasks = TaskRunner("library-models", parent=self)
        self.dialog: ConnectionsDialog | None = None
        self.connections_action = QAction("&Connections…", parent)
        self.connections_action.setToolTip("Remote engines: vLLM, TGI, SGLang, Ollama, llama-server, hosted APIs")
        self.connections_action.triggered.connect(self.open_connections)
        self.cost_label = ConversationCostLabel()
        chat.conversations_changed.connect(self.update_cost)
        model_bar.model_combo.popup_opening.connect(self.list_local_models)

    def list_local_models(self) -> None:
        """The library's models (what Models ▸ Model library lists) join the model list."""
        from app.core.models import library

        def job() -> list[str]:
            return [m.spec for m in library.list_models() if m.kind != "default" and m.complete]

        def failed(exc: BaseException) -> None:  # an unreadable library: the list keeps what it has
            log.warning("listing the library's models failed: %s", exc)

        if not self.library_tasks.busy:  # one listing at a time
            self.library_tasks.run("library", job, self.model_bar.set_local_models, failed)

    def _models_listed(self, models: list[RemoteModel]) -> None:
        bar = self.model_bar
        bar.set_remote_models(models)
        about = "The built-in model, a folder, a .gguf file, a Hugging Face repo id, or MODEL @ ENGINE (remote)"
        bar.model_combo.set_about("\n".join([about, *self.model_list.problems]))

    def update_cost(self) -> None:
        """The open conversation's cost, summed from the history (every reply, every branch)."""
        conversation = self.chat.conversation_id
        self.cost_label.show_replies(self.chat.store.reply_stats(conversation) if conversation is not None else [])

    def open_connections(self) -> None:
        from app.ui.connections import ConnectionsDialog

        if self.dialog is None:
            dialog = ConnectionsDialog(self.parent_widget)
            dialog.engine_saved.connect(lambda _name: self.model_list.refresh())
            dialog.engine_removed.connect(lambda _name: self.model_list.refresh())
            dialog.finished.connect(self._connections_closed)
            self.dialog = dialog
        self.dialog.show()
        self.dialog.raise_()

    def _connections_closed(self, *args: object) -> None:
        dialog, self.dialog = self.dialog, None
        if dialog is not None:
            dialog.wait_idle()
            dialog.deleteLater()

    def shutdown(self) -> None:
        if self.dialog is not None:
            self.dialog.wait_idle()
            self.dialog.close()
        self.model_list.shutdown()
        self.library_tasks.shutdown()
