"""The model library window, the download dialog and the Hub-token box for the settings dialog.

Listing, planning and downloading run on TaskRunners (app/ui/tasks.py): results come back to the GUI thread
through queued signals (the planner imports torch: never on the GUI thread). Nothing here imports torch or the
model libraries.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Qt, QUrl, Signal, Slot
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QDialog,
    QFileDialog,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.core.errors import HearthError
from app.core.memory import verdict as fit
from app.core.models import hub, library
from app.core.models.quant import QUANTIZATIONS
from app.core.storage import secrets
from app.ui.tasks import TaskRunner

log = logging.getLogger(__name__)

LOCAL_COLUMNS = ("Name", "Kind", "Size", "Architecture", "Parameters", "Context", "Memory")
RECOMMENDED_COLUMNS = ("Model", "Class", "Parameters", "Context", "Licence", "Gated", "Memory")


def _count(parameters: int | None) -> str:
    if not parameters:
        return "?"
    return f"{parameters / 1e9:.1f} B" if parameters >= 1e9 else f"{parameters / 1e6:.0f} M"


def _verdict_text(verdict: fit.Verdict) -> str:
    if verdict.fits == "unknown":
        return "unknown"
    text = verdict.label
    if verdict.total_bytes:
        text += f" ({hub.format_bytes(verdict.total_bytes)})"
    return text


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, HearthError):
        return str(exc)
    log.exception("unexpected error in the model library", exc_info=exc)
    return secrets.redact(f"Unexpected error: {type(exc).__name__}: {exc}")


# --- the Hub token box (for the settings dialog) -------------------------------------------------------------------


class HubTokenBox(QGroupBox):
    """Enter, save (to the keyring), remove the Hub token; says so when there is no keyring."""

    token_changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Hugging Face token", parent)
        self.status_label = QLabel()
        self.status_label.setWordWrap(True)
        self.token_edit = QLineEdit()
        self.token_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.token_edit.setPlaceholderText("hf_… (needed for gated models such as Llama and Gemma)")
        self.session_only = QCheckBox("Keep it for this run only (no keyring on this machine)")
        self.save_button = QPushButton("Save token")
        self.remove_button = QPushButton("Remove token")
        self.error_label = QLabel()
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet("color: #c0392b")
        buttons = QHBoxLayout()
        buttons.addWidget(self.save_button)
        buttons.addWidget(self.remove_button)
        buttons.addStretch(1)
        layout = QVBoxLayout(self)
        layout.addWidget(self.status_label)
        layout.addWidget(self.token_edit)
        layout.addWidget(self.session_only)
        layout.addLayout(buttons)
        layout.addWidget(self.error_label)
        self.save_button.clicked.connect(self.save)
        self.remove_button.clicked.connect(self.remove)
        self.token_edit.returnPressed.connect(self.save)
        self.refresh()

    @Slot()
    def refresh(self) -> None:
        status = secrets.token_status()
        where = {
            "keyring": "A token is saved in the system keyring.",
            "session": "A token is kept in memory for this run only.",
            None: "No token: public models download without one.",
        }[status.location]
        if not status.keyring_available:
            where += " " + secrets.no_keyring_message()
        self.status_label.setText(where)
        self.session_only.setVisible(not status.keyring_available)
        self.remove_button.setEnabled(status.location is not None)

    @Slot()
    def save(self) -> None:
        token = self.token_edit.text()
        self.error_label.clear()
        try:
            secrets.save_hub_token(token, session_only=self.session_only.isVisible() and self.session_only.isChecked())
        except HearthError as exc:
            message = str(exc)
            if isinstance(exc, secrets.KeyringUnavailableError):
                message += " Tick the box above to keep it for this run."
            self.error_label.setText(message)
            return
        self.token_edit.clear()  # the widget never holds the token longer than needed
        self.refresh()
        self.token_changed.emit()

    @Slot()
    def remove(self) -> None:
        self.error_label.clear()
        try:
            secrets.clear_hub_token()
        except HearthError as exc:
            self.error_label.setText(str(exc))
            return
        self.refresh()
        self.token_changed.emit()


# --- the download dialog -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Prepared:
    plan: hub.DownloadPlan
    verdict: fit.Verdict


class _ProgressRelay(QObject):
    progress = Signal(object)


class DownloadDialog(QDialog):
    """Repo → plan (config first, verdict before weights) → download with progress, pause/resume, cancel."""

    finished_download = Signal(str)  # the snapshot folder
    state_changed = Signal(str)  # preparing, ready, choose-file, downloading, paused, done, failed, cancelled

    def __init__(
        self,
        reference: str,
        *,
        file: str | None = None,
        quantization: str = "auto",
        device: str = "auto",
        client_factory: Callable[[], hub.HubClient] = hub.HubClient.default,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle(f"Download {reference}")
        self.reference = reference
        self.quantization = quantization
        self.device = device
        self.client = client_factory()
        self.plan: hub.DownloadPlan | None = None
        self.state = ""
        self._cancel = threading.Event()
        self._discard_when_stopped = False
        self._tasks = TaskRunner(f"download {reference}", parent=self)
        self._progress_relay = _ProgressRelay(self)
        self._progress_relay.progress.connect(self._on_progress)

        self.summary = QLabel(f"Looking up {reference}…")
        self.summary.setWordWrap(True)
        self.verdict_label = QLabel()
        self.file_choice = QComboBox()
        self.file_choice.setVisible(False)
        self.progress_bar = QProgressBar()
        self.progress_bar.setRange(0, 1000)
        self.progress_bar.setValue(0)
        self.speed_label = QLabel()
        self.error_label = QLabel()
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet("color: #c0392b")
        self.start_button = QPushButton("Download")
        self.pause_button = QPushButton("Pause")
        self.cancel_button = QPushButton("Cancel download")
        self.close_button = QPushButton("Close")
        buttons = QHBoxLayout()
        for button in (self.start_button, self.pause_button, self.cancel_button):
            buttons.addWidget(button)
        buttons.addStretch(1)
        buttons.addWidget(self.close_button)
        layout = QVBoxLayout(self)
        layout.addWidget(self.summary)
        layout.addWidget(self.verdict_label)
        layout.addWidget(self.file_choice)
        layout.addWidget(self.progress_bar)
        layout.addWidget(self.speed_label)
        layout.addWidget(self.error_label)
        layout.addLayout(buttons)
        self.start_button.clicked.connect(self.start)
        self.pause_button.clicked.connect(self.toggle_pause)
        self.cancel_button.clicked.connect(self.cancel_download)
        self.close_button.clicked.connect(self.close)
        self.file_choice.activated.connect(self._file_chosen)
        self._prepare(file)

    def _set_state(self, state: str) -> None:
        self.state = state
        self.start_button.setVisible(state in ("ready", "failed"))
        self.start_button.setEnabled(state in ("ready", "failed") and self.plan is not None)
        self.pause_button.setVisible(state in ("downloading", "paused", "pausing"))
        self.pause_button.setEnabled(state in ("downloading", "paused"))
        self.pause_button.setText("Resume" if state == "paused" else "Pause")
        self.cancel_button.setEnabled(state in ("downloading", "paused", "pausing"))
        self.state_changed.emit(state)

    def _start_thread(self, name: str, job: Callable[[], Any]) -> None:
        self._tasks.run(name, job, lambda result: self._on_done(name, result), lambda exc: self._on_failed(name, exc))

    def _prepare(self, file: str | None) -> None:
        self._set_state("preparing")
        client, reference = self.client, self.reference
        quantization, device = self.quantization, self.device

        def job() -> _Prepared:
            plan = client.prepare(reference, file=file)
            return _Prepared(plan, fit.model_verdict(plan.config, quantization=quantization, device=device))

        self._start_thread("prepare", job)

    @Slot(int)
    def _file_chosen(self, index: int) -> None:
        name = self.file_choice.itemData(index)
        if isinstance(name, str):
            self.error_label.clear()
            self._prepare(name)

    @Slot()
    def start(self) -> None:
        if self.plan is None:
            return
        self.error_label.clear()
        self._cancel = threading.Event()
        self._discard_when_stopped = False
        client, plan, cancel, relay = self.client, self.plan, self._cancel, self._progress_relay
        self._set_state("downloading")
        self._start_thread("download", lambda: client.download(plan, progress=relay.progress.emit, cancel=cancel))

    @Slot()
    def toggle_pause(self) -> None:
        if self.state == "downloading":
            self._cancel.set()  # the worker stops after the chunk in flight; the partial file is kept
            self._set_state("pausing")
            self.speed_label.setText("Pausing…")
        elif self.state == "paused":
            self.start()

    @Slot()
    def cancel_download(self) -> None:
        if self.state == "paused":
            self._discard()
        elif self.state in ("downloading", "pausing"):
            self._discard_when_stopped = True
            self._cancel.set()

    def _discard(self) -> None:
        if self.plan is not None:
            self.client.discard(self.plan)
        self.progress_bar.setValue(0)
        self.speed_label.setText("Cancelled; the partial download was deleted.")
        self._set_state("cancelled")

    @Slot(object, object)
    def _on_done(self, name: str, result: object) -> None:
        if name == "prepare" and isinstance(result, _Prepared):
            self.plan = result.plan
            plan = result.plan
            gated = "gated, " if plan.gated else ""
            licence = f"licence {plan.license}, " if plan.license else ""
            already = f", {hub.format_bytes(plan.present_bytes)} already downloaded" if plan.present_bytes else ""
            self.summary.setText(
                f"{plan.label}: {len(plan.files)} files, {hub.format_bytes(plan.total_bytes)} "
                f"({gated}{licence}safetensors/GGUF only){already}."
            )
            self.verdict_label.setText(
                f"Memory at {self.quantization} on {self.device}: {_verdict_text(result.verdict)}"
            )
            if plan.gguf_files and len(plan.gguf_files) > 1:
                self._fill_choices(plan.gguf_files, plan.choice)
            if plan.present_bytes and plan.total_bytes:
                self.progress_bar.setValue(int(1000 * plan.present_bytes / plan.total_bytes))
            self._set_state("ready")
        elif name == "download":
            self.progress_bar.setValue(1000)
            self.speed_label.setText(f"Done: {result}")
            self._set_state("done")
            self.finished_download.emit(str(result))

    def _fill_choices(self, files: tuple[hub.RepoFile, ...], current: str | None) -> None:
        self.file_choice.clear()
        self.file_choice.addItem("Choose a GGUF file…", None)
        for repo_file in files:
            self.file_choice.addItem(f"{repo_file.name} ({hub.format_bytes(repo_file.size)})", repo_file.name)
            if repo_file.name == current:
                self.file_choice.setCurrentIndex(self.file_choice.count() - 1)
        self.file_choice.setVisible(True)

    @Slot(object, object)
    def _on_failed(self, name: str, exc: BaseException) -> None:
        if name == "download" and self._cancel.is_set() and isinstance(exc, hub.DownloadCancelled):
            if self._discard_when_stopped:
                self._discard()
            else:
                self.speed_label.setText("Paused: Resume continues where it stopped, even after a restart.")
                self._set_state("paused")
            return
        if isinstance(exc, hub.FileChoiceNeededError):
            self.summary.setText(f"{self.reference} holds several GGUF files: choose one.")
            self._fill_choices(tuple(hub.RepoFile(name, None) for name in exc.choices), None)
            self._set_state("choose-file")
            return
        self.error_label.setText(_error_text(exc))
        self._set_state("failed")

    @Slot(object)
    def _on_progress(self, event: hub.DownloadProgress) -> None:
        self.progress_bar.setValue(int(event.fraction * 1000))
        speed = f"{hub.format_bytes(event.bytes_per_s)}/s" if event.bytes_per_s else "measuring speed"
        text = (
            f"{hub.format_bytes(event.done_bytes)} of {hub.format_bytes(event.total_bytes)} · {speed} · "
            f"{hub.format_duration(event.eta_s)} left · {event.file} ({event.file_index}/{event.file_count})"
        )
        if event.stage == "verifying":
            text += " · checking"
        if self.state != "pausing":
            self.speed_label.setText(text)

    def wait_for_workers(self, timeout: float = 30.0) -> None:
        self._tasks.wait(timeout)

    def closeEvent(self, event: Any) -> None:
        if self.state in ("downloading", "pausing"):
            self._cancel.set()  # closing pauses: the partial file stays for a resume
        super().closeEvent(event)


# --- the library window --------------------------------------------------------------------------------------------


class LibraryWindow(QWidget):
    """Models on disk and the recommended list, each with the planner's verdict; download, delete, reveal."""

    model_chosen = Signal(str)  # a spec for Settings → model (double-click)

    def __init__(
        self,
        *,
        quantization: str = "auto",
        device: str = "auto",
        client_factory: Callable[[], hub.HubClient] = hub.HubClient.default,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Model library")
        self.device = device
        self.client_factory = client_factory
        self.models: list[library.LibraryModel] = []
        self.recommended: list[library.RecommendedModel] = []
        self.dialogs: list[DownloadDialog] = []
        self._tasks = TaskRunner("model library", parent=self)
        self._generation = 0

        self.quant_choice = QComboBox()
        self.quant_choice.addItems(list(QUANTIZATIONS))
        self.quant_choice.setCurrentText(quantization)
        self.quant_choice.currentTextChanged.connect(lambda _text: self.refresh())
        self.status_label = QLabel()
        self.status_label.setWordWrap(True)

        self.local_table = self._table(LOCAL_COLUMNS)
        self.local_table.itemDoubleClicked.connect(self._choose_local)
        self.delete_button = QPushButton("Delete…")
        self.reveal_button = QPushButton("Show in folder")
        self.add_button = QPushButton("Add folder…")
        self.refresh_button = QPushButton("Refresh")
        self.resume_button = QPushButton("Resume paused downloads")
        self.resume_button.setVisible(False)
        local_buttons = QHBoxLayout()
        for button in (
            self.delete_button,
            self.reveal_button,
            self.add_button,
            self.refresh_button,
            self.resume_button,
        ):
            local_buttons.addWidget(button)
        local_buttons.addStretch(1)
        local_page = QWidget()
        local_layout = QVBoxLayout(local_page)
        local_layout.addWidget(self.local_table)
        local_layout.addLayout(local_buttons)

        self.recommended_table = self._table(RECOMMENDED_COLUMNS)
        self.download_recommended_button = QPushButton("Download…")
        self.download_gguf_button = QPushButton("Download GGUF build…")
        rec_buttons = QHBoxLayout()
        rec_buttons.addWidget(self.download_recommended_button)
        rec_buttons.addWidget(self.download_gguf_button)
        rec_buttons.addStretch(1)
        rec_page = QWidget()
        rec_layout = QVBoxLayout(rec_page)
        rec_layout.addWidget(self.recommended_table)
        rec_layout.addLayout(rec_buttons)

        self.tabs = QTabWidget()
        self.tabs.addTab(local_page, "On this machine")
        self.tabs.addTab(rec_page, "Recommended")

        self.repo_edit = QLineEdit()
        self.repo_edit.setPlaceholderText("Hugging Face repo id or URL, e.g. Qwen/Qwen2.5-1.5B-Instruct")
        self.download_button = QPushButton("Download…")
        top = QHBoxLayout()
        top.addWidget(self.repo_edit, 1)
        top.addWidget(self.download_button)
        top.addWidget(QLabel("Verdicts for"))
        top.addWidget(self.quant_choice)

        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.tabs)
        layout.addWidget(self.status_label)

        self.delete_button.clicked.connect(self.delete_selected)
        self.reveal_button.clicked.connect(self.reveal_selected)
        self.add_button.clicked.connect(self.add_folder)
        self.refresh_button.clicked.connect(self.refresh)
        self.resume_button.clicked.connect(self.resume_paused)
        self.download_button.clicked.connect(lambda: self.open_download(self.repo_edit.text()))
        self.repo_edit.returnPressed.connect(lambda: self.open_download(self.repo_edit.text()))
        self.download_recommended_button.clicked.connect(lambda: self._download_recommended(gguf=False))
        self.download_gguf_button.clicked.connect(lambda: self._download_recommended(gguf=True))
        self.recommended_table.itemSelectionChanged.connect(self._update_buttons)
        self.local_table.itemSelectionChanged.connect(self._update_buttons)
        self.resize(980, 520)
        self.refresh()

    @staticmethod
    def _table(columns: tuple[str, ...]) -> QTableWidget:
        table = QTableWidget(0, len(columns))
        table.setHorizontalHeaderLabels(list(columns))
        table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        table.verticalHeader().setVisible(False)
        table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        return table

    @property
    def quantization(self) -> str:
        return self.quant_choice.currentText()

    # -- loading and verdicts (off the GUI thread) ----------------------------------------------------------------

    @Slot()
    def refresh(self) -> None:
        self._generation += 1
        generation = self._generation
        self.status_label.setText("Reading the models on disk…")

        def listing() -> tuple[int, list[library.LibraryModel], list[library.RecommendedModel]]:
            return generation, library.list_models(), library.recommended_models()

        self._start("listing", listing)

    def _start(self, name: str, job: Callable[[], Any]) -> None:
        self._tasks.run(name, job, lambda result: self._on_done(name, result), lambda exc: self._on_failed(name, exc))

    def _plan_verdicts(self, generation: int) -> None:
        quant, device = self.quantization, self.device
        local = [(i, m.config) for i, m in enumerate(self.models)]
        recommended = [(i, r.config) for i, r in enumerate(self.recommended)]

        def verdicts() -> tuple[int, list[tuple[str, int, fit.Verdict]]]:
            results: list[tuple[str, int, fit.Verdict]] = []
            for table, rows in (("local", local), ("recommended", recommended)):
                for row, config in rows:
                    results.append((table, row, fit.model_verdict(config, quantization=quant, device=device)))
            return generation, results

        self.status_label.setText("Planning memory for each model…")
        self._start("verdicts", verdicts)

    @Slot(object, object)
    def _on_done(self, name: str, result: Any) -> None:
        generation = result[0]
        if generation != self._generation:
            return  # a newer refresh is under way
        if name == "listing":
            _, self.models, self.recommended = result
            self._fill_local()
            self._fill_recommended()
            self._plan_verdicts(generation)
        elif name == "verdicts":
            for table_name, row, verdict in result[1]:
                table = self.local_table if table_name == "local" else self.recommended_table
                if row < table.rowCount():
                    self._set_verdict(table, row, verdict)
            pending = hub.pending_downloads()
            self.resume_button.setVisible(bool(pending))
            paused = f" Paused downloads: {', '.join(p.repo_id for p in pending)}." if pending else ""
            self.status_label.setText(f"Verdicts for {self.quantization} on {self.device}.{paused}")

    @Slot(object, object)
    def _on_failed(self, name: str, exc: BaseException) -> None:
        self.status_label.setText(_error_text(exc))

    def _set_verdict(self, table: QTableWidget, row: int, verdict: fit.Verdict) -> None:
        item = QTableWidgetItem(_verdict_text(verdict))
        tooltip = verdict.note
        if verdict.max_context:
            tooltip = f"Largest context that fits: {verdict.max_context:,} tokens. {tooltip}".strip()
        item.setToolTip(tooltip)
        item.setData(Qt.ItemDataRole.UserRole, verdict.fits)
        table.setItem(row, table.columnCount() - 1, item)
        if table is self.local_table and row < len(self.models) and not self.models[row].parameters:
            table.setItem(row, 4, QTableWidgetItem(_count(verdict.parameters)))

    def _fill_local(self) -> None:
        self.local_table.setRowCount(len(self.models))
        for row, model in enumerate(self.models):
            cells = (
                model.name if model.complete else f"{model.name} (incomplete)",
                model.kind,
                hub.format_bytes(model.size_bytes),
                model.architecture or "?",
                _count(model.parameters),
                f"{model.context_length:,}" if model.context_length else "?",
                "planning…",
            )
            for column, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if column == 0:
                    item.setToolTip(str(model.path))
                self.local_table.setItem(row, column, item)
        self._update_buttons()

    def _fill_recommended(self) -> None:
        self.recommended_table.setRowCount(len(self.recommended))
        for row, entry in enumerate(self.recommended):
            cells = (
                entry.repo_id,
                entry.size_class,
                _count(entry.parameters),
                f"{entry.context_length:,}" if entry.context_length else "?",
                entry.licence,
                "gated: needs a token" if entry.gated else "no",
                "planning…",
            )
            for column, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if column == 0:
                    item.setToolTip(entry.description)
                self.recommended_table.setItem(row, column, item)
        self._update_buttons()

    # -- actions --------------------------------------------------------------------------------------------------

    def _selected(self, table: QTableWidget) -> int | None:
        rows = table.selectionModel().selectedRows() if table.selectionModel() else []
        return rows[0].row() if rows else None

    def selected_model(self) -> library.LibraryModel | None:
        row = self._selected(self.local_table)
        return self.models[row] if row is not None and row < len(self.models) else None

    @Slot()
    def _update_buttons(self) -> None:
        model = self.selected_model()
        self.delete_button.setEnabled(model is not None and model.deletable)
        self.reveal_button.setEnabled(model is not None)
        row = self._selected(self.recommended_table)
        self.download_recommended_button.setEnabled(row is not None)
        self.download_gguf_button.setEnabled(row is not None and bool(self.recommended[row].gguf_repo))

    @Slot()
    def delete_selected(self) -> None:
        model = self.selected_model()
        if model is None:
            return
        answer = QMessageBox.question(self, "Delete model", f"{model.delete_action}?")
        if answer != QMessageBox.StandardButton.Yes:
            return
        try:
            message = library.delete_model(model)
        except HearthError as exc:
            self.status_label.setText(str(exc))
            return
        self.status_label.setText(message)
        self.refresh()

    @Slot()
    def reveal_selected(self) -> None:
        model = self.selected_model()
        if model is None:
            return
        folder = model.path if model.path.is_dir() else model.path.parent
        if not QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder))):
            self.status_label.setText(f"Could not open a file manager; the model is in {folder}")

    @Slot()
    def add_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Add a model folder")
        if folder:
            self.add_path(Path(folder))

    def add_path(self, path: Path) -> None:
        try:
            added = library.add_path(path)
        except HearthError as exc:
            self.status_label.setText(str(exc))
            return
        self.status_label.setText(f"Added {added.name}.")
        self.refresh()

    @Slot(QTableWidgetItem)
    def _choose_local(self, item: QTableWidgetItem) -> None:
        if item.row() < len(self.models):
            self.model_chosen.emit(self.models[item.row()].spec)

    def _download_recommended(self, *, gguf: bool) -> None:
        row = self._selected(self.recommended_table)
        if row is None:
            return
        entry = self.recommended[row]
        if gguf and entry.gguf_repo:
            self.open_download(entry.gguf_repo, file=entry.gguf_file)
        else:
            self.open_download(entry.repo_id)

    @Slot()
    def resume_paused(self) -> None:
        """One dialog per download left paused (also by an earlier run); Download there continues it."""
        for pending in hub.pending_downloads():
            self.open_download(pending.repo_id, file=pending.file)

    def open_download(self, reference: str, *, file: str | None = None) -> DownloadDialog | None:
        reference = reference.strip()
        if not reference:
            self.status_label.setText("Type a Hugging Face repo id or URL first.")
            return None
        dialog = DownloadDialog(
            reference,
            file=file,
            quantization=self.quantization,
            device=self.device,
            client_factory=self.client_factory,
            parent=self,
        )
        dialog.finished_download.connect(lambda _folder: self.refresh())
        self.dialogs.append(dialog)
        dialog.show()
        return dialog

    def wait_for_workers(self, timeout: float = 60.0) -> None:
        """Until the listing, the verdicts and every dialog's jobs have ended and reported (tests)."""
        for _ in range(10):
            self._tasks.wait(timeout)
            for dialog in self.dialogs:
                dialog.wait_for_workers(timeout)
            if not self._tasks.busy and not any(dialog._tasks.busy for dialog in self.dialogs):
                return

    def closeEvent(self, event: Any) -> None:
        for dialog in self.dialogs:
            dialog.close()  # pauses running downloads: the partial files stay for a resume
        super().closeEvent(event)
