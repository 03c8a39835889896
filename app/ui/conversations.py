"""The conversations sidebar: new, search, rename, delete; on a narrow window a strip of icons (new chat, show the
list)."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QPoint, Qt, Signal
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

ICON_STRIP_WIDTH = 52
FULL_MIN_WIDTH = 180


class ConversationList(QWidget):
    new_requested = Signal()
    selected = Signal(int)
    rename_requested = Signal(int, str)
    delete_requested = Signal(int)
    search_changed = Signal(str)
    expand_requested = Signal()  # the icon strip's "show the conversations"
    collapse_requested = Signal()  # the list's "collapse to icons"

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("Sidebar")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 14, 12, 12)
        layout.setSpacing(10)
        top = QHBoxLayout()
        self.brand = QLabel("Hearth")
        self.brand.setObjectName("Brand")
        top.addWidget(self.brand)
        top.addStretch(1)
        self.collapse_button = self._icon("«", "Collapse the conversations to icons (Ctrl+B)", self.collapse_requested)
        top.addWidget(self.collapse_button)
        layout.addLayout(top)
        self.new_button = QPushButton("+  New chat")
        self.new_button.setObjectName("Primary")
        self.new_button.setToolTip("New chat (Ctrl+N)")
        self.new_button.clicked.connect(self.new_requested)
        layout.addWidget(self.new_button)
        # The icon strip (a narrow window): new chat, and the list back.
        self.expand_button = self._icon("☰", "Show the conversations (Ctrl+B)", self.expand_requested)
        layout.addWidget(self.expand_button, 0, Qt.AlignmentFlag.AlignHCenter)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search conversations")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(self.search_changed)
        layout.addWidget(self.search)
        self.list = QListWidget()
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._menu)
        self.list.itemClicked.connect(self._clicked)
        self.list.setEditTriggers(QListWidget.EditTrigger.NoEditTriggers)
        self.list.itemChanged.connect(self._renamed)
        layout.addWidget(self.list, 1)
        self.strip_stretch = QWidget()  # keeps the icons at the top of the strip
        layout.addWidget(self.strip_stretch, 1)
        self._layout = layout
        self._filling = False
        self.compact = True  # set_compact(False) lays out the full list
        self.set_compact(False)

    @staticmethod
    def _icon(text: str, tip: str, signal: Any) -> QToolButton:
        button = QToolButton()
        button.setText(text)
        button.setToolTip(tip)
        button.setCursor(Qt.CursorShape.PointingHandCursor)
        button.clicked.connect(signal)
        return button

    def set_compact(self, compact: bool) -> None:
        """A strip of icons (new chat, show the list) instead of the full list."""
        if compact == self.compact:
            return
        self.compact = compact
        for widget in (self.brand, self.collapse_button, self.search, self.list):
            widget.setVisible(not compact)
        self.expand_button.setVisible(compact)
        self.strip_stretch.setVisible(compact)
        self.new_button.setText("+" if compact else "+  New chat")
        margin = 6 if compact else 12
        self._layout.setContentsMargins(margin, 14, margin, 12)
        if compact:
            self.setFixedWidth(ICON_STRIP_WIDTH)
        else:
            self.setMinimumWidth(FULL_MIN_WIDTH)
            self.setMaximumWidth(16_777_215)  # QWIDGETSIZE_MAX: the splitter sets its width

    def set_conversations(self, conversations: list[Any], current_id: int | None) -> None:
        self._filling = True
        self.list.clear()
        for conversation in conversations:
            item = QListWidgetItem(conversation.title)
            item.setData(Qt.ItemDataRole.UserRole, conversation.id)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsEditable)
            item.setToolTip(conversation.title)
            self.list.addItem(item)
            if conversation.id == current_id:
                item.setSelected(True)
                self.list.setCurrentItem(item)
        self._filling = False

    def _item_for(self, conversation_id: int) -> QListWidgetItem | None:
        for row in range(self.list.count()):
            item = self.list.item(row)
            if item.data(Qt.ItemDataRole.UserRole) == conversation_id:
                return item
        return None

    def start_rename(self, conversation_id: int) -> None:
        item = self._item_for(conversation_id)
        if item is not None:
            self.list.editItem(item)

    def _clicked(self, item: QListWidgetItem) -> None:
        self.selected.emit(int(item.data(Qt.ItemDataRole.UserRole)))

    def _renamed(self, item: QListWidgetItem) -> None:
        if not self._filling and item.text().strip():
            self.rename_requested.emit(int(item.data(Qt.ItemDataRole.UserRole)), item.text().strip())

    def _menu(self, pos: QPoint) -> None:
        item = self.list.itemAt(pos)
        if item is None:
            return
        conversation_id = int(item.data(Qt.ItemDataRole.UserRole))
        menu = QMenu(self)
        rename = menu.addAction("Rename")
        delete = menu.addAction("Delete")
        chosen = menu.exec(self.list.mapToGlobal(pos))
        if chosen is rename:
            self.start_rename(conversation_id)
        elif chosen is delete:
            self.delete_requested.emit(conversation_id)
