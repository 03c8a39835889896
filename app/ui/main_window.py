"""The main window: the composition root of the GUI (store, worker host, views) and the chat flow.

The window owns the HistoryStore (GUI thread) and a WorkerHost; the worker only sees GenerateRequests with the
messages to send, and streams plain data back. Streamed text is buffered and flushed to the chat model every
40 ms, and saved to the store about once a second, so a killed app loses at most the last second of a reply.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

from PySide6.QtCore import QObject, Qt, QTimer, Signal, Slot
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence, QPaintEvent
from PySide6.QtWidgets import (
    QApplication,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QMessageBox,
    QPushButton,
    QSplitter,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.core.backend import BackendFactory, ContextUsage, LoadRequest, MemoryReading, ModelInfo, ReplyRequest
from app.core.errors import HearthError
from app.core.events import ChatMessage, ReplyStats
from app.core.history import HistoryDamagedError, HistoryError, HistoryStore, Message, default_history_path
from app.core.settings import Settings, keep_rejected_file, save_settings
from app.core.token_counter import load_token_counter
from app.ui import theme
from app.ui.chat_model import ChatItem, ChatModel
from app.ui.chat_view import ChatView
from app.ui.conversations import ConversationList
from app.ui.input_box import InputBox
from app.ui.memory_panel import MemoryPanel
from app.ui.model_bar import ModelBar
from app.ui.settings_dialog import SettingsDialog
from app.ui.worker import GenerateRequest, Planner, WorkerHost

log = logging.getLogger(__name__)

FLUSH_EVERY_MS = 40  # streamed text reaches the view in batches (30–50 ms)
SAVE_EVERY_S = 1.0  # a streaming reply is written to the database this often
PLAN_DEBOUNCE_MS = 300
TITLE_LENGTH = 48


@dataclass
class ActiveReply:
    request: GenerateRequest
    conversation_id: int
    message_id: int
    created: bool  # a new message (deleted again if nothing was generated); False when continuing one
    prefix: str
    text: str
    buffer: list[str] = field(default_factory=list)
    tokens: int = 0
    last_saved: float = field(default_factory=time.monotonic)
    stats: ReplyStats | None = None
    usage: ContextUsage | None = None
    final_usage: ContextUsage | None = None


class ErrorBridge(QObject):
    """Carries errors from any thread (crash hooks) to the GUI thread."""

    error = Signal(str, str)

    def report(self, message: str, details: str) -> None:
        self.error.emit(message, details)


class Banner(QWidget):
    """A dismissible notice above the chat: errors the user should see without a modal dialog. Messages that
    arrive while it is showing stack up (a start-up can have several); an optional button offers the fix."""

    def __init__(self) -> None:
        super().__init__()
        self.setObjectName("ErrorCard")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(12, 6, 6, 6)
        self.label = QLabel()
        self.label.setObjectName("ErrorText")
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.label, 1)
        self.action_button = QPushButton()
        self.action_button.hide()
        self.action_button.clicked.connect(self._run_action)
        layout.addWidget(self.action_button)
        close = QToolButton()
        close.setText("✕")
        close.clicked.connect(self.dismiss)
        layout.addWidget(close)
        self.messages: list[str] = []
        self._action: Callable[[], None] | None = None
        self.hide()

    def show_message(self, text: str) -> None:
        if text not in self.messages:
            self.messages.append(text)
        self.label.setText("\n\n".join(self.messages))
        self.show()

    def offer(self, label: str, action: Callable[[], None]) -> None:
        """A button beside the messages that runs `action` once."""
        self._action = action
        self.action_button.setText(label)
        self.action_button.show()

    def _run_action(self) -> None:
        action, self._action = self._action, None
        self.action_button.hide()
        if action is not None:
            action()

    def dismiss(self) -> None:
        self.messages.clear()
        self.hide()


class MainWindow(QMainWindow):
    reply_finished = Signal(str)  # finish reason (tests and the benchmark wait on it)
    model_ready = Signal()

    def __init__(
        self,
        settings: Settings,
        *,
        store: HistoryStore | None = None,
        backend_factory: BackendFactory | None = None,
        planner: Planner | None = None,
        autoload: bool = True,
        save_settings_to_disk: bool = True,
        settings_file_rejected: bool = False,
    ) -> None:
        super().__init__()
        self.settings = settings
        self.save_settings_to_disk = save_settings_to_disk
        self.settings_file_rejected = settings_file_rejected  # saving first keeps that file as .rejected
        self.history_problem: HistoryError | None = None
        self.store = store or self._open_history(default_history_path())
        self.palette_ = theme.resolve(settings.theme)
        self.confirm_deletes = True
        self.setWindowTitle("Hearth")
        self.resize(1320, 840)

        self.chat_model = ChatModel()
        self.sidebar = ConversationList()
        self.sidebar.setMinimumWidth(200)
        self.model_bar = ModelBar(settings)
        self.chat_view = ChatView(self.chat_model, self.palette_)
        self.input_box = InputBox()
        self.memory_panel = MemoryPanel(self.palette_)
        self.banner = Banner()

        center = QWidget()
        center_layout = QVBoxLayout(center)
        center_layout.setContentsMargins(0, 0, 0, 0)
        center_layout.setSpacing(0)
        center_layout.addWidget(self.model_bar)
        banner_box = QVBoxLayout()
        banner_box.setContentsMargins(16, 8, 16, 0)
        banner_box.addWidget(self.banner)
        center_layout.addLayout(banner_box)
        center_layout.addWidget(self.chat_view, 1)
        input_row = QVBoxLayout()
        input_row.setContentsMargins(28, 6, 28, 16)
        input_row.addWidget(self.input_box)
        center_layout.addLayout(input_row)

        side = QWidget()
        side.setObjectName("SidePanel")
        side.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        side_layout = QVBoxLayout(side)
        side_layout.setContentsMargins(0, 0, 0, 0)
        side_layout.addWidget(self.memory_panel)
        self.side_panel = side

        splitter = QSplitter()
        splitter.setHandleWidth(1)
        splitter.addWidget(self.sidebar)
        splitter.addWidget(center)
        splitter.addWidget(side)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([240, 780, 300])
        splitter.setCollapsible(1, False)
        self.setCentralWidget(splitter)
        self._build_menus()

        self.conversation_id: int | None = None
        self.model_info: ModelInfo | None = None
        self.loading = False
        self.reply: ActiveReply | None = None
        self.pending_parent: Message | None = None  # a message sent while the model was loading
        self.last_memory: MemoryReading | None = None
        self.attachments: Any = None  # app.ui.attachments.AttachmentBar, once installed
        self.library_window: Any = None  # app.ui.library.LibraryWindow, opened from the Models menu

        self.flush_timer = QTimer(self)
        self.flush_timer.setInterval(FLUSH_EVERY_MS)
        self.flush_timer.timeout.connect(self._flush)
        self.plan_timer = QTimer(self)
        self.plan_timer.setSingleShot(True)
        self.plan_timer.setInterval(PLAN_DEBOUNCE_MS)
        self.plan_timer.timeout.connect(self._request_plan)

        self.errors = ErrorBridge()
        self.errors.error.connect(self.show_error)

        self.host = WorkerHost(backend_factory, planner, parent=self)
        worker = self.host.worker
        for signal, slot in (
            (worker.load_progress, self._on_load_progress),
            (worker.model_loaded, self._on_model_loaded),
            (worker.load_failed, self._on_load_failed),
            (worker.model_unloaded, self._on_model_unloaded),
            (worker.plan_ready, self._on_plan_ready),
            (worker.plan_failed, self._on_plan_failed),
            (worker.token, self._on_token),
            (worker.stats, self._on_stats),
            (worker.context, self._on_context),
            (worker.finished, self._on_finished),
            (worker.failed, self._on_failed),
            (worker.memory, self._on_memory),
            (worker.notice, self.show_error),
        ):
            signal.connect(slot, Qt.ConnectionType.QueuedConnection)

        self.sidebar.new_requested.connect(self.new_conversation)
        self.sidebar.selected.connect(self.open_conversation)
        self.sidebar.rename_requested.connect(self.rename_conversation)
        self.sidebar.delete_requested.connect(self.delete_conversation)
        self.sidebar.search_changed.connect(self._refresh_sidebar)
        self.model_bar.load_requested.connect(self.load_model)
        self.model_bar.unload_requested.connect(self.unload_model)
        self.model_bar.cancel_requested.connect(self.cancel_load)
        self.model_bar.selection_changed.connect(lambda _request: self.plan_timer.start())
        self.input_box.send_requested.connect(self.send)
        self.input_box.stop_requested.connect(self.stop)
        self.chat_view.regenerate_requested.connect(self.regenerate)
        self.chat_view.continue_requested.connect(self.continue_reply)
        self.chat_view.delete_requested.connect(self.delete_message)
        self.chat_view.edit_submitted.connect(self.edit_message)
        self.chat_view.branch_requested.connect(self.switch_branch)

        if self.history_problem is not None:
            self._explain_history_problem(self.history_problem)
        conversations = self.store.list_conversations()
        if conversations:
            self.open_conversation(conversations[0].id)
        else:
            self._refresh_sidebar()
        self.input_box.editor.setFocus()
        # The model loads after the window has painted once: the first frame never waits for torch.
        self._autoload = autoload
        self._painted = False

    first_painted = Signal()

    # -- the history file ---------------------------------------------------------------------------------
    def _open_history(self, path: Path) -> HistoryStore:
        """The history at `path`, or, when that file cannot be used, a store in memory: the window always
        starts, the file is never modified, and the banner explains (and offers to move a damaged file aside)."""
        store: HistoryStore | None = None
        try:
            store = HistoryStore(path)
            store.list_conversations()  # a file damaged past its header fails here, not in the middle of a chat
            return store
        except HistoryError as exc:
            if store is not None:
                store.close()
            log.warning("history unavailable: %s", exc)
            self.history_problem = exc
            return HistoryStore(path, in_memory=True)

    def _explain_history_problem(self, problem: HistoryError) -> None:
        self.show_error(f"{problem} Conversations in this window are kept in memory only and are lost when it closes.")
        if isinstance(problem, HistoryDamagedError):
            self.banner.offer("Move it aside and start a new history", self.start_new_history)

    def start_new_history(self) -> None:
        """Move the unusable file aside (never deleted) and start a new history there, keeping this window's
        conversations."""
        path = self.store.path
        try:
            old = HistoryStore.move_aside(path)
            self.store.copy_into(path)
            fresh = HistoryStore(path)
        except (OSError, HistoryError) as exc:
            self.show_error(f"A new history could not be started at {path}: {exc}")
            return
        self.store.close()
        self.store = fresh
        self.history_problem = None
        self.banner.dismiss()
        self.show_error(f"Started a new conversation history at {path}. The old file is kept, unchanged, at {old}.")
        self._refresh_sidebar()

    def paintEvent(self, event: QPaintEvent) -> None:
        super().paintEvent(event)
        if not self._painted:
            self._painted = True
            self.first_painted.emit()
            self.plan_timer.start()
            QTimer.singleShot(0, self._install_attachments)
            if self._autoload:
                QTimer.singleShot(0, lambda: self.load_model(self.model_bar.request()))

    def _install_attachments(self) -> None:
        """The documents feature's attachment bar: imported after the first paint (its readers are not small)."""
        if self.attachments is not None:
            return
        try:
            from app.ui.attachments import AttachmentBar
        except ImportError:  # a build without the documents feature
            return
        bar = AttachmentBar(max_bytes=self.settings.attachment_limit_mb * 2**20)
        self.input_box.attach_bar(bar)
        bar.install_drop_target(self)
        bar.install_drop_target(self.input_box.editor)
        self.attachments = bar

    # -- menus ----------------------------------------------------------------------------------
    def _build_menus(self) -> None:
        bar = self.menuBar()
        file_menu = bar.addMenu("&File")
        self._action(file_menu, "&New chat", self.new_conversation, QKeySequence.StandardKey.New)
        file_menu.addSeparator()
        self._action(file_menu, "&Import conversation…", self._import_dialog)
        self._action(file_menu, "Export as &Markdown…", lambda: self._export_dialog("md"))
        self._action(file_menu, "Export as &JSON…", lambda: self._export_dialog("json"))
        file_menu.addSeparator()
        self._action(file_menu, "&Quit", self.close, QKeySequence.StandardKey.Quit)
        edit_menu = bar.addMenu("&Edit")
        self._action(edit_menu, "&Settings…", self.open_settings, QKeySequence.StandardKey.Preferences)
        self.models_menu = bar.addMenu("&Models")
        # The model library window (app/ui/library.py) plugs in here.
        self.library_action = self._action(self.models_menu, "Model &library…", self.open_library)
        view_menu = bar.addMenu("&View")
        toggle = self._action(view_menu, "&Memory panel", lambda: None)
        toggle.setCheckable(True)
        toggle.setChecked(True)
        toggle.toggled.connect(lambda on: self.side_panel.setVisible(on))

    def _action(self, menu: Any, text: str, slot: Any, shortcut: QKeySequence.StandardKey | None = None) -> QAction:
        action = QAction(text, self)
        if shortcut is not None:
            action.setShortcut(QKeySequence(shortcut))
        action.triggered.connect(slot)
        menu.addAction(action)
        return action

    def open_library(self) -> None:
        import importlib

        try:
            library = importlib.import_module("app.ui.library")  # built by the model library feature
        except ImportError:
            self.show_error("The model library is not part of this build yet.")
            return
        if self.library_window is None:
            self.library_window = library.LibraryWindow(
                quantization=self.settings.quantization, device=self.settings.device
            )
            self.library_window.model_chosen.connect(self._use_library_model)
        self.library_window.show()
        self.library_window.raise_()

    @Slot(str)
    def _use_library_model(self, spec: str) -> None:
        """Double-click in the library: make it the default model and load it."""
        self.apply_settings(self.settings.with_changes(model=spec))
        self.model_bar.set_model(spec)
        self.load_model(self.model_bar.request())

    # -- errors -----------------------------------------------------------------------------------
    @Slot(str)
    def show_error(self, message: str, details: str = "") -> None:
        log.info("shown to the user: %s", message)
        self.banner.show_message(message)

    def _chat_error(self, message: str) -> None:
        """An error about the conversation: shown in the chat, where the reply would have been."""
        self.chat_model.append(ChatItem("error", message))

    # -- conversations ----------------------------------------------------------------------------
    def _refresh_sidebar(self, *args: object) -> None:
        search = self.sidebar.search.text().strip() or None
        self.sidebar.set_conversations(self.store.list_conversations(search), self.conversation_id)

    def new_conversation(self) -> None:
        """Also while a reply streams: it keeps streaming into its own conversation."""
        self.conversation_id = None
        self.chat_model.reset([])
        self.memory_panel.set_context(None)
        self._refresh_sidebar()
        self.input_box.editor.setFocus()

    def open_conversation(self, conversation_id: int) -> None:
        self.conversation_id = conversation_id
        self._reload_messages()
        self._refresh_sidebar()

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        try:
            self.store.rename_conversation(conversation_id, title)
        except HearthError as exc:
            self.show_error(str(exc))
        self._refresh_sidebar()

    def delete_conversation(self, conversation_id: int) -> None:
        if self.reply is not None and self.reply.conversation_id == conversation_id and self._busy():
            return
        if self.confirm_deletes:
            answer = QMessageBox.question(self, "Delete conversation", "Delete this conversation for good?")
            if answer != QMessageBox.StandardButton.Yes:
                return
        self.store.delete_conversation(conversation_id)
        self.host.forget(conversation_id)
        if conversation_id == self.conversation_id:
            self.conversation_id = None
            self.chat_model.reset([])
        self._refresh_sidebar()

    def _reload_messages(self) -> None:
        if self.conversation_id is None:
            self.chat_model.reset([])
            return
        items: list[ChatItem] = []
        reply = self.reply if self.reply is not None and self.reply.conversation_id == self.conversation_id else None
        for message in self.store.active_branch(self.conversation_id):
            if message.role == "system":
                continue
            siblings = self.store.siblings(message.id)
            index = next((i for i, s in enumerate(siblings) if s.id == message.id), 0)
            finish = message.finish_reason
            if message.role == "assistant" and finish is None and (reply is None or message.id != reply.message_id):
                finish = "interrupted"  # saved while streaming, never finished: the app died or was killed
            items.append(
                ChatItem(
                    role=message.role,
                    content=message.content,
                    message_id=message.id,
                    finish_reason=finish,
                    stats=message.stats,
                    sibling_index=index,
                    sibling_count=len(siblings),
                    model=message.model,
                    extra={"attachments": [a.name for a in message.attachments]} if message.attachments else {},
                )
            )
            if reply is not None and message.id == reply.message_id:
                # The store lags the stream by up to a second: show what has streamed, and keep streaming.
                items[-1].content, items[-1].streaming = reply.text, True
        self.chat_model.reset(items)

    def _busy(self) -> bool:
        if self.reply is not None:
            self.show_error("A reply is being generated: stop it first (Esc).")
            return True
        return False

    # -- model loading ----------------------------------------------------------------------------
    def load_model(self, request: LoadRequest) -> None:
        # The opt-ins come from the window's one settings object, never from re-reading the file.
        request = replace(
            request,
            allow_pickle=self.settings.allow_pickle,
            trust_remote_code=self.settings.trust_remote_code,
            response_cache=self.settings.response_cache,
        )
        self.stop()
        self.loading = True
        self.model_info = None
        self.model_bar.set_loading("Starting…", -1.0)
        self.host.load(request)

    def cancel_load(self) -> None:
        self.host.cancel_load()
        self.model_bar.set_loading("Cancelling…", -1.0)

    def unload_model(self) -> None:
        self.stop()
        self.host.unload()

    @Slot(str, float)
    def _on_load_progress(self, message: str, fraction: float) -> None:
        if self.loading:
            self.model_bar.set_loading(message, fraction)

    @Slot(object)
    def _on_model_loaded(self, info: ModelInfo) -> None:
        self.loading = False
        self.model_info = info
        self.model_bar.set_loaded(info)
        for line in info.recovered:
            self.show_error(line)
        self._connect_attachment_counts(info)
        self.model_ready.emit()
        if self.pending_parent is not None:
            parent, self.pending_parent = self.pending_parent, None
            if parent.conversation_id == self.conversation_id:
                self._start_reply(parent)

    def _connect_attachment_counts(self, info: ModelInfo) -> None:
        """Chips show token counts and their share of the free context with the loaded model's tokenizer."""
        if self.attachments is None:
            return
        counter = None
        if info.tokenizer_file:
            try:
                counter = load_token_counter(info.tokenizer_file)
            except Exception as exc:  # an unreadable tokenizer.json: attachments still work, without counts
                log.warning("token counter unavailable: %s", exc)
        self.attachments.set_token_counter(counter)
        self.attachments.set_remaining_context(info.context_window)

    @Slot(str)
    def _on_load_failed(self, message: str) -> None:
        self.loading = False
        self.model_info = None
        self.model_bar.set_unloaded("Not loaded")
        self.show_error(message)
        if self.pending_parent is not None:
            self.pending_parent = None
            self._chat_error(f"The model could not be loaded, so there is no reply: {message}")

    @Slot()
    def _on_model_unloaded(self) -> None:
        self.model_info = None
        self.model_bar.set_unloaded()
        self.memory_panel.set_memory(None)

    def _request_plan(self) -> None:
        self.host.plan(self.model_bar.request())

    @Slot(object)
    def _on_plan_ready(self, plan: Any) -> None:
        self.memory_panel.set_plan(plan)

    @Slot(str)
    def _on_plan_failed(self, message: str) -> None:
        self.memory_panel.set_plan_message(message)

    @Slot(object)
    def _on_memory(self, reading: MemoryReading) -> None:
        self.last_memory = reading
        self.memory_panel.set_memory(reading)

    # -- sending and streaming ----------------------------------------------------------------------
    def send(self, text: str) -> None:
        text = text.strip()
        if not text or self._busy():
            return
        if self.model_info is None and not self.loading:
            self.input_box.editor.setPlainText(text)
            self._chat_error("No model is loaded: load one from the model bar first.")
            return
        documents: list[Any] = []
        if self.attachments is not None:
            chosen = self.attachments.documents_for_send(text)
            if chosen is None:  # files still being read, or the user cancelled the fit choice
                self.input_box.editor.setPlainText(text)
                return
            documents = list(chosen)
        if self.conversation_id is None:
            title = " ".join(text.split())[:TITLE_LENGTH] or "New chat"
            conversation = self.store.create_conversation(title, settings=self.settings.to_dict())
            self.conversation_id = conversation.id
        branch = self.store.active_branch(self.conversation_id)
        parent_id = branch[-1].id if branch else None
        attachments = self._new_attachments(documents, branch, self._attachment_token_counts())
        message = self.store.add_message(self.conversation_id, "user", text, parent_id, attachments=attachments)
        if self.attachments is not None:
            self.attachments.clear()
        self._after_new_user_message(message)

    def _attachment_token_counts(self) -> dict[str, int]:
        if self.attachments is None:
            return {}
        pairs = zip(self.attachments.documents(), self.attachments.token_counts(), strict=False)
        return {document.sha256: count for document, count in pairs if count is not None}

    @staticmethod
    def _new_attachments(documents: list[Any], branch: list[Message], counts: dict[str, int]) -> list[Any]:
        """History attachments for the documents, minus those already sent earlier in this branch."""
        if not documents:
            return []
        from app.core.documents.layout import not_yet_in_conversation

        earlier = {a.sha256 for m in branch for a in m.attachments}
        return [
            d.as_history_attachment(max(counts.get(d.sha256, 0) - d.dropped_tokens, 0))
            for d in not_yet_in_conversation(documents, earlier)
        ]

    @staticmethod
    def _content_for_model(message: Message) -> str:
        """What the model sees for a message: its attached documents (as the documents feature lays them out),
        then the text. The store keeps the text and the attachments apart."""
        if not message.attachments:
            return message.content
        from app.core.documents.layout import compose_user_message

        return compose_user_message(message.content, cast(Any, message.attachments))

    def _after_new_user_message(self, message: Message) -> None:
        self._reload_messages()
        self._refresh_sidebar()
        if self.model_info is None:
            self.pending_parent = message  # sent when the model has loaded
            return
        self._start_reply(message)

    def _prompt_messages(self, up_to: Message) -> tuple[ChatMessage, ...]:
        """System prompt + the active branch down to `up_to` (inclusive), as the engine's messages."""
        branch = self.store.active_branch(up_to.conversation_id)
        messages: list[ChatMessage] = []
        if self.settings.system_prompt.strip():
            messages.append(ChatMessage("system", self.settings.system_prompt))
        for message in branch:
            if message.role in ("user", "assistant"):
                messages.append(ChatMessage(message.role, self._content_for_model(message)))  # type: ignore[arg-type]
            if message.id == up_to.id:
                break
        return tuple(messages)

    def _start_reply(self, parent: Message, *, continue_message: Message | None = None, cache: bool = True) -> None:
        assert self.model_info is not None
        prefix = continue_message.content if continue_message is not None else ""
        messages = self._prompt_messages(parent)
        if continue_message is not None:
            target = continue_message
            created = False
        else:
            target = self.store.add_message(
                parent.conversation_id, "assistant", "", parent.id, model=self.model_info.name
            )
            created = True
        self._reload_messages()
        row = self.chat_model.row_of(target.id)
        if row is not None:
            self.chat_model.update(row, streaming=True, finish_reason=None, stats=None, error=None)
        request = GenerateRequest(
            self.host.next_request_id(),
            ReplyRequest(
                messages,
                params=self.settings.sampling,
                conversation_id=parent.conversation_id,
                assistant_prefix=prefix,
                context_policy=self.settings.context_policy,
                use_response_cache=cache and self.settings.response_cache,
            ),
        )
        self.reply = ActiveReply(request, parent.conversation_id, target.id, created, prefix, prefix)
        self.input_box.set_generating(True)
        self.flush_timer.start()
        self.host.generate(request)

    def _current(self, request_id: int) -> ActiveReply | None:
        reply = self.reply
        return reply if reply is not None and reply.request.request_id == request_id else None

    @Slot(int, str, int)
    def _on_token(self, request_id: int, text: str, count: int) -> None:
        reply = self._current(request_id)
        if reply is not None:
            reply.buffer.append(text)
            reply.tokens += count

    def _flush(self) -> None:
        reply = self.reply
        if reply is None or not reply.buffer:
            return
        delta = "".join(reply.buffer)
        reply.buffer.clear()
        reply.text += delta
        if self.conversation_id == reply.conversation_id:
            row = self.chat_model.row_of(reply.message_id)
            if row is not None:
                self.chat_model.append_text(row, delta)
        if reply.usage is not None and reply.final_usage is None:
            self.memory_panel.set_context(reply.usage.with_reply(reply.usage.reply + reply.tokens))
        now = time.monotonic()
        if now - reply.last_saved >= SAVE_EVERY_S:
            reply.last_saved = now
            self.store.update_message(reply.message_id, content=reply.text)

    @Slot(int, object)
    def _on_stats(self, request_id: int, stats: ReplyStats) -> None:
        reply = self._current(request_id)
        if reply is not None:
            reply.stats = stats

    @Slot(int, object)
    def _on_context(self, request_id: int, usage: ContextUsage) -> None:
        """First an estimate before prefill (reply grows live as tokens arrive), then exact numbers at the end."""
        reply = self._current(request_id)
        if reply is None:
            return
        if reply.stats is None:
            reply.usage = usage
            self.memory_panel.set_context(usage.with_reply(usage.reply + reply.tokens))
        else:
            reply.final_usage = usage
            self.memory_panel.set_context(usage)
            if self.attachments is not None:
                self.attachments.set_remaining_context(max(0, usage.window - usage.used))

    @Slot(int, str, str, str)
    def _on_finished(self, request_id: int, finish_reason: str, text: str, error: str) -> None:
        reply = self._current(request_id)
        if reply is None:
            return
        self.flush_timer.stop()
        self._flush()
        full = reply.prefix + text
        stats = reply.stats.to_dict() if reply.stats is not None else None
        self.store.update_message(reply.message_id, content=full, finish_reason=finish_reason, stats=stats)
        self.reply = None
        self.input_box.set_generating(False)
        if self.conversation_id == reply.conversation_id:
            row = self.chat_model.row_of(reply.message_id)
            if row is not None:
                self.chat_model.update(
                    row, content=full, streaming=False, finish_reason=finish_reason, stats=stats, error=error or None
                )
            if finish_reason == "error" and error:
                self._chat_error(error)
        self._refresh_sidebar()
        self.reply_finished.emit(finish_reason)

    @Slot(int, str)
    def _on_failed(self, request_id: int, message: str) -> None:
        """Nothing was generated (e.g. the prompt does not fit): undo the empty reply, say why in the chat."""
        reply = self._current(request_id)
        if reply is None:
            return
        self.flush_timer.stop()
        self.reply = None
        self.input_box.set_generating(False)
        if reply.created:
            self.store.delete_message(reply.message_id)
        else:
            self.store.update_message(reply.message_id, content=reply.prefix, finish_reason="length")
        if self.conversation_id == reply.conversation_id:
            self._reload_messages()
            self._chat_error(message)
        self.reply_finished.emit("error")

    def stop(self) -> None:
        self.host.cancel_generation()

    # -- actions on messages ----------------------------------------------------------------------
    def _usable_model(self) -> bool:
        if self.model_info is None:
            self._chat_error("No model is loaded: load one from the model bar first.")
            return False
        return True

    def regenerate(self, message_id: int) -> None:
        if self._busy() or not self._usable_model():
            return
        message = self.store.get_message(message_id)
        if message.parent_id is None:
            return
        parent = self.store.get_message(message.parent_id)
        self._start_reply(parent, cache=False)

    def continue_reply(self, message_id: int) -> None:
        if self._busy() or not self._usable_model():
            return
        message = self.store.get_message(message_id)
        if message.parent_id is None:
            return
        parent = self.store.get_message(message.parent_id)
        self._start_reply(parent, continue_message=message)

    def edit_message(self, message_id: int, text: str) -> None:
        if self._busy():
            return
        original = self.store.get_message(message_id)
        message = self.store.add_message(original.conversation_id, "user", text, original.parent_id)
        if self.model_info is None and not self.loading:
            self._reload_messages()
            self._chat_error("No model is loaded: load one from the model bar first.")
            return
        self._after_new_user_message(message)

    def delete_message(self, message_id: int) -> None:
        if self._busy():
            return
        self.store.delete_message(message_id)
        self._reload_messages()
        self._refresh_sidebar()

    def switch_branch(self, message_id: int, step: int) -> None:
        if self._busy():
            return
        siblings = self.store.siblings(message_id)
        index = next((i for i, s in enumerate(siblings) if s.id == message_id), 0) + step
        if 0 <= index < len(siblings):
            self.store.switch_to(siblings[index].id)
            self._reload_messages()

    # -- export / import ----------------------------------------------------------------------------
    def export_conversation(self, path: Path, fmt: str) -> None:
        if self.conversation_id is None:
            raise HearthError("There is no conversation to export: open or start one first.")
        import json

        if fmt == "json":
            data = json.dumps(self.store.export_json(self.conversation_id), indent=2, ensure_ascii=False)
        else:
            data = self.store.export_markdown(self.conversation_id)
        path.write_text(data, encoding="utf-8")

    def import_conversation(self, path: Path) -> None:
        conversation = self.store.import_json_file(path)
        self.open_conversation(conversation.id)

    def _export_dialog(self, fmt: str) -> None:
        if self.conversation_id is None:
            self.show_error("There is no conversation to export: open or start one first.")
            return
        title = self.store.get_conversation(self.conversation_id).title
        suggested = "".join(c if c.isalnum() or c in " -_" else "_" for c in title).strip() or "conversation"
        name, _ = QFileDialog.getSaveFileName(
            self, "Export conversation", f"{suggested}.{fmt}", "Markdown (*.md)" if fmt == "md" else "JSON (*.json)"
        )
        if name:
            try:
                self.export_conversation(Path(name), fmt)
            except (HearthError, OSError) as exc:
                self.show_error(f"Export failed: {exc}")

    def _import_dialog(self) -> None:
        name, _ = QFileDialog.getOpenFileName(self, "Import conversation", "", "Hearth conversation (*.json)")
        if name:
            try:
                self.import_conversation(Path(name))
            except HearthError as exc:
                self.show_error(str(exc))

    # -- settings -------------------------------------------------------------------------------------
    def open_settings(self) -> None:
        dialog = SettingsDialog(self.settings, self)
        if dialog.exec() and dialog.result_settings is not None:
            self.apply_settings(dialog.result_settings)

    def apply_settings(self, settings: Settings) -> None:
        theme_changed = settings.theme != self.settings.theme
        self.settings = settings
        if self.save_settings_to_disk:
            try:
                if self.settings_file_rejected:  # the file Hearth could not read is kept, never written over
                    kept = keep_rejected_file()
                    self.settings_file_rejected = False
                    if kept is not None:
                        self.show_error(f"Settings saved. The file Hearth could not read is kept at {kept}.")
                save_settings(settings)
            except OSError as exc:
                self.show_error(f"The settings could not be saved: {exc}")
        if theme_changed:
            app = QApplication.instance()
            if isinstance(app, QApplication):
                self.palette_ = theme.apply(app, settings.theme)
                self.chat_view.set_palette(self.palette_)
                self.memory_panel.set_palette(self.palette_)

    # -- shutdown ---------------------------------------------------------------------------------------
    def closeEvent(self, event: QCloseEvent) -> None:
        reply = self.reply
        if reply is not None:  # keep what was streamed: the worker's last events will not be delivered
            self.flush_timer.stop()
            self._flush()
            self.store.update_message(reply.message_id, content=reply.text, finish_reason="cancelled")
            self.reply = None
        self.flush_timer.stop()
        self.plan_timer.stop()
        if self.attachments is not None:
            self.attachments.shutdown()
        self.host.shutdown()
        self.store.close()
        super().closeEvent(event)
