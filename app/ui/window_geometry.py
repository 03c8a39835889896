"""Where the main window opens: inside the available area of the screen it opens on, at the size and place the user
left it (window.json in the config folder), moved and shrunk onto the screen when that screen is now smaller or gone
(a laptop unplugged from its monitor).

The window's geometry is no setting: a damaged or hand-edited window.json is ignored (logged) and written again
when the window closes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PySide6.QtCore import QMargins, QPoint, QRect, QSize, Qt
from PySide6.QtGui import QGuiApplication, QScreen
from PySide6.QtWidgets import QWidget

from app.core.storage import paths
from app.core.storage.schema import read_json_file, write_json_file

log = logging.getLogger(__name__)

GEOMETRY_FILE = "window.json"
DEFAULT_SIZE = QSize(1280, 800)
# Before the window is shown its frame is unknown: leave room for a title bar and thin borders so the frame fits
# too. Once shown, the real frame is measured and the window fitted again (MainWindow.showEvent).
TITLE_BAR_ALLOWANCE = QMargins(4, 32, 4, 4)


@dataclass(frozen=True)
class SavedGeometry:
    """The client area (no frame) of the window when it last closed, in the desktop's coordinates."""

    rect: QRect
    maximized: bool = False

    def to_json(self) -> dict[str, Any]:
        r = self.rect
        return {"x": r.x(), "y": r.y(), "width": r.width(), "height": r.height(), "maximized": self.maximized}

    @staticmethod
    def of(window: QWidget) -> SavedGeometry:
        """A window as it is now (a maximized one: its normal size, and that it was maximized)."""
        maximized = window.isMaximized()
        return SavedGeometry(window.normalGeometry() if maximized else window.geometry(), maximized)

    @staticmethod
    def from_json(data: Any) -> SavedGeometry | None:
        if not isinstance(data, dict):
            return None
        numbers = [data.get(key) for key in ("x", "y", "width", "height")]
        if not all(isinstance(n, int) and not isinstance(n, bool) and abs(n) < 100_000 for n in numbers):
            return None
        x, y, width, height = (int(n) for n in numbers)  # type: ignore[arg-type]
        if width <= 0 or height <= 0:
            return None
        return SavedGeometry(QRect(x, y, width, height), data.get("maximized") is True)


def geometry_path() -> Path:
    return paths.config_dir() / GEOMETRY_FILE


def read_saved_geometry(path: Path | None = None) -> SavedGeometry | None:
    """The last geometry, or None (first launch, or a file that cannot be used: logged, then written over)."""
    path = path or geometry_path()
    if not path.exists():
        return None
    data, problem = read_json_file(path)
    saved = SavedGeometry.from_json(data) if not problem else None
    if saved is None:
        log.warning("ignoring %s: %s", path, problem or "it does not hold a window's position and size")
    return saved


def save_geometry(saved: SavedGeometry, path: Path | None = None) -> None:
    try:
        write_json_file(path or geometry_path(), saved.to_json())
    except OSError as exc:  # a read-only config folder: the next launch opens at the default size
        log.warning("could not save the window's geometry: %s", exc)


def fit_rect(wanted: QRect, available: QRect, minimum: QSize, frame: QMargins = TITLE_BAR_ALLOWANCE) -> QRect:
    """`wanted` (a client area) moved and shrunk so that it and its `frame` lie inside `available`; never smaller
    than `minimum` unless the screen itself is."""
    room = available.marginsRemoved(frame)
    width = min(max(wanted.width(), minimum.width()), room.width())
    height = min(max(wanted.height(), minimum.height()), room.height())
    x = min(max(wanted.x(), room.left()), room.left() + room.width() - width)
    y = min(max(wanted.y(), room.top()), room.top() + room.height() - height)
    return QRect(x, y, width, height)


def default_rect(available: QRect, minimum: QSize, frame: QMargins = TITLE_BAR_ALLOWANCE) -> QRect:
    """First launch: DEFAULT_SIZE, or the screen less a margin where that is smaller, centred."""
    room = available.marginsRemoved(frame)
    size = DEFAULT_SIZE.boundedTo(QSize(room.width() * 94 // 100, room.height())).expandedTo(minimum)
    centred = QRect(QPoint(0, 0), size)
    centred.moveCenter(room.center())
    return fit_rect(centred, available, minimum, frame)


def screen_for(saved: SavedGeometry | None) -> QScreen | None:
    """The screen the window was on, if it is still there; else the primary screen."""
    if saved is not None:
        screen = QGuiApplication.screenAt(saved.rect.center())
        if screen is not None:
            return screen
    return QGuiApplication.primaryScreen()


def placement(saved: SavedGeometry | None, available: QRect, minimum: QSize) -> QRect:
    """Where the window's client area goes on a screen whose available area is `available`."""
    if saved is None:
        return default_rect(available, minimum)
    return fit_rect(saved.rect, available, minimum)


def place_on_screen(
    window: QWidget,
    saved: SavedGeometry | None,
    available: QRect | None = None,
    before: Callable[[int], None] | None = None,
) -> None:
    """Before the first show: `saved` (or the default) fitted to the screen it belongs on. `before(width)` lays the
    window out for that width first (its panels collapse on a narrow one, which lowers its minimum size).
    `available`: a screen's available area to use instead of the real screen's (tests)."""
    if available is None:
        screen = screen_for(saved)
        available = screen.availableGeometry() if screen is not None else QRect(0, 0, 1366, 768)
    if before is not None:
        before(placement(saved, available, QSize(0, 0)).width())
    window.setGeometry(placement(saved, available, window.minimumSizeHint()))
    if saved is not None and saved.maximized:
        window.setWindowState(Qt.WindowState.WindowMaximized)


def fit_frame_on_screen(window: QWidget) -> None:
    """Once shown, the frame (title bar, borders) is known: move and shrink so that it too is on the screen."""
    screen = window.screen()
    if screen is None or window.isMaximized() or window.isFullScreen():
        return
    frame, client = window.frameGeometry(), window.geometry()
    margins = QMargins(
        client.left() - frame.left(),
        client.top() - frame.top(),
        frame.right() - client.right(),
        frame.bottom() - client.bottom(),
    )
    fitted = fit_rect(client, screen.availableGeometry(), window.minimumSizeHint(), margins)
    if fitted != client:
        window.setGeometry(fitted)
