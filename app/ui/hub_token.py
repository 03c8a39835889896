"""The Hub-token box of the settings dialog: enter, save (to the OS keyring), remove; says so when there is no keyring.

The widget never holds the token longer than needed: it goes straight to app.core.storage.secrets.
"""

from __future__ import annotations

from PySide6.QtCore import Signal, Slot
from PySide6.QtWidgets import QCheckBox, QGroupBox, QHBoxLayout, QLabel, QLineEdit, QPushButton, QVBoxLayout, QWidget

from app.core.errors import HearthError
from app.core.storage import secrets


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
