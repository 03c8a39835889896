"""The Server panel: a switch that serves the window's loaded model to other programs over the OpenAI API.

It talks to the server only through the worker host (WorkerHost.start_server / stop_server and the worker's
server_* signals, all queued): the server's threads never touch a widget. The window shows it as a tab of its side
panel (View ▸ Server, app.ui.window_panels).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt, QTimer, Signal, Slot
from PySide6.QtWidgets import (
    QAbstractItemView,
    QApplication,
    QCheckBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.core.engines.backend import ModelInfo
from app.core.engines.kv_pool import MAX_POOLED, POOL_MEMORY_SHARE, served_split
from app.core.settings import MAX_PARALLEL
from app.ui.memory_panel import format_bytes
from app.ui.settings_store import SettingsStore
from app.ui.worker import WorkerHost

if TYPE_CHECKING:
    from app.core.server import RequestRecord

DEPTH_EVERY_MS = 250
MAX_LOG_ROWS = 500
LOG_COLUMNS = ("Time", "Endpoint", "Status", "Prompt", "Cached", "Out", "TTFT ms", "tok/s")
PARALLEL_TOOLTIP = (
    "Replies decoded together for programs using the server: each step reads the weights once for all of them. "
    f"Each reply has its own KV cache; together they take at most {POOL_MEMORY_SHARE:.0%} of the memory free when "
    "the model was loaded, and a request beyond that waits for a running one to end. Only the torch-free runtime on "
    f"a GGUF file decodes replies together (up to {MAX_POOLED}); other runtimes answer one at a time. Your own chats "
    "always go first."
)
LOOPBACK_NOTE = (
    "Only programs on this computer can connect (127.0.0.1, no API key). To serve other machines, run "
    "`hearth serve --allow-network --api-key-name NAME` instead: the key is kept in the system keyring."
)


class ServerPanel(QWidget):
    """Switch, port, address with Copy, one status/error line, the queue depth and the live request log."""

    state_changed = Signal(str)  # "off", "starting", "on", "stopping" (tests wait on it)

    def __init__(self, host: WorkerHost, settings: SettingsStore, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("ServerPanel")
        self.host = host
        self.settings = settings
        self.state = "off"
        self.records: list[RequestRecord] = []

        # Narrow enough for the side panel of a 960-px window: the switch, the port, the address with Copy, each on
        # a line of its own.
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 10, 12, 10)
        self.switch = QCheckBox("Serve the loaded model")
        self.switch.setToolTip("An OpenAI-compatible server for editors, scripts and agents on this computer")
        self.switch.toggled.connect(self._switch_toggled)
        layout.addWidget(self.switch)

        port_row = QHBoxLayout()
        port_row.addWidget(QLabel("Port"))
        self.port = QSpinBox()
        self.port.setRange(0, 65535)
        self.port.setValue(settings.current.server_port)
        self.port.setToolTip("0 = any free port")
        port_row.addWidget(self.port)
        port_row.addStretch(1)
        layout.addLayout(port_row)

        parallel_row = QHBoxLayout()
        parallel_row.addWidget(QLabel("Replies at once"))
        self.parallel = QSpinBox()
        self.parallel.setRange(1, MAX_PARALLEL)
        self.parallel.setValue(settings.current.server_parallel)
        self.parallel.setToolTip(PARALLEL_TOOLTIP)
        parallel_row.addWidget(self.parallel)
        parallel_row.addStretch(1)
        layout.addLayout(parallel_row)
        self.capacity = QLabel("")  # what the loaded model's runtime allows that many replies
        self.capacity.setObjectName("Hint")
        self.capacity.setWordWrap(True)
        self.capacity.hide()
        layout.addWidget(self.capacity)
        self.model_info: ModelInfo | None = None
        self.parallel.valueChanged.connect(self._show_capacity)

        address_row = QHBoxLayout()
        self.address = QLineEdit()
        self.address.setReadOnly(True)
        self.address.setPlaceholderText("Not serving")
        address_row.addWidget(self.address, 1)
        self.copy_button = QPushButton("Copy")
        self.copy_button.setEnabled(False)
        self.copy_button.clicked.connect(self.copy_address)
        address_row.addWidget(self.copy_button)
        layout.addLayout(address_row)

        self.status = QLabel("")
        self.status.setObjectName("ServerStatus")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.status)
        self.depth_label = QLabel("")
        self.depth_label.setWordWrap(True)  # the side panel is narrow: never cut the line
        layout.addWidget(self.depth_label)
        note = QLabel(LOOPBACK_NOTE)
        note.setWordWrap(True)
        note.setObjectName("Hint")
        layout.addWidget(note)

        self.log_table = QTableWidget(0, len(LOG_COLUMNS))
        self.log_table.setHorizontalHeaderLabels(list(LOG_COLUMNS))
        self.log_table.verticalHeader().hide()
        self.log_table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        # Columns as wide as their contents; the table scrolls sideways in a narrow panel (never widens the window).
        self.log_table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.log_table.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        self.log_table.setMinimumWidth(120)
        layout.addWidget(self.log_table, 1)

        self.depth_timer = QTimer(self)
        self.depth_timer.setInterval(DEPTH_EVERY_MS)
        self.depth_timer.timeout.connect(self._show_depth)

        worker = host.worker
        queued = Qt.ConnectionType.QueuedConnection
        worker.server_started.connect(self._on_started, queued)
        worker.server_failed.connect(self._on_failed, queued)
        worker.server_stopped.connect(self._on_stopped, queued)
        worker.server_request.connect(self._on_request, queued)
        worker.model_loaded.connect(self.set_model, queued)
        worker.model_unloaded.connect(self._no_model, queued)
        worker.load_failed.connect(self._no_model, queued)

    # -- the switch ---------------------------------------------------------------------------------------
    @Slot(bool)
    def _switch_toggled(self, on: bool) -> None:
        if on and self.state == "off":
            self._set_state("starting")
            self.status.setText("Starting…")
            port, parallel = self.port.value(), self.parallel.value()
            if (port, parallel) != (self.settings.current.server_port, self.settings.current.server_parallel):
                self.settings.update(server_port=port, server_parallel=parallel)  # remembered for the next run
            self.host.start_server(port, parallel)
        elif not on and self.state in ("starting", "on"):
            self._set_state("stopping")
            self.status.setText("Stopping…")
            self.host.stop_server()

    def _set_state(self, state: str) -> None:
        self.state = state
        self.port.setEnabled(state == "off")
        self.parallel.setEnabled(state == "off")
        self.copy_button.setEnabled(state == "on")
        if state == "on":
            self.depth_timer.start()
            self._show_depth()
        else:
            self.depth_timer.stop()
            self.depth_label.setText("")
        if state == "off":
            self.address.clear()
        self.state_changed.emit(state)

    def _uncheck(self) -> None:
        self.switch.blockSignals(True)
        self.switch.setChecked(False)
        self.switch.blockSignals(False)

    @Slot(str)
    def _on_started(self, address: str) -> None:
        if self.state == "stopping":  # switched off again before it had started: the stop request follows
            return
        self.address.setText(address)
        self.address.setCursorPosition(0)  # from its start: "http://127.0.0.1:…", not "ttp://…/v1"
        self.status.setText(f"Serving at {address}: use it as an OpenAI base URL (any API key).")
        self._set_state("on")

    @Slot(str)
    def _on_failed(self, message: str) -> None:
        self._uncheck()
        self.status.setText(message)
        self._set_state("off")

    @Slot(str)
    def _on_stopped(self, reason: str) -> None:
        self._uncheck()
        self.status.setText(reason or "Stopped.")
        self._set_state("off")

    def copy_address(self) -> None:
        if self.address.text():
            QApplication.clipboard().setText(self.address.text())

    @Slot(object)
    def set_model(self, info: ModelInfo | None) -> None:
        """The loaded model (None: none): what its runtime allows for the replies at once."""
        self.model_info = info
        self._show_capacity()

    @Slot()
    def _no_model(self) -> None:  # unloaded, or a load failed
        self.set_model(None)

    def _show_capacity(self) -> None:
        text = capacity_text(self.model_info, self.parallel.value()) if self.model_info is not None else ""
        self.capacity.setText(text)
        self.capacity.setVisible(bool(text))

    # -- live state ----------------------------------------------------------------------------------------
    def _show_depth(self) -> None:
        depth = self.host.server_depth()
        if depth is None:
            return
        self.depth_label.setText(depth_text(*depth))

    @Slot(object)
    def _on_request(self, record: RequestRecord) -> None:
        self.records.append(record)
        del self.records[:-MAX_LOG_ROWS]
        table = self.log_table
        if table.rowCount() >= MAX_LOG_ROWS:
            table.removeRow(table.rowCount() - 1)
        table.insertRow(0)  # newest first
        for column, text in enumerate(log_row(record)):
            item = QTableWidgetItem(text)
            if column >= 2:
                item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            if record.error:
                item.setToolTip(record.error)
            table.setItem(0, column, item)


def capacity_text(info: ModelInfo, asked: int) -> str:
    """What `asked` replies at once come to on this model: one at a time where its runtime has no batched step, else
    how many run together and how long each may be within the KV cache they may reserve."""
    most = info.served_together
    if most <= 1:
        return "This model's runtime answers one request at a time."
    together, each = served_split(
        most, asked, info.served_kv_budget_bytes, info.kv_bytes_per_token, info.context_window
    )
    capped = f" (this runtime's most: {most})" if asked > most else ""
    if each is None:
        return f"{together} replies decoded together{capped}."
    return (
        f"{together} at once{capped}, each up to {each:,} tokens: their KV caches take at most "
        f"{format_bytes(info.served_kv_budget_bytes)}. Longer requests wait for a turn."
    )


def depth_text(running: int, waiting: int, together: int) -> str:
    """The queue line: what runs, what waits, and how many the model decodes together (1: one at a time)."""
    shared = f"up to {together} together" if together > 1 else "one at a time"
    return f"Queue: {running} running, {waiting} waiting ({shared})"


def log_row(record: Any) -> tuple[str, ...]:
    """The log's cells for one RequestRecord."""
    generated = record.completion_tokens > 0
    return (
        time.strftime("%H:%M:%S", time.localtime(record.at)),
        record.path.removeprefix("/v1/") if record.method == "POST" else f"{record.method} {record.path}",
        str(record.status),
        str(record.prompt_tokens) if generated else "",
        str(record.cached_tokens) if generated else "",
        str(record.completion_tokens) if generated else "",
        f"{record.ttft_ms:.0f}" if generated else "",
        f"{record.decode_tokens_per_s:.1f}" if generated else "",
    )
