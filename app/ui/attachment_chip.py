"""The attachment bar's parts: one chip per document, and the explicit choice when documents do not fit."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import (
    QDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.core.documents import ExtractedDocument, FitDecision
from app.ui.elided_label import ElidedLabel

CHIP_WIDTH = 320
CHIP_MIN_WIDTH = 220  # the name, and a link's target, stay readable beside other chips


class AttachmentChip(QFrame):
    """One attachment: name, type, token count and share of the free context, or progress, or its error. A file
    reached through a symbolic link shows the file it really is, on a line of its own ("→ /etc/hosts")."""

    remove_clicked = Signal(int)

    def __init__(self, key: int, name: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.key = key
        self.setObjectName("AttachmentChip")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setMaximumWidth(CHIP_WIDTH)
        self.setMinimumWidth(CHIP_MIN_WIDTH)
        self.real_path = ""  # set when a link leads elsewhere
        layout = QHBoxLayout(self)
        layout.setContentsMargins(8, 4, 4, 4)
        layout.setSpacing(6)
        text = QVBoxLayout()
        text.setSpacing(0)
        self.name_label = ElidedLabel(name, mode=Qt.TextElideMode.ElideMiddle, widest=CHIP_WIDTH - 48)
        self.name_label.setObjectName("AttachmentName")
        # A link's real file: the end of its path is kept (the file and its folder), the start elided
        self.link_label = ElidedLabel("", mode=Qt.TextElideMode.ElideLeft, widest=CHIP_WIDTH - 48, prefix="→ ")
        self.link_label.setObjectName("AttachmentDetail")
        self.link_label.hide()
        self.detail_label = QLabel("reading…")
        self.detail_label.setObjectName("AttachmentDetail")
        self.detail_label.setWordWrap(True)
        self.progress = QProgressBar()
        self.progress.setRange(0, 100)
        self.progress.setTextVisible(False)
        self.progress.setFixedHeight(4)
        text.addWidget(self.name_label)
        text.addWidget(self.link_label)
        text.addWidget(self.detail_label)
        text.addWidget(self.progress)
        layout.addLayout(text, 1)
        self.remove_button = QToolButton()
        self.remove_button.setText("✕")
        self.remove_button.setAutoRaise(True)
        self.remove_button.setToolTip(f"Remove {name}")
        self.remove_button.clicked.connect(self._remove)
        layout.addWidget(self.remove_button, 0, Qt.AlignmentFlag.AlignTop)

    def set_link_target(self, name: str, real_path: str) -> None:
        """`name` is a link to `real_path`: that file is what is read (and sent), so the chip says it."""
        self.real_path = real_path
        explanation = f"{name} is a link: the text is read from {real_path}"
        self.name_label.set_full_text(name, tooltip=explanation)
        self.link_label.set_full_text(real_path, tooltip=explanation)
        self.link_label.show()

    @Slot()
    def _remove(self) -> None:
        self.remove_clicked.emit(self.key)

    def set_progress(self, fraction: float) -> None:
        self.progress.setValue(round(fraction * 100))

    def set_ready(self, type_label: str, tokens: int | None, share: float | None) -> None:
        self.progress.hide()
        parts = [type_label]
        parts.append(f"{tokens:,} tokens" if tokens is not None else "tokens: counted when a model is loaded")
        if share is not None:
            parts.append(f"{share:.0%} of free context")
        self.detail_label.setText(" · ".join(parts))
        self.setProperty("overflow", share is not None and share > 1.0)
        self.style().unpolish(self)
        self.style().polish(self)

    def set_error(self, message: str) -> None:
        self.progress.hide()
        self.setProperty("error", True)
        self.detail_label.setText(message)
        self.detail_label.setStyleSheet("color: #c0392b;")
        self.remove_button.setToolTip("Dismiss")


class FitChoiceDialog(QDialog):
    """The explicit choice when documents do not fit: trim, most relevant passages, or cancel."""

    def __init__(
        self, decision: FitDecision, documents: Sequence[ExtractedDocument], parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("The documents do not fit")
        self.choice = "cancel"
        layout = QVBoxLayout(self)
        names = ", ".join(d.name for d in documents)
        need, free = decision.total_document_tokens, decision.available_for_documents
        drop = decision.overflow_tokens
        self.summary = QLabel(
            f"{names} {'needs' if len(documents) == 1 else 'need'} {need:,} tokens, but only {free:,} are free in "
            "the context window "
            f"for documents. Nothing has been dropped yet: choose what to send."
        )
        self.summary.setWordWrap(True)
        layout.addWidget(self.summary)
        self.trim_button = QPushButton(
            f"Trim to fit: keep the start of each document, drop about {drop:,} tokens ({drop / max(need, 1):.0%})"
        )
        self.relevant_button = QPushButton("Use only the passages most relevant to the question (ranked with BM25)")
        self.cancel_button = QPushButton("Cancel: send nothing, keep my question")
        for button, choice in (
            (self.trim_button, "trim"),
            (self.relevant_button, "relevant"),
            (self.cancel_button, "cancel"),
        ):
            button.setProperty("choice", choice)
            button.clicked.connect(self._chosen)
            layout.addWidget(button)
        self.cancel_button.setDefault(True)

    @Slot()
    def _chosen(self) -> None:
        sender = self.sender()
        self.choice = str(sender.property("choice")) if sender is not None else "cancel"
        if self.choice == "cancel":
            self.reject()
        else:
            self.accept()


def ask_fit_choice(decision: FitDecision, documents: Sequence[ExtractedDocument], parent: QWidget | None) -> str:
    dialog = FitChoiceDialog(decision, documents, parent)
    dialog.exec()
    return dialog.choice
