"""The attachment bar of the input area: documents as chips, dropped, picked or pasted, read off the GUI thread.

Integration API (for the main window)
-------------------------------------
    bar = AttachmentBar(max_bytes=DEFAULT_MAX_BYTES)     # extraction limit per file
    input_box.attach_bar(bar)
    bar.install_drop_target(main_window)                 # files dropped anywhere on the window
    bar.install_drop_target(input_box.editor)            # drops AND pasted paths/files (Ctrl+V) in the input box
    bar.set_token_counter(count)   # count(text) -> int with the current model's tokenizer; None = unknown.
                                   # It is called on a worker thread of the bar: pass one that is safe there
                                   # (e.g. guarded by the same lock the engine worker takes, or a tokenizer copy).
    bar.set_remaining_context(n)   # tokens left for the next message: window - conversation - reply reserve
    docs = bar.documents_for_send(question)
        # None: not ready (files still being read) or the user cancelled the fit choice -> do not send, and put
        #       the question back in the editor if it was cleared (InputBox.submit clears it before emitting).
        # []:   nothing attached.
        # else: the documents to send, already trimmed / reduced to passages if the user chose so
        #       (each has .fit_note / .dropped_tokens); compose with app.core.documents.compose_user_message
        #       and store them with doc.as_history_attachment(token_count).
    bar.clear()                    # after the message went out

Signals: attachments_changed() (a chip was added, removed, finished or failed), busy_changed(bool) (files are
being read: keep Send disabled meanwhile if you like), error_shown(str) (a per-file error, also shown inline
on its chip; the text in the input box is never touched).

The bar never imports torch: token counts come in through the callable above.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

from PySide6.QtCore import QEvent, QMimeData, QObject, Qt, Signal, Slot
from PySide6.QtGui import QDragEnterEvent, QDragMoveEvent, QDropEvent, QGuiApplication, QKeyEvent, QKeySequence
from PySide6.QtWidgets import (
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QScrollArea,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.core.documents import (
    DEFAULT_MAX_BYTES,
    DocumentError,
    ExtractedDocument,
    FitDecision,
    apply_fit,
    document_block,
    extract_document,
    remote_send_notice,
)
from app.ui.attachment_chip import AttachmentChip, ask_fit_choice
from app.ui.tasks import TaskRunner

TokenCounter = Callable[[str], int]
FitChooser = Callable[[FitDecision, Sequence[ExtractedDocument]], str]
FilePicker = Callable[[], list[str]]

FILE_FILTER = (
    "Documents (*.txt *.md *.markdown *.rst *.csv *.tsv *.json *.html *.htm *.pdf *.docx *.py *.js *.ts *.c *.cpp "
    "*.h *.java *.go *.rs *.rb *.sh *.sql *.yaml *.yml *.toml *.xml *.log);;All files (*)"
)


def local_paths_from_mime(mime: QMimeData) -> list[Path]:
    """Local files in a drop or a paste: file URLs, or text whose every line is an existing path."""
    if mime.hasUrls():
        return [Path(url.toLocalFile()) for url in mime.urls() if url.isLocalFile()]
    if not mime.hasText():
        return []
    paths: list[Path] = []
    for line in mime.text().splitlines():
        line = line.strip().strip("'\"")
        if not line:
            continue
        if line.startswith("file://"):
            line = unquote(urlparse(line).path)
        candidate = Path(line).expanduser()
        if not candidate.is_absolute() or not candidate.exists():
            return []  # ordinary text: let the editor paste it
        paths.append(candidate)
    return paths


class _ProgressRelay(QObject):
    progress = Signal(int, float)  # job id, fraction read (emitted from the runner's thread, received queued)


def _read_document(
    path: Path,
    document: ExtractedDocument | None,
    max_bytes: int,
    counter: TokenCounter | None,
    cancel: threading.Event,
    progress: Callable[[float], None],
) -> tuple[ExtractedDocument, int]:
    """Read one file (or recount an already read one), off the GUI thread: the document and its token count
    (-1 = unknown)."""
    document = document or extract_document(path, max_bytes=max_bytes, progress=progress, cancel=cancel)
    tokens = -1
    if counter is not None:
        try:
            tokens = counter(document_block(document)) + 2
        except Exception:  # a counter that fails leaves the count unknown, not the file unusable
            tokens = -1
    return document, tokens


def _read_failure(path: Path, exc: BaseException) -> str:
    if isinstance(exc, DocumentError):
        return str(exc)
    return f"{path.name} could not be read ({type(exc).__name__}: {exc})."


@dataclass
class _Entry:
    key: int
    path: Path
    chip: AttachmentChip
    cancel: threading.Event = field(default_factory=threading.Event)
    document: ExtractedDocument | None = None
    tokens: int | None = None
    error: str | None = None
    pending: int | None = None  # the id of the worker job reading or counting this file, if any


class AttachmentBar(QWidget):
    """See the module docstring for the integration API."""

    attachments_changed = Signal()
    busy_changed = Signal(bool)
    error_shown = Signal(str)

    def __init__(self, parent: QWidget | None = None, *, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        super().__init__(parent)
        self.setObjectName("AttachmentBar")
        self.setAcceptDrops(True)
        self.max_bytes = max_bytes
        self._counter: TokenCounter | None = None
        self._remaining: int | None = None
        self._entries: dict[int, _Entry] = {}
        self._next_key = 0
        self._busy = False
        self._drop_targets: list[QObject] = []
        # Jobs in flight: job id -> entry key.
        self._jobs: dict[int, int] = {}
        self._next_job = 0
        self._tasks = TaskRunner("attachments", max_threads=2, parent=self)
        self._progress_relay = _ProgressRelay(self)
        self._progress_relay.progress.connect(self._on_progress)
        # Replaceable for tests and for other front ends: the file dialog and the fit dialog.
        self.file_picker: FilePicker = self._pick_with_dialog
        self.fit_chooser: FitChooser = self._choose_with_dialog

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        row = QHBoxLayout()
        row.setSpacing(6)
        self.attach_button = QToolButton()
        self.attach_button.setText("Attach…")
        self.attach_button.setToolTip("Attach documents (or drop files here, or paste their paths)")
        self.attach_button.clicked.connect(self.choose_files)
        row.addWidget(self.attach_button, 0, Qt.AlignmentFlag.AlignTop)
        self._chips = QWidget()
        self._chip_row = QHBoxLayout(self._chips)
        self._chip_row.setContentsMargins(0, 0, 0, 0)
        self._chip_row.setSpacing(6)
        self._chip_row.addStretch(1)
        self._scroll = QScrollArea()
        self._scroll.setWidget(self._chips)
        self._scroll.setWidgetResizable(True)
        self._scroll.setFrameShape(QFrame.Shape.NoFrame)
        self._scroll.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self._scroll.setMaximumHeight(96)  # a chip of four lines: name, a link's target, two of details
        self._scroll.hide()
        row.addWidget(self._scroll, 1)
        row.addStretch(0)  # takes the room only while there are no chips: Attach… stays on the left
        layout.addLayout(row)
        self.status_label = QLabel("")
        self.status_label.setObjectName("AttachmentStatus")
        self.status_label.setWordWrap(True)
        self.status_label.hide()
        layout.addWidget(self.status_label)
        # With a remote engine: which files' text will leave this computer, said before the user sends.
        self.destination: str | None = None
        self.destination_label = QLabel("")
        self.destination_label.setObjectName("ErrorText")
        self.destination_label.setWordWrap(True)
        self.destination_label.hide()
        layout.addWidget(self.destination_label)

    # -- public API ------------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return any(entry.pending is not None for entry in self._entries.values())

    def chips(self) -> list[AttachmentChip]:
        return [entry.chip for entry in self._entries.values()]

    def documents(self) -> list[ExtractedDocument]:
        """Documents read successfully, in the order they were attached."""
        return [e.document for e in self._entries.values() if e.document is not None]

    def token_counts(self) -> list[int | None]:
        return [e.tokens for e in self._entries.values() if e.document is not None]

    def errors(self) -> list[str]:
        return [e.error for e in self._entries.values() if e.error is not None]

    def add_paths(self, paths: Sequence[str | Path]) -> None:
        """Attach files; each is read on the bar's task runner and shows progress on its chip."""
        for raw in paths:
            path = Path(raw)
            key = self._next_key
            self._next_key += 1
            chip = AttachmentChip(key, path.name or str(path))
            real = os.path.realpath(path)
            if real != os.path.abspath(path):  # a link: the file it leads to is what is read
                chip.set_link_target(path.name or str(path), real)
            chip.remove_clicked.connect(self.remove)
            entry = _Entry(key=key, path=path, chip=chip)
            self._entries[key] = entry
            self._chip_row.insertWidget(self._chip_row.count() - 1, chip)
            self._start(entry, document=None)
        self._scroll.setVisible(bool(self._entries))
        self._refresh()

    @Slot()
    def choose_files(self) -> None:
        paths = self.file_picker()
        if paths:
            self.add_paths(paths)

    @Slot(int)
    def remove(self, key: int) -> None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        entry.cancel.set()  # a read in progress stops at its next chunk or page
        entry.chip.hide()
        entry.chip.deleteLater()
        self._scroll.setVisible(bool(self._entries))
        self._refresh()
        self._set_busy(self.busy)
        self.attachments_changed.emit()

    def clear(self) -> None:
        for key in list(self._entries):
            self.remove(key)

    def set_token_counter(self, counter: TokenCounter | None) -> None:
        """A new model (tokenizer): recount every attached document off the GUI thread."""
        self._counter = counter
        for entry in self._entries.values():
            if entry.document is not None:
                entry.tokens = None
                self._start(entry, document=entry.document)
        self._refresh()

    def set_remaining_context(self, tokens: int | None) -> None:
        self._remaining = tokens
        self._refresh()

    def documents_for_send(self, question: str) -> list[ExtractedDocument] | None:
        """What to send with `question`, after the explicit fit choice if needed; None = do not send."""
        if self.busy:
            self._show_status("Still reading the attached files; send again when they are ready.")
            return None
        documents = self.documents()
        if not documents:
            return []
        counts = self.token_counts()
        if self._counter is None or self._remaining is None or any(c is None for c in counts):
            return documents  # cannot measure yet: the engine still refuses an oversized prompt, never truncates
        decision = FitDecision(
            document_tokens=tuple(c for c in counts if c is not None),
            question_tokens=self._counter(question),
            remaining_tokens=self._remaining,
        )
        if decision.fits:
            return documents
        choice = self.fit_chooser(decision, documents)
        if choice not in ("trim", "relevant"):
            self._show_status("Not sent: the documents do not fit. Remove some, or choose trim or passages.")
            return None
        result = apply_fit(
            documents,
            question,
            choice,
            count_tokens=self._counter,
            available_tokens=decision.available_for_documents,
        )
        self._show_status("\n".join(result.notes))
        return list(result.documents)

    def install_drop_target(self, widget: QWidget) -> None:
        """Let `widget` (the window, the input box) take file drops; a text editor also gets pasted paths."""
        widget.setAcceptDrops(True)
        widget.installEventFilter(self)
        self._drop_targets.append(widget)
        viewport = getattr(widget, "viewport", None)
        if callable(viewport):  # text editors receive drops on their viewport
            port = viewport()
            port.setAcceptDrops(True)
            port.installEventFilter(self)
            self._drop_targets.append(port)

    def shutdown(self, timeout_ms: int = 5000) -> None:
        """Cancel reads in progress and wait for the workers (before the window closes)."""
        for entry in self._entries.values():
            entry.cancel.set()
        self._tasks.shutdown(timeout_ms)

    # -- drops and pastes ------------------------------------------------------------------------
    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        self._accept_files(event)

    def dragMoveEvent(self, event: QDragMoveEvent) -> None:
        self._accept_files(event)

    @staticmethod
    def _accept_files(event: QDragMoveEvent) -> None:
        if local_paths_from_mime(event.mimeData()):
            event.acceptProposedAction()
        else:
            event.ignore()

    def dropEvent(self, event: QDropEvent) -> None:
        paths = local_paths_from_mime(event.mimeData())
        if paths:
            event.acceptProposedAction()
            self.add_paths(paths)
        else:
            event.ignore()

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if watched in self._drop_targets:
            kind = event.type()
            if kind in (QEvent.Type.DragEnter, QEvent.Type.DragMove) and isinstance(event, QDragMoveEvent):
                if local_paths_from_mime(event.mimeData()):
                    event.acceptProposedAction()
                    return True
            elif kind == QEvent.Type.Drop and isinstance(event, QDropEvent):
                paths = local_paths_from_mime(event.mimeData())
                if paths:
                    event.acceptProposedAction()
                    self.add_paths(paths)
                    return True
            elif (
                kind == QEvent.Type.KeyPress
                and isinstance(event, QKeyEvent)
                and event.matches(QKeySequence.StandardKey.Paste)
            ):
                mime = QGuiApplication.clipboard().mimeData()
                paths = local_paths_from_mime(mime) if mime is not None else []
                if paths:
                    self.add_paths(paths)
                    return True  # the paths become attachments; the typed text stays as it is
        return super().eventFilter(watched, event)

    # -- workers ---------------------------------------------------------------------------------
    def _start(self, entry: _Entry, document: ExtractedDocument | None) -> None:
        job_id = self._next_job
        self._next_job += 1
        self._jobs[job_id] = entry.key
        entry.pending = job_id  # a newer job (a recount) makes the reports of older ones stale
        self._set_busy(True)
        path, max_bytes, counter, cancel, relay = (
            entry.path,
            self.max_bytes,
            self._counter,
            entry.cancel,
            self._progress_relay,
        )

        def progress(fraction: float) -> None:
            with contextlib.suppress(RuntimeError):  # the bar is gone: the read ends at its next cancel check
                relay.progress.emit(job_id, fraction)

        self._tasks.run(
            path.name,
            lambda: _read_document(path, document, max_bytes, counter, cancel, progress),
            lambda result: self._on_finished(job_id, *result),
            lambda exc: self._on_failed(job_id, _read_failure(path, exc)),
        )

    def _current(self, job_id: int, *, done: bool) -> _Entry | None:
        """The entry a job reports for, or None when it was removed or a newer job replaced this one."""
        key = self._jobs.pop(job_id, None) if done else self._jobs.get(job_id)
        entry = self._entries.get(key) if key is not None else None
        if entry is None or entry.pending != job_id:
            return None
        if done:
            entry.pending = None
        return entry

    @Slot(int, float)
    def _on_progress(self, job_id: int, fraction: float) -> None:
        entry = self._current(job_id, done=False)
        if entry is not None:
            entry.chip.set_progress(fraction)

    @Slot(int, object, int)
    def _on_finished(self, job_id: int, document: ExtractedDocument, tokens: int) -> None:
        entry = self._current(job_id, done=True)
        if entry is None:
            return
        entry.document = document
        entry.tokens = tokens if tokens >= 0 else None
        self._refresh()
        self._set_busy(self.busy)
        self.attachments_changed.emit()

    @Slot(int, str)
    def _on_failed(self, job_id: int, message: str) -> None:
        entry = self._current(job_id, done=True)
        if entry is None:
            return
        entry.error = message
        entry.chip.set_error(message)
        self._set_busy(self.busy)
        self.error_shown.emit(message)
        self.attachments_changed.emit()

    def _set_busy(self, busy: bool) -> None:
        if busy != self._busy:
            self._busy = busy
            self.busy_changed.emit(busy)

    # -- display ---------------------------------------------------------------------------------
    def set_destination(self, destination: str | None) -> None:
        """A remote engine ("engine NAME (URL)") receives what is sent, or None for a model on this computer."""
        self.destination = destination
        self._refresh()

    def _refresh(self) -> None:
        total = 0
        for entry in self._entries.values():
            if entry.document is None:
                continue
            share = entry.tokens / self._remaining if entry.tokens is not None and self._remaining else None
            label = entry.document.type_label
            if entry.document.pages:
                label += f", {entry.document.pages} pages"
            entry.chip.set_ready(label, entry.tokens, share)
            total += entry.tokens or 0
        if self._remaining is not None and total > self._remaining:
            self._show_status(
                f"The documents need {total:,} tokens; {self._remaining:,} are free. "
                "When you send, you choose: trim them, keep the passages relevant to the question, or cancel."
            )
        elif not self.errors():
            self._show_status("")
        notice = remote_send_notice(self.documents(), self.destination) if self.destination else ""
        self.destination_label.setText(notice)
        self.destination_label.setVisible(bool(notice))

    def _show_status(self, text: str) -> None:
        self.status_label.setText(text)
        self.status_label.setVisible(bool(text))

    def _pick_with_dialog(self) -> list[str]:
        paths, _ = QFileDialog.getOpenFileNames(self, "Attach documents", "", FILE_FILTER)
        return list(paths)

    def _choose_with_dialog(self, decision: FitDecision, documents: Sequence[ExtractedDocument]) -> str:
        return ask_fit_choice(decision, documents, self)
