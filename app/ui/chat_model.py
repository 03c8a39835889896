"""The messages on screen: a QAbstractListModel over a plain list of ChatItem.

While a reply streams, only its row's text role changes (dataChanged for one row, one role), so views append
the new text instead of re-rendering the conversation.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import IntEnum
from typing import Any

from PySide6.QtCore import QAbstractListModel, QByteArray, QModelIndex, QPersistentModelIndex, Qt


@dataclass
class ChatItem:
    """One message as shown: a stored message (message_id set) or a transient error note (role 'error')."""

    role: str  # user | assistant | error
    content: str
    message_id: int | None = None
    finish_reason: str | None = None
    stats: dict[str, Any] | None = None
    streaming: bool = False
    sibling_index: int = 0
    sibling_count: int = 1
    error: str | None = None
    model: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Roles(IntEnum):
    Text = Qt.ItemDataRole.UserRole + 1
    Role = Qt.ItemDataRole.UserRole + 2
    MessageId = Qt.ItemDataRole.UserRole + 3
    FinishReason = Qt.ItemDataRole.UserRole + 4
    Stats = Qt.ItemDataRole.UserRole + 5
    Streaming = Qt.ItemDataRole.UserRole + 6
    Branch = Qt.ItemDataRole.UserRole + 7
    Error = Qt.ItemDataRole.UserRole + 8
    Item = Qt.ItemDataRole.UserRole + 9


ModelIndex = QModelIndex | QPersistentModelIndex


class ChatModel(QAbstractListModel):
    def __init__(self) -> None:
        super().__init__()
        self._items: list[ChatItem] = []

    # -- Qt model interface ----------------------------------------------------------------
    def rowCount(self, parent: ModelIndex = QModelIndex()) -> int:  # noqa: B008 (Qt's signature)
        return 0 if parent.isValid() else len(self._items)

    def data(self, index: ModelIndex, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or not 0 <= index.row() < len(self._items):
            return None
        item = self._items[index.row()]
        if role in (Qt.ItemDataRole.DisplayRole, Roles.Text):
            return item.content
        if role == Roles.Role:
            return item.role
        if role == Roles.MessageId:
            return item.message_id
        if role == Roles.FinishReason:
            return item.finish_reason
        if role == Roles.Stats:
            return item.stats
        if role == Roles.Streaming:
            return item.streaming
        if role == Roles.Branch:
            return (item.sibling_index, item.sibling_count)
        if role == Roles.Error:
            return item.error
        if role == Roles.Item:
            return item
        return None

    def roleNames(self) -> dict[int, QByteArray]:
        return {int(r): QByteArray(r.name.lower().encode()) for r in Roles}

    # -- edits (GUI thread only) -------------------------------------------------------------
    def items(self) -> list[ChatItem]:
        return list(self._items)

    def item(self, row: int) -> ChatItem:
        return self._items[row]

    def reset(self, items: list[ChatItem]) -> None:
        self.beginResetModel()
        self._items = list(items)
        self.endResetModel()

    def append(self, item: ChatItem) -> int:
        row = len(self._items)
        self.beginInsertRows(QModelIndex(), row, row)
        self._items.append(item)
        self.endInsertRows()
        return row

    def remove(self, row: int) -> None:
        self.beginRemoveRows(QModelIndex(), row, row)
        del self._items[row]
        self.endRemoveRows()

    def row_of(self, message_id: int) -> int | None:
        for row, item in enumerate(self._items):
            if item.message_id == message_id:
                return row
        return None

    def append_text(self, row: int, text: str) -> None:
        """Streaming: one dataChanged for one row and the text role only."""
        item = self._items[row]
        item.content += text
        index = self.index(row)
        self.dataChanged.emit(index, index, [int(Roles.Text)])

    def update(self, row: int, **changes: Any) -> None:
        self._items[row] = replace(self._items[row], **changes)
        index = self.index(row)
        self.dataChanged.emit(index, index, [int(Roles.Item)])
