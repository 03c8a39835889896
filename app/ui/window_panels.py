"""The main window's panels and how they give way on a narrow window, so the chat keeps its room down to 960x600.

Left, the conversations sidebar: the full list, or a strip of icons (new chat, show the list). Right, the side
panel: tabs for Memory and, when View ▸ Server is on, the Server; collapsed, it is one line in the model bar (the
memory summary), and clicking that line opens it again. View ▸ Conversations (Ctrl+B) and View ▸ Memory panel
(Ctrl+Shift+B) switch each by hand; crossing a width threshold switches them automatically, and back only if it
was the automatic switch that collapsed them.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QObject, Qt, Signal, Slot
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QFrame, QMenu, QScrollArea, QSizePolicy, QSplitter, QTabWidget, QToolButton, QWidget

from app.ui.conversations import FULL_MIN_WIDTH, ICON_STRIP_WIDTH, ConversationList
from app.ui.memory_panel import MemoryPanel
from app.ui.server_panel import ServerPanel

SIDEBAR_WIDTH = 240
SIDE_PANEL_WIDTH = 320
SIDE_PANEL_MIN_WIDTH = 260
# Window widths below which a panel collapses by itself: the full sidebar needs ~1000 px for the chat to keep
# ~600, the side panel as well ~1180.
FULL_SIDEBAR_FROM = 1000
SIDE_PANEL_FROM = 1180


@dataclass(frozen=True)
class PanelModes:
    """What the window's width alone calls for."""

    full_sidebar: bool
    side_panel: bool


def _min_width(widget: QWidget) -> int:
    """What a layout gives the widget at least: its minimum size if set, else its minimum size hint."""
    return max(widget.minimumWidth(), widget.minimumSizeHint().width())


def modes_for_width(width: int) -> PanelModes:
    return PanelModes(full_sidebar=width >= FULL_SIDEBAR_FROM, side_panel=width >= SIDE_PANEL_FROM)


class MemorySummary(QToolButton):
    """The collapsed side panel: one line ("Memory 412 MiB · context 1,234 / 8,192 ▸"); a click opens the panel."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("MemorySummary")
        self.setCursor(Qt.CursorShape.PointingHandCursor)
        self.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextOnly)
        self.setSizePolicy(QSizePolicy.Policy.Maximum, QSizePolicy.Policy.Fixed)

    def show_summary(self, text: str) -> None:
        self.setText(f"{text}  ▸")
        self.setToolTip(f"{text}\nClick to show the memory panel (View ▸ Memory panel, Ctrl+Shift+B).")


class WindowPanels(QObject):
    """Builds the splitter (sidebar | centre | side panel) and keeps the panels' modes; owns the View menu's
    Conversations, Memory panel and Server items."""

    modes_changed = Signal()

    def __init__(
        self,
        sidebar: ConversationList,
        centre: QWidget,
        memory_panel: MemoryPanel,
        server_panel: ServerPanel,
        summary: MemorySummary,
        view_menu: QMenu,
        parent: QWidget,
    ) -> None:
        super().__init__(parent)
        self.sidebar = sidebar
        self.centre = centre
        self.memory_panel = memory_panel
        self.server_panel = server_panel
        self.summary = summary
        # The plan before loading says what serving would take at the Server tab's "Replies at once"
        memory_panel.set_served_replies(server_panel.parallel.value())
        server_panel.parallel.valueChanged.connect(memory_panel.set_served_replies)

        self.side_tabs = QTabWidget()
        self.side_tabs.setObjectName("SidePanel")
        self.side_tabs.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        self.side_tabs.setDocumentMode(True)
        self.side_tabs.setTabBarAutoHide(True)  # one tab (Memory): no tab bar
        self.side_tabs.setMinimumWidth(SIDE_PANEL_MIN_WIDTH)
        self.memory_page = QScrollArea()  # a short window scrolls the panel instead of growing taller
        self.memory_page.setWidget(memory_panel)
        self.memory_page.setWidgetResizable(True)
        self.memory_page.setFrameShape(QFrame.Shape.NoFrame)
        self.memory_page.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.side_tabs.addTab(self.memory_page, "Memory")
        self._keep_server_panel()

        self.splitter = QSplitter()
        self.splitter.setHandleWidth(1)
        self.splitter.addWidget(sidebar)
        self.splitter.addWidget(centre)
        self.splitter.addWidget(self.side_tabs)
        self.splitter.setStretchFactor(1, 1)
        for index in (0, 1, 2):
            self.splitter.setCollapsible(index, False)
        self.splitter.setSizes([SIDEBAR_WIDTH, 800, SIDE_PANEL_WIDTH])

        self.sidebar_action = QAction("&Conversations", parent)
        self.sidebar_action.setCheckable(True)
        self.sidebar_action.setChecked(True)
        self.sidebar_action.setShortcut(QKeySequence("Ctrl+B"))
        self.sidebar_action.setToolTip("The full list of conversations, or a strip of icons")
        self.memory_action = QAction("&Memory panel", parent)
        self.memory_action.setCheckable(True)
        self.memory_action.setChecked(True)
        self.memory_action.setShortcut(QKeySequence("Ctrl+Shift+B"))
        self.memory_action.setToolTip("The memory panel, or its one-line summary in the model bar")
        self.server_action = QAction("&Server", parent)
        self.server_action.setCheckable(True)
        self.server_action.setToolTip("Serve the loaded model to other programs (a tab beside Memory)")
        for action in (self.sidebar_action, self.memory_action, self.server_action):
            view_menu.addAction(action)
        self.sidebar_action.toggled.connect(self._sidebar_toggled)
        self.memory_action.toggled.connect(self._memory_toggled)
        self.server_action.toggled.connect(self._server_toggled)
        sidebar.expand_requested.connect(lambda: self.sidebar_action.setChecked(True))
        sidebar.collapse_requested.connect(lambda: self.sidebar_action.setChecked(False))
        summary.clicked.connect(lambda: self.memory_action.setChecked(True))
        self.collapse_button = QToolButton()
        self.collapse_button.setText("⇥")
        self.collapse_button.setToolTip("Collapse the panel to one line in the model bar (Ctrl+Shift+B)")
        self.collapse_button.clicked.connect(lambda: self.memory_action.setChecked(False))
        memory_panel.header_row.addWidget(self.collapse_button)

        self._width_modes: PanelModes | None = None  # what the width called for at the last fit
        self._auto_collapsed = {"sidebar": False, "side": False}  # collapsed by the width, not by hand
        self._sidebar_width = SIDEBAR_WIDTH
        self._side_width = SIDE_PANEL_WIDTH
        self._apply()

    def _keep_server_panel(self) -> None:
        """Off its tab, the server panel stays a hidden child (it lives, and dies, with the window)."""
        self.server_panel.setParent(self.side_tabs)
        self.server_panel.hide()

    # -- the width decides, once per threshold crossed ---------------------------------------------------------
    def fit_width(self, width: int) -> None:
        """The window is `width` wide: collapse what no longer fits, expand what the width had collapsed."""
        modes = modes_for_width(width)
        previous, self._width_modes = self._width_modes, modes
        if previous is None or modes.full_sidebar != previous.full_sidebar:
            self._follow_width("sidebar", self.sidebar_action, modes.full_sidebar)
        if previous is None or modes.side_panel != previous.side_panel:
            self._follow_width("side", self.memory_action, modes.side_panel)

    def _follow_width(self, panel: str, action: QAction, fits: bool) -> None:
        if not fits and action.isChecked():
            action.setChecked(False)
            self._auto_collapsed[panel] = True
        elif fits and self._auto_collapsed[panel]:
            action.setChecked(True)  # what the width collapsed comes back; what the user collapsed stays
            self._auto_collapsed[panel] = False

    # -- the user decides ----------------------------------------------------------------------------------------
    @Slot(bool)
    def _sidebar_toggled(self, on: bool) -> None:
        self._auto_collapsed["sidebar"] = False
        if on and self._overflows(sidebar=True, side=self.memory_action.isChecked()):
            self._collapse_by_width("side", self.memory_action)  # the one just opened wins the room
        self._apply()

    @Slot(bool)
    def _memory_toggled(self, on: bool) -> None:
        self._auto_collapsed["side"] = False
        if not on and self.server_action.isChecked():
            self.server_action.setChecked(False)  # the server tab lives in the panel
        if on and self._overflows(sidebar=self.sidebar_action.isChecked(), side=True):
            self._collapse_by_width("sidebar", self.sidebar_action)
        self._apply()

    def _collapse_by_width(self, panel: str, action: QAction) -> None:
        if action.isChecked():
            action.setChecked(False)
            self._auto_collapsed[panel] = True

    def _overflows(self, *, sidebar: bool, side: bool) -> bool:
        """Whether the window, as wide as it is, cannot hold both panels open beside the chat's minimum."""
        window = self.splitter.window()
        if self._width_modes is None:
            return False  # not laid out yet: the first fit decides
        needed = (self._sidebar_min() if sidebar else ICON_STRIP_WIDTH) + _min_width(self.centre)
        needed += _min_width(self.side_tabs) if side else 0
        return needed > window.width()

    def collapsed_minimum_width(self) -> int:
        """The narrowest the window can be: icons, the chat, no side panel. A window made narrower than what its
        open panels need (a half-screen tiling) collapses them (fit_width) rather than refusing the width."""
        return ICON_STRIP_WIDTH + _min_width(self.centre) + 2 * self.splitter.handleWidth()

    def _sidebar_min(self) -> int:
        return max(_min_width(self.sidebar), FULL_MIN_WIDTH)

    @Slot(bool)
    def _server_toggled(self, on: bool) -> None:
        index = self.side_tabs.indexOf(self.server_panel)
        if on and index < 0:
            self.side_tabs.addTab(self.server_panel, "Server")
        elif not on and index >= 0:
            self.side_tabs.removeTab(index)
            self._keep_server_panel()
        if on:
            self.side_tabs.setCurrentWidget(self.server_panel)
            self.memory_action.setChecked(True)
        self._apply()

    def _apply(self) -> None:
        sizes = self.splitter.sizes()
        full = self.sidebar_action.isChecked()
        side = self.memory_action.isChecked()
        if self.splitter.isVisible():  # laid out: remember the widths the user had, to restore them
            if not self.sidebar.compact and not full and sizes[0] > 0:
                self._sidebar_width = sizes[0]
            if not self.side_tabs.isHidden() and not side and sizes[2] > 0:
                self._side_width = sizes[2]
        self.sidebar.set_compact(not full)
        self.side_tabs.setVisible(side)
        self.summary.setVisible(not side)
        left = self._sidebar_width if full else self.sidebar.minimumWidth()
        right = self._side_width if side else 0
        total = sum(sizes)
        self.splitter.setSizes([left, max(total - left - right, 1), right])
        self.modes_changed.emit()
