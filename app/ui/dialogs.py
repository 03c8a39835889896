"""What every dialog of the window shares: it opens at a size that fits the screen it opens on, and content taller
than that scrolls (its buttons stay in view). Escape closes a QDialog (Qt's reject); the library, a dialog too,
closes the same way.
"""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QFrame, QScrollArea, QWidget

from app.ui.window_geometry import TITLE_BAR_ALLOWANCE


def scrolling(content: QWidget) -> QScrollArea:
    """`content` in a frameless scroll area that scrolls only vertically: a short screen scrolls the dialog's
    content instead of squeezing its rows on top of each other."""
    area = QScrollArea()
    area.setObjectName("DialogScroll")
    area.setWidget(content)
    area.setWidgetResizable(True)
    area.setFrameShape(QFrame.Shape.NoFrame)
    area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    return area


def available_size(widget: QWidget) -> QSize:
    """The room a window may take on the screen `widget` (or its parent) is on, less a title bar."""
    anchor = widget.parentWidget() or widget
    screen = anchor.screen() or QGuiApplication.primaryScreen()
    if screen is None:
        return QSize(1366, 768)
    return screen.availableGeometry().marginsRemoved(TITLE_BAR_ALLOWANCE).size()


def fit_to_screen(dialog: QWidget, preferred: QSize) -> None:
    """Open at `preferred`, at least the dialog's minimum, at most the screen's available room."""
    room = available_size(dialog)
    dialog.resize(preferred.expandedTo(dialog.minimumSizeHint()).boundedTo(room))
