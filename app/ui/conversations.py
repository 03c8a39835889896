"""The conversations sidebar: new, search, rename, delete."""

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
    QVBoxLayout,
    QWidget,
)


class ConversationList(QWidget):
    new_requested = Signal()
    selected = Signal(int)
    rename_requested = Signal(int, str)
    delete_requested = Signal(int)
    search_changed = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("Sidebar")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 14, 12, 12)
        layout.setSpacing(10)
        top = QHBoxLayout()
        brand = QLabel("Hearth")
        brand.setObjectName("Brand")
        top.addWidget(brand)
        top.addStretch(1)
        layout.addLayout(top)
        self.new_button = QPushButton("+  New chat")
        self.new_button.setObjectName("Primary")
        self.new_button.clicked.connect(self.new_requested)
        layout.addWidget(self.new_button)
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
        self._filling = False

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
