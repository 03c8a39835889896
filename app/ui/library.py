"""The model library window: models on this machine and the recommended list, each with the planner's memory verdict.

Listing and planning run on a TaskRunner (app/ui/tasks.py): results come back to the GUI thread through queued
signals (the planner imports torch: never on the GUI thread). Downloads open app/ui/download_dialog.py. Nothing
here imports torch or the model libraries.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QSize, Qt, QUrl, Signal, Slot
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QDialog,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.core.engines.verdicts import library_verdict
from app.core.errors import HearthError
from app.core.fastpath.compile_notice import announcing_compile
from app.core.memory import verdict as fit
from app.core.memory.verdict import VERDICT_CONTEXT
from app.core.models import hub, hub_repo, library
from app.core.models.quant import QUANTIZATIONS, auto_summary
from app.ui.dialogs import fit_to_screen
from app.ui.download_dialog import DownloadDialog, error_text
from app.ui.tasks import TaskRunner

log = logging.getLogger(__name__)

LOCAL_COLUMNS = ("Name", "Kind", "Size", "Architecture", "Parameters", "Context", "Memory")
RECOMMENDED_COLUMNS = ("Model", "Class", "Parameters", "Context", "Licence", "Gated", "Memory")
PLANNING = "Planning memory for each model…"


def _cell(text: str) -> QTableWidgetItem:
    item = QTableWidgetItem(text)
    item.setToolTip(text)
    return item


def memory_explanation(quantization: str, device: str) -> str:
    """What the Memory column says, in words: for which quantization, device and context the planner planned."""
    quant = f"automatic quantization ({auto_summary()})" if quantization == "auto" else f"{quantization}"
    where = "the best device on this computer" if device == "auto" else device
    return (
        f"Memory: what each model needs at {quant} on {where}, with a {VERDICT_CONTEXT:,}-token context, and whether "
        "that fits the free memory now; hover a cell for the largest context that fits."
    )


def _count(parameters: int | None) -> str:
    if not parameters:
        return "?"
    return f"{parameters / 1e9:.1f} B" if parameters >= 1e9 else f"{parameters / 1e6:.0f} M"


class LibraryWindow(QDialog):
    """Models on disk and the recommended list, each with the planner's verdict; download, delete, reveal. A
    dialog that does not block the window (Close or Escape closes it)."""

    model_chosen = Signal(str)  # a spec for Settings → model (double-click)
    planning_stage = Signal(str)  # a slow stage of the verdicts (the CPU kernel's first compile), from their thread

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
        self.setModal(False)
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
        self.planning_stage.connect(
            lambda stage: self.status_label.setText(f"{PLANNING} {stage}"), Qt.ConnectionType.QueuedConnection
        )
        self.close_button = QPushButton("Close")
        self.close_button.clicked.connect(self.reject)

        self.local_table = self._table(LOCAL_COLUMNS)
        self.local_table.setTextElideMode(Qt.TextElideMode.ElideMiddle)
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
        self.recommended_table.setTextElideMode(Qt.TextElideMode.ElideLeft)  # "…/SmolLM2-135M-Instruct": org first
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
        quant_label = QLabel("Memory at")
        quant_label.setToolTip("The quantization the Memory column plans for")
        top.addWidget(quant_label)
        top.addWidget(self.quant_choice)

        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.tabs, 1)
        bottom = QHBoxLayout()
        bottom.addWidget(self.status_label, 1)
        bottom.addWidget(self.close_button, 0, Qt.AlignmentFlag.AlignBottom)
        layout.addLayout(bottom)

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
        fit_to_screen(self, QSize(980, 560))
        self.refresh()

    @staticmethod
    def _table(columns: tuple[str, ...]) -> QTableWidget:
        table = QTableWidget(0, len(columns))
        table.setHorizontalHeaderLabels(list(columns))
        table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        table.verticalHeader().setVisible(False)
        # The name takes what is left; every other column is as wide as its contents (nothing cut: the table
        # scrolls sideways when the window is narrow), and every cell's whole text is its tooltip.
        header = table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        header.setMinimumSectionSize(60)
        # One line a row: with word wrap Qt broke "org/model" at the slash and cut the second line, so three
        # HuggingFaceTB/… rows could not be told apart; unwrapped, the table's elide mode decides what shows.
        table.setWordWrap(False)
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
        local = list(enumerate(self.models))
        recommended = [(i, r.config) for i, r in enumerate(self.recommended)]

        def verdicts() -> tuple[int, list[tuple[str, int, fit.Verdict]]]:
            # a model on disk: the plan of the runtime its load would take (a GGUF's plans without torch)
            with announcing_compile(self.planning_stage.emit):
                results: list[tuple[str, int, fit.Verdict]] = [
                    ("local", row, library_verdict(model, quantization=quant, device=device)) for row, model in local
                ]
            for row, config in recommended:
                results.append(("recommended", row, fit.model_verdict(config, quantization=quant, device=device)))
            return generation, results

        self.status_label.setText(PLANNING)
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
            self.status_label.setText(memory_explanation(self.quantization, self.device) + paused)

    @Slot(object, object)
    def _on_failed(self, name: str, exc: BaseException) -> None:
        self.status_label.setText(error_text(exc))

    def _set_verdict(self, table: QTableWidget, row: int, verdict: fit.Verdict) -> None:
        item = QTableWidgetItem(verdict.summary)
        tooltip = f"{verdict.summary}. {verdict.note}".strip()
        if verdict.max_context:
            tooltip = f"Largest context that fits: {verdict.max_context:,} tokens. {tooltip}".strip()
        item.setToolTip(tooltip)
        item.setData(Qt.ItemDataRole.UserRole, verdict.fits)
        table.setItem(row, table.columnCount() - 1, item)
        if table is self.local_table and row < len(self.models) and not self.models[row].parameters:
            table.setItem(row, 4, _cell(_count(verdict.parameters)))

    def _fill_local(self) -> None:
        self.local_table.setRowCount(len(self.models))
        for row, model in enumerate(self.models):
            cells = (
                model.name if model.complete else f"{model.name} (incomplete)",
                model.kind,
                hub_repo.format_bytes(model.size_bytes),
                model.architecture or "?",
                _count(model.parameters),
                f"{model.context_length:,}" if model.context_length else "?",
                "planning…",
            )
            for column, text in enumerate(cells):
                item = _cell(text)
                if column == 0:
                    item.setToolTip(f"{text}\n{model.path}")
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
                "yes: needs a token" if entry.gated else "no",
                "planning…",
            )
            for column, text in enumerate(cells):
                item = _cell(text)
                if column == 0:
                    item.setToolTip(f"{text}\n{entry.description}")
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

    def _close_downloads(self) -> None:
        for dialog in self.dialogs:
            dialog.close()  # pauses running downloads: the partial files stay for a resume

    def reject(self) -> None:  # Close and Escape
        self._close_downloads()
        super().reject()

    def closeEvent(self, event: Any) -> None:
        self._close_downloads()
        super().closeEvent(event)
