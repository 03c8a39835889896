"""The main window: the composition root of the GUI. It builds the views, the worker host, the settings store
and the ChatController, and wires them: input box -> controller -> worker -> backend -> events -> view.

The chat flow (send, stream, regenerate, continue, edit, the store writes) lives in app/ui/chat_controller.py;
the window keeps what is about the window: menus, the banner, model loading and the panels.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import replace
from typing import Any

from PySide6.QtCore import QRect, Qt, QTimer, Signal, Slot
from PySide6.QtGui import QCloseEvent, QPaintEvent, QResizeEvent, QShowEvent
from PySide6.QtWidgets import (
    QApplication,
    QMainWindow,
    QMessageBox,
    QVBoxLayout,
    QWidget,
)

from app.core.chat.token_counter import load_token_counter
from app.core.engines.backend import BackendFactory, LoadRequest, MemoryReading, ModelInfo
from app.core.settings import Settings
from app.core.storage.history import HistoryDamagedError, HistoryError, HistoryStore, default_history_path
from app.ui import theme
from app.ui.banner import Banner, ErrorBridge
from app.ui.chat_controller import ChatController
from app.ui.chat_view import ChatView
from app.ui.conversations import ConversationList
from app.ui.history_file import open_history, start_new_history_file
from app.ui.input_box import InputBox
from app.ui.memory_panel import MemoryPanel
from app.ui.model_bar import ModelBar
from app.ui.remote_window import RemoteEngines, remote_destination
from app.ui.server_panel import ServerPanel
from app.ui.settings_dialog import SettingsDialog
from app.ui.settings_store import SettingsStore
from app.ui.transfer import ConversationTransfer
from app.ui.unsaved import UnsavedWatcher
from app.ui.window_geometry import (
    SavedGeometry,
    fit_frame_on_screen,
    place_on_screen,
    read_saved_geometry,
    save_geometry,
)
from app.ui.window_menus import MenuSlots, build_menus
from app.ui.window_panels import MemorySummary, WindowPanels
from app.ui.worker import Planner, WorkerHost

log = logging.getLogger(__name__)

PLAN_DEBOUNCE_MS = 300
IGNORE_FIT_HINT = "To load it anyway, use --ignore-fit."  # the planner's advice, for the command line
LOAD_ANYWAY_HINT = "Load anyway tries regardless: it may run out of memory or be very slow."


class MainWindow(QMainWindow):
    reply_finished = Signal(str)  # finish reason (tests and the benchmark wait on it)
    model_ready = Signal()
    first_painted = Signal()

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
        self.settings_store = SettingsStore(
            settings, persist=save_settings_to_disk, file_rejected=settings_file_rejected, parent=self
        )
        self.history_problem: HistoryError | None = None
        if store is None:
            store, self.history_problem = open_history(default_history_path())
        self.palette_ = theme.resolve(settings.theme)
        self.confirm_deletes = True
        self.remember_geometry = save_settings_to_disk  # window.json: like settings, not for a test's window
        self.setWindowTitle("Hearth")

        self.host = WorkerHost(backend_factory, planner, parent=self)
        self.chat = ChatController(store, self.settings_store, self.host, parent=self)
        self.chat_model = self.chat.chat_model
        self.transfer = ConversationTransfer(self.chat, self, self.show_error)
        self.sidebar = ConversationList()
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

        self.menus = build_menus(
            self.menuBar(),
            self,
            MenuSlots(
                new_chat=self.new_conversation,
                import_conversation=self.transfer.import_dialog,
                export_markdown=lambda: self.transfer.export_dialog("md"),
                export_json=lambda: self.transfer.export_dialog("json"),
                quit=self.close,
                settings=self.open_settings,
                stop=self.chat.stop,
                choose_model=self.model_bar.choose_model,
                eject_model=self.unload_model,
                library=self.open_library,
            ),
        )
        self.models_menu, self.view_menu = self.menus.models, self.menus.view
        # The panels (app/ui/window_panels.py): sidebar | chat | Memory and Server tabs, collapsing on a narrow window.
        self.server_panel = ServerPanel(self.host, self.settings_store)
        self.memory_summary = MemorySummary()
        self.model_bar.status_slot.addWidget(self.memory_summary)
        self.memory_panel.summary_changed.connect(self.memory_summary.show_summary)
        self.memory_summary.show_summary(self.memory_panel.summary())
        self.panels = WindowPanels(
            self.sidebar, center, self.memory_panel, self.server_panel, self.memory_summary, self.view_menu, self
        )
        self.setCentralWidget(self.panels.splitter)
        # Remote engines (app/ui/remote_window.py): Models ▸ Connections…, their models in the model bar, the cost.
        self.remote = RemoteEngines(self.model_bar, self.chat, parent=self)
        self.models_menu.addAction(self.remote.connections_action)
        self.first_painted.connect(self.remote.model_list.refresh)
        banner_box.addWidget(self.remote.cost_label)
        self._place_on_screen()
        # The window's minimum is the collapsed layout's (an explicit minimum: the layout keeps its own off it).
        self.setMinimumSize(self.panels.collapsed_minimum_width(), self.minimumSizeHint().height())

        self.last_memory: MemoryReading | None = None
        self.load_request: LoadRequest | None = None  # the last load asked for ("Load anyway" repeats it)
        self._offering_load_anyway = False
        self.attachments: Any = None  # app.ui.attachments.AttachmentBar, once installed
        self.library_window: Any = None  # app.ui.library.LibraryWindow, opened from the Models menu

        self.plan_timer = QTimer(self)
        self.plan_timer.setSingleShot(True)
        self.plan_timer.setInterval(PLAN_DEBOUNCE_MS)
        self.plan_timer.timeout.connect(self._request_plan)

        self.errors = ErrorBridge()
        self.errors.error.connect(self.show_error)
        self.settings_store.notice.connect(self.show_error)
        self.settings_store.changed.connect(self._setting_changed)

        worker = self.host.worker
        for signal, slot in (
            (worker.load_progress, self._on_load_progress),
            (worker.model_loaded, self._on_model_loaded),
            (worker.load_failed, self._on_load_failed),
            (worker.model_unloaded, self._on_model_unloaded),
            (worker.plan_ready, self.memory_panel.set_plan),
            (worker.plan_failed, self.memory_panel.set_plan_message),
            (worker.plan_progress, self._on_plan_progress),
            (worker.memory, self._on_memory),
            (worker.notice, self.show_error),
        ):
            signal.connect(slot, Qt.ConnectionType.QueuedConnection)

        # input box -> controller; controller -> views
        chat = self.chat
        self.input_box.send_requested.connect(chat.send)
        self.input_box.stop_requested.connect(chat.stop)
        self.chat_view.regenerate_requested.connect(chat.regenerate)
        self.chat_view.continue_requested.connect(chat.continue_reply)
        self.chat_view.delete_requested.connect(chat.delete_message)
        self.chat_view.edit_submitted.connect(chat.edit_message)
        self.chat_view.branch_requested.connect(chat.switch_branch)
        chat.generating_changed.connect(self.input_box.set_generating)
        chat.generating_changed.connect(self.menus.stop.setEnabled)
        chat.notice.connect(self.show_error)
        chat.conversations_changed.connect(self._refresh_sidebar)
        chat.context_changed.connect(
            lambda usage, turns, estimate: self.memory_panel.set_context(usage, earlier_turns=turns, estimate=estimate)
        )
        chat.remaining_context.connect(self._set_remaining_context)
        chat.text_returned.connect(self.input_box.editor.setPlainText)
        chat.reply_finished.connect(self.reply_finished)
        self.unsaved = UnsavedWatcher(lambda: self.store, self.banner, self)
        chat.generating_changed.connect(lambda generating: None if generating else self.unsaved.check())

        self.sidebar.new_requested.connect(self.new_conversation)
        self.sidebar.selected.connect(chat.open_conversation)
        self.sidebar.rename_requested.connect(chat.rename_conversation)
        self.sidebar.delete_requested.connect(self.delete_conversation)
        self.sidebar.search_changed.connect(self._refresh_sidebar)
        self.model_bar.load_requested.connect(self.load_model)
        self.model_bar.unload_requested.connect(self.unload_model)
        self.model_bar.cancel_requested.connect(self.cancel_load)
        self.model_bar.selection_changed.connect(lambda _request: self.plan_timer.start())

        if self.history_problem is not None:
            self._explain_history_problem(self.history_problem)
        conversations = self.store.list_conversations()
        if conversations:
            chat.open_conversation(conversations[0].id)
        else:
            self._refresh_sidebar()
        self.input_box.editor.setFocus()
        # The model loads after the window has painted once: the first frame never waits for torch.
        self._autoload = autoload
        self._painted = False
        self._fitted_frame = False

    # -- what the controller and the settings store own, for reading ---------------------------------------
    @property
    def settings(self) -> Settings:
        return self.settings_store.current

    @property
    def store(self) -> HistoryStore:
        return self.chat.store

    @property
    def conversation_id(self) -> int | None:
        return self.chat.conversation_id

    @property
    def model_info(self) -> ModelInfo | None:
        return self.chat.model_info

    # -- the history file ---------------------------------------------------------------------------------
    def _explain_history_problem(self, problem: HistoryError) -> None:
        self.show_error(f"{problem} Conversations in this window are kept in memory only and are lost when it closes.")
        if isinstance(problem, HistoryDamagedError):
            self.banner.offer("Move it aside and start a new history", self.start_new_history)

    def start_new_history(self) -> None:
        """Move the unusable file aside (never deleted) and start a new history there, keeping this window's
        conversations."""
        path = self.store.path
        try:
            fresh, old = start_new_history_file(self.store)
        except (OSError, HistoryError) as exc:
            self.show_error(f"A new history could not be started at {path}: {exc}")
            return
        self.history_problem = None
        self.banner.dismiss()
        self.chat.replace_store(fresh)
        self.show_error(f"Started a new conversation history at {path}. The old file is kept, unchanged, at {old}.")

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
        self.chat.attachments = bar
        self._connect_attachments(self.chat.model_info)

    # -- where the window is -----------------------------------------------------------------------------------
    def _place_on_screen(self, available: QRect | None = None) -> None:
        """The last size and place (window.json), fitted to its screen as it is now. `available`: tests."""
        saved = read_saved_geometry() if self.remember_geometry else None
        place_on_screen(self, saved, available, before=self.panels.fit_width)

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        if not self._fitted_frame:
            self._fitted_frame = True
            QTimer.singleShot(0, lambda: fit_frame_on_screen(self))

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self.panels.fit_width(event.size().width())

    def open_library(self) -> None:
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
        """Double-click in the library: make it the default model (the model bar follows) and load it."""
        self.settings_store.update(model=spec)
        self.load_model(self.model_bar.request())

    # -- errors -----------------------------------------------------------------------------------
    @Slot(str)
    def show_error(self, message: str, details: str = "") -> None:
        log.info("shown to the user: %s", message)
        self.banner.show_message(message)

    # -- conversations (the controller does the work; the window asks and refreshes the sidebar) ------------
    def _refresh_sidebar(self, *args: object) -> None:
        search = self.sidebar.search.text().strip() or None
        self.sidebar.set_conversations(self.store.list_conversations(search), self.conversation_id)

    def new_conversation(self) -> None:
        self.chat.new_conversation()
        self.input_box.editor.setFocus()

    def delete_conversation(self, conversation_id: int) -> None:
        if not self.chat.can_delete_conversation(conversation_id):
            return
        if self.confirm_deletes:
            answer = QMessageBox.question(self, "Delete conversation", "Delete this conversation for good?")
            if answer != QMessageBox.StandardButton.Yes:
                return
        self.chat.delete_conversation(conversation_id)

    @Slot(int)
    def _set_remaining_context(self, tokens: int) -> None:
        if self.attachments is not None:
            known = self.model_info is None or self.model_info.context_window > 0  # a remote window may be unknown
            self.attachments.set_remaining_context(tokens if known else None)

    # -- model loading ----------------------------------------------------------------------------
    def load_model(self, request: LoadRequest) -> None:
        # The opt-ins come from the window's one settings object, never from re-reading the file.
        settings = self.settings
        request = replace(
            request,
            allow_pickle=settings.allow_pickle,
            trust_remote_code=settings.trust_remote_code,
            response_cache=settings.response_cache,
            prompt_lookup=settings.prompt_lookup,
        )
        if self._offering_load_anyway:
            self._offering_load_anyway = False
            self.banner.withdraw_offer()
        self.load_request = request
        self.menus.eject_model.setEnabled(False)
        self.chat.model_loading()
        self.model_bar.set_loading("Starting…", -1.0)
        self.host.load(request)

    def load_anyway(self) -> None:
        """The planner refused the last model: load it regardless (the command line's --ignore-fit)."""
        if self.load_request is not None:
            self.load_model(replace(self.load_request, ignore_fit=True))

    def cancel_load(self) -> None:
        self.host.cancel_load()
        self.model_bar.set_loading("Cancelling…", -1.0)

    def unload_model(self) -> None:
        self.chat.stop()
        self.host.unload()

    @Slot(str, float)
    def _on_load_progress(self, message: str, fraction: float) -> None:
        if self.chat.loading:
            self.model_bar.set_loading(message, fraction)
        self.memory_panel.load_stage(message)

    @Slot(object)
    def _on_model_loaded(self, info: ModelInfo) -> None:
        self.model_bar.set_loaded(info)
        self.menus.eject_model.setEnabled(True)
        for line in info.recovered:
            self.show_error(line)
        counter = None
        if info.tokenizer_file:
            try:
                counter = load_token_counter(info.tokenizer_file)
            except Exception as exc:  # an unreadable tokenizer.json: no counts, everything else works
                log.warning("token counter unavailable: %s", exc)
        self.chat.token_counter = counter  # the context gauge of a reopened conversation
        self._connect_attachments(info)
        self.model_ready.emit()
        self.chat.model_loaded(info)  # a message sent while loading gets its reply now

    def _connect_attachments(self, info: ModelInfo | None) -> None:
        """Chips show token counts and their share of the free context with the loaded model's tokenizer, and,
        with a remote engine, which files' text will leave this machine."""
        if self.attachments is None or info is None:
            return
        self.attachments.set_token_counter(self.chat.token_counter)
        self.attachments.set_remaining_context(info.context_window or None)
        remote = self.load_request.remote if self.load_request is not None else None
        self.attachments.set_destination(remote_destination(remote) if remote is not None else None)

    @Slot(str, bool)
    def _on_load_failed(self, message: str, too_large: bool) -> None:
        """`too_large`: the memory planner refused the model; the banner offers to load it anyway."""
        self.model_bar.set_unloaded("Not loaded")
        if too_large and self.load_request is not None:
            message = message.replace(IGNORE_FIT_HINT, "").rstrip()
            self.show_error(f"{message} {LOAD_ANYWAY_HINT}")
            self.banner.offer("Load anyway", self.load_anyway)
            self._offering_load_anyway = True
        else:
            self.show_error(message)
        self.chat.model_load_failed(message)

    @Slot()
    def _on_model_unloaded(self) -> None:
        self.menus.eject_model.setEnabled(False)
        self.chat.token_counter = None
        if self.attachments is not None:
            self.attachments.set_destination(None)
        self.chat.model_unloaded()
        self.model_bar.set_unloaded()
        self.memory_panel.set_memory(None)

    def _request_plan(self) -> None:
        self.memory_panel.set_plan_pending()
        self.host.plan(self.model_bar.request())

    @Slot(str)
    def _on_plan_progress(self, message: str) -> None:
        """A slow stage of the plan (the kernel's first compile): the load queued behind it waits for the same."""
        self.memory_panel.set_plan_pending(message)
        if self.chat.loading:
            self.model_bar.set_loading(message, -1.0)

    @Slot(object)
    def _on_memory(self, reading: MemoryReading) -> None:
        self.last_memory = reading
        self.memory_panel.set_memory(reading)

    # -- settings -------------------------------------------------------------------------------------
    def open_settings(self) -> None:
        dialog = SettingsDialog(self.settings, self)
        if dialog.exec() and dialog.result_settings is not None:
            self.apply_settings(dialog.result_settings)

    def apply_settings(self, settings: Settings) -> None:
        self.settings_store.replace(settings)

    @Slot(str)
    def _setting_changed(self, key: str) -> None:
        """What the window shows follows the settings store; the controller reads it at each request."""
        settings = self.settings
        if key == "theme":
            app = QApplication.instance()
            if isinstance(app, QApplication):
                self.palette_ = theme.apply(app, settings.theme)
                self.chat_view.set_palette(self.palette_)
                self.memory_panel.set_palette(self.palette_)
        elif key == "model" and settings.model:
            self.model_bar.set_model(settings.model)
        elif key == "attachment_limit_mb" and self.attachments is not None:
            self.attachments.max_bytes = settings.attachment_limit_mb * 2**20

    # -- shutdown ---------------------------------------------------------------------------------------
    def closeEvent(self, event: QCloseEvent) -> None:
        if not self.unsaved.may_close():
            event.ignore()
            return
        if self.remember_geometry:
            save_geometry(SavedGeometry.of(self))
        self.chat.close()
        self.remote.shutdown()
        self.plan_timer.stop()
        if self.attachments is not None:
            self.attachments.shutdown()
        self.host.shutdown()
        self.store.close()
        super().closeEvent(event)
