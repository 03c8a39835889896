"""Message updates a full disk held back (HistoryStore.save_pending): said in the banner, retried every few seconds
until they are written, and asked about before the window closes with some still unsaved."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject, QTimer
from PySide6.QtWidgets import QMessageBox, QWidget

from app.core.storage.history import HistoryStore
from app.ui.banner import Banner

RETRY_MS = 5000  # a retry is one cheap transaction; it succeeds as soon as anything frees space
SAVED_LINE = "Every message is saved now."


class UnsavedWatcher(QObject):
    def __init__(self, store: Callable[[], HistoryStore], banner: Banner, parent: QWidget) -> None:
        super().__init__(parent)
        self._store = store
        self._banner = banner
        self._window = parent
        self._shown = ""  # the notice in the banner now
        self.timer = QTimer(self)
        self.timer.setInterval(RETRY_MS)
        self.timer.timeout.connect(self.retry)

    def check(self) -> None:
        """After a write (a reply finished): say so when something is held back, and start retrying."""
        notice = self._store().unsaved_notice()
        if not notice:
            return
        if notice != self._shown:
            self._banner.withdraw(self._shown)
            self._banner.show_message(notice)
            self._shown = notice
        self.timer.start()

    def retry(self) -> None:
        store = self._store()
        if store.save_pending():
            self.timer.stop()
            self._banner.withdraw(self._shown)
            self._shown = ""
            self._banner.show_message(SAVED_LINE)
        else:
            self.check()  # the count may have grown

    def may_close(self) -> bool:
        """Whether the window may close: everything is saved (one last try), or the user chose to lose it."""
        store = self._store()
        if store.save_pending():
            return True
        answer = QMessageBox.warning(
            self._window,
            "Unsaved messages",
            f"{store.unsaved_notice()}\n\nFree some space and choose Retry, or quit without them.",
            QMessageBox.StandardButton.Retry | QMessageBox.StandardButton.Discard | QMessageBox.StandardButton.Cancel,
            QMessageBox.StandardButton.Retry,
        )
        if answer == QMessageBox.StandardButton.Retry:
            return self.may_close()
        return answer == QMessageBox.StandardButton.Discard
