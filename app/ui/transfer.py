"""File ▸ Import conversation and Export as Markdown / JSON: the history store does the work, this asks for the file."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from PySide6.QtWidgets import QFileDialog, QWidget

from app.core.errors import HearthError
from app.ui.chat_controller import ChatController

NOTHING_TO_EXPORT = "There is no conversation to export: open or start one first."


class ConversationTransfer:
    def __init__(self, chat: ChatController, parent: QWidget, show_error: Callable[[str], None]) -> None:
        self.chat = chat
        self.parent = parent
        self.show_error = show_error

    def export_conversation(self, path: Path, fmt: str) -> None:
        conversation_id = self.chat.conversation_id
        if conversation_id is None:
            raise HearthError(NOTHING_TO_EXPORT)
        if fmt == "json":
            data = json.dumps(self.chat.store.export_json(conversation_id), indent=2, ensure_ascii=False)
        else:
            data = self.chat.store.export_markdown(conversation_id)
        path.write_text(data, encoding="utf-8")

    def import_conversation(self, path: Path) -> None:
        conversation = self.chat.store.import_json_file(path)
        self.chat.open_conversation(conversation.id)

    def export_dialog(self, fmt: str) -> None:
        conversation_id = self.chat.conversation_id
        if conversation_id is None:
            self.show_error(NOTHING_TO_EXPORT)
            return
        title = self.chat.store.get_conversation(conversation_id).title
        suggested = "".join(c if c.isalnum() or c in " -_" else "_" for c in title).strip() or "conversation"
        kind = "Markdown (*.md)" if fmt == "md" else "JSON (*.json)"
        name, _ = QFileDialog.getSaveFileName(self.parent, "Export conversation", f"{suggested}.{fmt}", kind)
        if name:
            try:
                self.export_conversation(Path(name), fmt)
            except (HearthError, OSError) as exc:
                self.show_error(f"Export failed: {exc}")

    def import_dialog(self) -> None:
        name, _ = QFileDialog.getOpenFileName(self.parent, "Import conversation", "", "Hearth conversation (*.json)")
        if name:
            try:
                self.import_conversation(Path(name))
            except HearthError as exc:
                self.show_error(str(exc))
