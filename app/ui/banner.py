"""The window's notices: a dismissible banner above the chat, and the bridge that brings errors to it from threads."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QToolButton, QWidget


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

    def withdraw(self, text: str) -> None:
        """Take one message back (it no longer holds); hidden when none is left."""
        if text in self.messages:
            self.messages.remove(text)
            self.label.setText("\n\n".join(self.messages))
            if not self.messages:
                self.dismiss()

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

    def withdraw_offer(self) -> None:
        self._action = None
        self.action_button.hide()

    def dismiss(self) -> None:
        self.messages.clear()
        self.withdraw_offer()
        self.hide()
