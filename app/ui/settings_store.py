"""The window's one settings object, with a change signal per key (qutebrowser's `config.changed` is the model).

Everything in app/ui reads `store.current` when it needs a value and connects to `changed` when it must react;
nothing re-reads settings.json behind it. `update()` saves through the core writer (app.core.settings).
"""

from __future__ import annotations

import logging
from dataclasses import fields
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal

from app.core.settings import Settings, keep_rejected_file, save_settings

log = logging.getLogger(__name__)


class SettingsStore(QObject):
    changed = Signal(str)  # the name of a Settings field whose value changed (once per field)
    notice = Signal(str)  # something the user should read about saving (a kept file, a failed write)

    def __init__(
        self,
        settings: Settings,
        *,
        path: Path | None = None,
        persist: bool = True,
        file_rejected: bool = False,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self._current = settings
        self.path = path  # None = the default settings.json
        self.persist = persist  # False: changes live in this window only (tests, `hearth-gui MODEL` for one run)
        self.file_rejected = file_rejected  # the file Hearth could not read is kept as .rejected before a save

    @property
    def current(self) -> Settings:
        return self._current

    def update(self, **values: Any) -> None:
        """Change some fields (validated by Settings), save, then emit `changed` for each field that changed."""
        self.replace(self._current.with_changes(**values))

    def replace(self, settings: Settings) -> None:
        """Take a whole new Settings (the settings dialog's result)."""
        old, self._current = self._current, settings
        self._save()
        for item in fields(Settings):
            if getattr(old, item.name) != getattr(settings, item.name):
                self.changed.emit(item.name)

    def _save(self) -> None:
        if not self.persist:
            return
        try:
            if self.file_rejected:  # the file Hearth could not read is kept, never written over
                kept = keep_rejected_file(self.path)
                self.file_rejected = False
                if kept is not None:
                    self.notice.emit(f"Settings saved. The file Hearth could not read is kept at {kept}.")
            save_settings(self._current, self.path)
        except OSError as exc:
            log.warning("saving settings failed: %s", exc)
            self.notice.emit(f"The settings could not be saved: {exc}")
