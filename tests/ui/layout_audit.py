"""What a person would call broken in a laid-out window, found by walking its widgets: widgets a layout placed on top
of each other or outside their parent (a window forced below its minimum size), labels and buttons whose text is cut,
and a window or dialog that does not fit its screen. The tests and bench/screens.py use it on every screen.
"""

from __future__ import annotations

from PySide6.QtCore import QRect
from PySide6.QtWidgets import (
    QAbstractButton,
    QLabel,
    QLayout,
    QScrollArea,
    QWidget,
)


def _in_layout(layout: QLayout | None, widget: QWidget) -> bool:
    if layout is None:
        return False
    for index in range(layout.count()):
        item = layout.itemAt(index)
        if item is None:
            continue
        if item.widget() is widget:
            return True
        child = item.layout()
        if child is not None and _in_layout(child, widget):
            return True
    return False


def _name(widget: QWidget) -> str:
    text = ""
    if isinstance(widget, QLabel | QAbstractButton):
        text = f" {widget.text()[:40]!r}"
    return f"{type(widget).__name__}{'#' + widget.objectName() if widget.objectName() else ''}{text}"


def _laid_out_children(parent: QWidget) -> list[QWidget]:
    """The visible children that `parent`'s layout places (a composite widget's own parts are not checked)."""
    layout = parent.layout()
    return [
        child
        for child in parent.findChildren(QWidget, options=_direct())
        if child.isVisible() and _in_layout(layout, child)
    ]


def _direct():  # type: ignore[no-untyped-def]
    from PySide6.QtCore import Qt

    return Qt.FindChildOption.FindDirectChildrenOnly


def problems(root: QWidget) -> list[str]:
    """Every overlap, widget outside its parent, and cut text under `root` (shown), in words."""
    found: list[str] = []
    widgets = [root, *root.findChildren(QWidget)]
    for parent in widgets:
        if not parent.isVisible():
            continue
        children = _laid_out_children(parent)
        inside = parent.rect()
        for i, child in enumerate(children):
            geometry = child.geometry()
            if geometry.isEmpty():
                continue
            if not inside.contains(geometry):
                found.append(f"{_name(child)} at {_rect(geometry)} lies outside {_name(parent)} {_rect(inside)}")
            for other in children[i + 1 :]:
                overlap = geometry.intersected(other.geometry())
                if overlap.width() > 1 and overlap.height() > 1:
                    found.append(f"{_name(child)} {_rect(geometry)} overlaps {_name(other)} {_rect(other.geometry())}")
    for widget in widgets:
        if widget.isVisible():
            found.extend(_cut_text(widget))
        # A page may scroll down on a short screen, never sideways: a row wider than its view is cut at the edge.
        if isinstance(widget, QScrollArea) and widget.isVisible() and widget.widget() is not None:
            content, view = widget.widget().width(), widget.viewport().width()
            if content > view + 1:
                found.append(f"{_name(widget)}'s content is {content} px wide in a {view} px view (scrolls sideways)")
    return found


def _cut_text(widget: QWidget) -> list[str]:
    if isinstance(widget, QLabel) and widget.text():
        if widget.wordWrap():
            needed = widget.heightForWidth(widget.width())
            if needed > widget.height() + 2:
                return [f"{_name(widget)} needs {needed} px of height, has {widget.height()}"]
        elif widget.minimumSizeHint().width() > widget.width() + 2:
            return [f"{_name(widget)} needs {widget.minimumSizeHint().width()} px, has {widget.width()}"]
    if isinstance(widget, QAbstractButton) and widget.text():
        # the text itself, not the size hint (a push button's hint is at least 80 px wide, even for "+")
        needed = widget.fontMetrics().horizontalAdvance(widget.text().replace("&&", "&").replace("&", "")) + 8
        if not widget.icon().isNull():
            needed += widget.iconSize().width()
        if needed > widget.width():
            return [f"{_name(widget)} needs {needed} px, has {widget.width()}"]
    return []


def fits(window: QWidget, available: QRect) -> bool:
    """The window, frame included, lies inside the screen's available area."""
    return available.contains(window.frameGeometry())


def _rect(rect: QRect) -> str:
    return f"{rect.width()}x{rect.height()}+{rect.x()}+{rect.y()}"
