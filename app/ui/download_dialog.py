"""The download dialog of the model library: repo -> plan (config first, the memory verdict before any weights) ->
download with progress, pause/resume and cancel. Lookups and downloads run on a TaskRunner (app/ui/tasks.py).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QObject, QSize, Signal, Slot
from PySide6.QtWidgets import QComboBox, QDialog, QHBoxLayout, QLabel, QProgressBar, QPushButton, QVBoxLayout, QWidget

from app.core.errors import HearthError
from app.core.memory import verdict as fit
from app.core.models import hub, hub_repo
from app.core.storage import secrets
from app.ui.dialogs import fit_to_screen
from app.ui.tasks import TaskRunner

log = logging.getLogger(__name__)


def error_text(exc: BaseException) -> str:
    if isinstance(exc, HearthError):
        return str(exc)
    log.exception("unexpected error in the model library", exc_info=exc)
    return secrets.redact(f"Unexpected error: {type(exc).__name__}: {exc}")


@dataclass(frozen=True)
class _Prepared:
    plan: hub_repo.DownloadPlan
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
        self.plan: hub_repo.DownloadPlan | None = None
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
        self.progress_bar.setTextVisible(False)  # a thin bar: the figures are in the line under it
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
        self.setMinimumWidth(480)  # room for a sentence: errors and the plan wrap on two or three lines
        fit_to_screen(self, QSize(560, 220))
        self._prepare(file)

    def _set_state(self, state: str) -> None:
        self.state = state
        self.start_button.setVisible(state in ("ready", "failed"))
        self.start_button.setEnabled(state in ("ready", "failed") and self.plan is not None)
        self.pause_button.setVisible(state in ("downloading", "paused", "pausing"))
        self.pause_button.setEnabled(state in ("downloading", "paused"))
        self.pause_button.setText("Resume" if state == "paused" else "Pause")
        self.cancel_button.setEnabled(state in ("downloading", "paused", "pausing"))
        self.progress_bar.setVisible(self.plan is not None)  # nothing to show progress of before the lookup
        self.verdict_label.setVisible(bool(self.verdict_label.text()))
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
            already = f", {hub_repo.format_bytes(plan.present_bytes)} already downloaded" if plan.present_bytes else ""
            self.summary.setText(
                f"{plan.label}: {len(plan.files)} files, {hub_repo.format_bytes(plan.total_bytes)} "
                f"({gated}{licence}safetensors/GGUF only){already}."
            )
            self.verdict_label.setText(f"Memory at {self.quantization} on {self.device}: {result.verdict.summary}")
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

    def _fill_choices(self, files: tuple[hub_repo.RepoFile, ...], current: str | None) -> None:
        self.file_choice.clear()
        self.file_choice.addItem("Choose a GGUF file…", None)
        for repo_file in files:
            self.file_choice.addItem(f"{repo_file.name} ({hub_repo.format_bytes(repo_file.size)})", repo_file.name)
            if repo_file.name == current:
                self.file_choice.setCurrentIndex(self.file_choice.count() - 1)
        self.file_choice.setVisible(True)

    @Slot(object, object)
    def _on_failed(self, name: str, exc: BaseException) -> None:
        if name == "download" and self._cancel.is_set() and isinstance(exc, hub_repo.DownloadCancelled):
            if self._discard_when_stopped:
                self._discard()
            else:
                self.speed_label.setText("Paused: Resume continues where it stopped, even after a restart.")
                self._set_state("paused")
            return
        if isinstance(exc, hub_repo.FileChoiceNeededError):
            self.summary.setText(f"{self.reference} holds several GGUF files: choose one.")
            self._fill_choices(tuple(hub_repo.RepoFile(name, None) for name in exc.choices), None)
            self._set_state("choose-file")
            return
        if name == "prepare":
            self.summary.setText(f"Could not look up {self.reference}.")
        self.error_label.setText(error_text(exc))
        self._set_state("failed")

    @Slot(object)
    def _on_progress(self, event: hub_repo.DownloadProgress) -> None:
        self.progress_bar.setValue(int(event.fraction * 1000))
        speed = f"{hub_repo.format_bytes(event.bytes_per_s)}/s" if event.bytes_per_s else "measuring speed"
        percent = f" ({event.fraction:.0%})" if event.total_bytes else ""
        text = (
            f"{hub_repo.format_bytes(event.done_bytes)} of {hub_repo.format_bytes(event.total_bytes)}{percent}"
            f" · {speed} · "
            f"{hub_repo.format_duration(event.eta_s)} left · {event.file} ({event.file_index}/{event.file_count})"
        )
        if event.stage == "verifying":
            text += " · checking"
        if self.state != "pausing":
            self.speed_label.setText(text)

    def wait_for_workers(self, timeout: float = 30.0) -> None:
        self._tasks.wait(timeout)

    def _pause_on_close(self) -> None:
        if self.state in ("downloading", "pausing"):
            self._cancel.set()  # closing pauses: the partial file stays for a resume

    def reject(self) -> None:  # Escape
        self._pause_on_close()
        super().reject()

    def closeEvent(self, event: Any) -> None:
        self._pause_on_close()
        super().closeEvent(event)
