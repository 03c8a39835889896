"""The input area: Enter sends, Shift+Enter starts a new line, Esc stops; Send becomes Stop while generating."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QFrame, QHBoxLayout, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget


class InputBox(QFrame):
    send_requested = Signal(str)
    stop_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("InputCard")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 8, 8, 8)
        layout.setSpacing(4)
        # Documents (drag and drop) put their AttachmentBar here, above the text: see attach_bar().
        self.attachment_slot = QVBoxLayout()
        self.attachment_slot.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(self.attachment_slot)
        row = QHBoxLayout()
        row.setSpacing(8)
        layout.addLayout(row)
        self.editor = QPlainTextEdit()
        self.editor.setObjectName("Input")
        self.editor.setPlaceholderText("Message Hearth  (Enter to send, Shift+Enter for a new line)")
        self.editor.setFixedHeight(64)
        self.editor.installEventFilter(self)
        row.addWidget(self.editor, 1)
        self.button = QPushButton("Send")
        self.button.setObjectName("Primary")
        self.button.setMinimumWidth(84)
        self.button.clicked.connect(self._button_clicked)
        row.addWidget(self.button, 0, Qt.AlignmentFlag.AlignBottom)
        self.generating = False

    def attach_bar(self, widget: QWidget) -> None:
        """Where the documents feature puts its attachment bar."""
        self.attachment_slot.addWidget(widget)

    def text(self) -> str:
        return self.editor.toPlainText()

    def set_generating(self, generating: bool) -> None:
        self.generating = generating
        self.button.setText("Stop" if generating else "Send")
        self.button.setObjectName("Stop" if generating else "Primary")
        self.button.style().unpolish(self.button)
        self.button.style().polish(self.button)

    def _button_clicked(self) -> None:
        if self.generating:
            self.stop_requested.emit()
        else:
            self.submit()
        self.editor.setFocus(Qt.FocusReason.OtherFocusReason)  # the next message is typed at once, no click

    def submit(self) -> None:
        text = self.editor.toPlainText().strip()
        if not text or self.generating:
            return
        self.editor.clear()
        self.send_requested.emit(text)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if watched is self.editor and event.type() == QEvent.Type.KeyPress and isinstance(event, QKeyEvent):
            key = event.key()
            if key in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
                if event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
                    return False  # the editor inserts the new line
                self.submit()
                return True
            if key == Qt.Key.Key_Escape and self.generating:
                self.stop_requested.emit()
                return True
        return super().eventFilter(watched, event)
