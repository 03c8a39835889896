"""A one-line label that shrinks to fit: long text is elided ("…") and the whole text is in the tooltip.

A plain QLabel's minimum width is its whole text, so one long status ("Converting <file> once…") widened the window
past a laptop screen and kept it from shrinking back.
"""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QFontMetrics, QResizeEvent
from PySide6.QtWidgets import QLabel, QSizePolicy, QWidget


class ElidedLabel(QLabel):
    def __init__(
        self,
        text: str = "",
        parent: QWidget | None = None,
        *,
        mode: Qt.TextElideMode = Qt.TextElideMode.ElideRight,
        widest: int = 420,
        prefix: str = "",
    ) -> None:
        super().__init__(parent)
        self._prefix = prefix  # always shown whole, before the elided text ("→ ")
        self._full = ""
        self._notes = ""
        self._mode = mode  # ElideMiddle keeps both ends of a path
        self._widest = widest  # the size hint's width at most
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.setMinimumWidth(80)
        self.set_full_text(text)

    def full_text(self) -> str:
        return self._full

    def set_full_text(self, text: str, notes: str = "", tooltip: str | None = None) -> None:
        """`notes` follow the text in the tooltip; `tooltip` replaces both there."""
        self._full = text
        self._notes = notes
        self.setToolTip(tooltip if tooltip is not None else "\n".join(part for part in (text, notes) if part))
        self._elide()
        self.updateGeometry()

    def sizeHint(self) -> QSize:
        hint = super().sizeHint()
        hint.setWidth(min(QFontMetrics(self.font()).horizontalAdvance(self._prefix + self._full) + 4, self._widest))
        return hint

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        metrics = QFontMetrics(self.font())
        room = max(self.width() - metrics.horizontalAdvance(self._prefix), 0)
        super().setText(self._prefix + metrics.elidedText(self._full, self._mode, room))
