"""The conversation on screen: one message widget per row of the ChatModel.

Streaming text is appended at the end of the last message with a QTextCursor (cost per batch independent of
the reply's length); Markdown is rendered once, when the reply is finished.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QModelIndex, QPersistentModelIndex, QSize, Qt, QUrl, Signal
from PySide6.QtGui import QGuiApplication, QTextCursor
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QTextBrowser,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.core.stats_text import WINDOW_SEPARATOR, reply_note, reply_stats_text
from app.ui.chat_model import ChatItem, ChatModel, Roles
from app.ui.theme import Palette

if TYPE_CHECKING:  # markdown-it and pygments load on the first rendered reply, not before the first paint
    from app.ui.markdown import MarkdownRenderer

CONTINUABLE = ("length", "interrupted")


def format_stats(stats: dict[str, Any] | None, finish_reason: str | None) -> str:
    """The line under a reply (app.core.stats_text words it for the window, `hearth chat --stats` and exports)."""
    return reply_stats_text(stats, finish_reason, separator=WINDOW_SEPARATOR)


class MessageBody(QTextBrowser):
    """A read-only rich text view as tall as its document (the outer scroll area scrolls)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("Body")
        self.setOpenLinks(False)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setTextInteractionFlags(
            Qt.TextInteractionFlag.TextSelectableByMouse | Qt.TextInteractionFlag.LinksAccessibleByMouse
        )
        self.document().setDocumentMargin(2)
        layout = self.document().documentLayout()
        layout.documentSizeChanged.connect(self._fit)
        self.setFixedHeight(24)

        self.growth_step = 0  # while streaming: grow in steps of this many pixels (0 = fit exactly)

    def _fit(self, size: Any = None) -> None:
        height = math.ceil(self.document().size().height()) + 2 * self.frameWidth()
        if self.growth_step:
            # Growing a line at a time would re-lay out and repaint the whole chat for every batch; growing a few
            # lines at once leaves most batches repainting only the lines that changed.
            if height <= self.height():
                return
            height = math.ceil(height / self.growth_step) * self.growth_step
        if height != self.height():
            self.setFixedHeight(max(height, 20))

    def sizeHint(self) -> QSize:
        return QSize(400, self.height())


class MessageWidget(QFrame):
    """One message: role, body, stats line and actions. Emits requests; the window acts on them."""

    regenerate_requested = Signal(int)
    continue_requested = Signal(int)
    delete_requested = Signal(int)
    edit_submitted = Signal(int, str)
    branch_requested = Signal(int, int)  # message id, step (-1 / +1)

    def __init__(self, item: ChatItem, view: ChatView, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("Bubble")
        self.view = view
        self.item = item
        self.code_blocks: tuple[str, ...] = ()
        self._shown = 0  # characters of item.content already in the document
        self._rendered_markdown = False

        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 4, 0, 4)
        self.card = QFrame()
        outer.addWidget(self.card)
        layout = QVBoxLayout(self.card)
        layout.setContentsMargins(16, 10, 16, 8)
        layout.setSpacing(4)

        self.role_label = QLabel()
        self.role_label.setObjectName("Role")
        layout.addWidget(self.role_label)
        self.body = MessageBody()
        self.body.anchorClicked.connect(self._anchor_clicked)
        layout.addWidget(self.body)

        self.editor = QPlainTextEdit()
        self.editor.setVisible(False)
        self.editor.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.editor.document().documentLayout().documentSizeChanged.connect(self._fit_editor)
        layout.addWidget(self.editor)
        self.edit_buttons = QWidget()
        edit_row = QHBoxLayout(self.edit_buttons)
        edit_row.setContentsMargins(0, 0, 0, 0)
        edit_row.addStretch(1)
        cancel_edit = QPushButton("Cancel")
        cancel_edit.clicked.connect(self._end_edit)
        self.save_edit = QPushButton("Save && send")
        self.save_edit.setObjectName("Primary")
        self.save_edit.clicked.connect(self._submit_edit)
        edit_row.addWidget(cancel_edit)
        edit_row.addWidget(self.save_edit)
        self.edit_buttons.setVisible(False)
        layout.addWidget(self.edit_buttons)

        self.stats_label = QLabel()
        self.stats_label.setObjectName("Stats")
        self.stats_label.setWordWrap(True)
        layout.addWidget(self.stats_label)

        actions = QHBoxLayout()
        actions.setContentsMargins(0, 0, 0, 0)
        actions.setSpacing(2)
        self.prev_branch = self._tool("‹", "Previous version", lambda: self._branch(-1))
        self.branch_label = QLabel()
        self.branch_label.setObjectName("Muted")
        self.next_branch = self._tool("›", "Next version", lambda: self._branch(+1))
        for widget in (self.prev_branch, self.branch_label, self.next_branch):
            actions.addWidget(widget)
        actions.addStretch(1)
        self.copy_button = self._tool("Copy", "Copy this message", self._copy_message)
        self.edit_button = self._tool("Edit", "Edit and resend (the old version stays reachable)", self._start_edit)
        self.continue_button = self._tool("Continue", "Continue this reply", self._continue)
        self.regenerate_button = self._tool("Regenerate", "Answer again (a new version)", self._regenerate)
        self.delete_button = self._tool("Delete", "Delete this message and what follows it", self._delete)
        for button in (
            self.copy_button,
            self.edit_button,
            self.continue_button,
            self.regenerate_button,
            self.delete_button,
        ):
            actions.addWidget(button)
        self.action_row = QWidget()
        self.action_row.setLayout(actions)
        layout.addWidget(self.action_row)
        self.set_item(item)

    def _tool(self, text: str, tip: str, slot: Any) -> QToolButton:
        button = QToolButton()
        button.setText(text)
        button.setToolTip(tip)
        button.setCursor(Qt.CursorShape.PointingHandCursor)
        button.clicked.connect(slot)
        return button

    # -- content ----------------------------------------------------------------------------
    def set_item(self, item: ChatItem) -> None:
        """Show a whole item (new row, finished reply, branch switch): renders Markdown once."""
        self.item = item
        is_user = item.role == "user"
        is_error = item.role == "error"
        self.card.setObjectName("UserCard" if is_user else "ErrorCard" if is_error else "AssistantCard")
        self.card.style().unpolish(self.card)
        self.card.style().polish(self.card)
        role = "You" if is_user else "Error" if is_error else (item.model or "Assistant")
        attached = item.extra.get("attachments") or []
        self.role_label.setText(role + (f"  ·  attached: {', '.join(attached)}" if attached else ""))
        if is_error:
            self.role_label.setObjectName("ErrorText")
            self.role_label.style().polish(self.role_label)
        line = self.body.fontMetrics().lineSpacing()
        self.body.growth_step = 6 * line if item.streaming else 0
        if item.streaming or is_user or is_error:
            self.body.setPlainText(item.content)
            self.code_blocks = ()
            self._rendered_markdown = False
        else:
            rendered = self.view.renderer.render(item.content)
            self.view.markdown_renders += 1
            self.body.setHtml(rendered.html)
            self.code_blocks = rendered.code_blocks
            self._rendered_markdown = True
        self._shown = len(item.content)
        self._update_footer()

    def append_streamed(self, content: str) -> None:
        """Append only what is new since the last batch."""
        if len(content) < self._shown or self._rendered_markdown:
            self.set_item(ChatItem(**{**self.item.__dict__, "content": content}))
            return
        delta = content[self._shown :]
        if not delta:
            return
        cursor = QTextCursor(self.body.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.insertText(delta)
        self._shown = len(content)
        self.item.content = content

    def _update_footer(self) -> None:
        item = self.item
        stored = item.message_id is not None
        is_assistant = item.role == "assistant"
        error_line = f"\n{item.error}" if item.error and item.role != "error" else ""
        stats_text = format_stats(item.stats, item.finish_reason) if is_assistant and not item.streaming else ""
        if item.streaming:
            stats_text = "generating…"
        self.stats_label.setText(stats_text + error_line)
        note = reply_note(item.stats, "\n") if is_assistant and not item.streaming else ""
        self.stats_label.setToolTip(note)
        self.stats_label.setVisible(bool(stats_text or error_line))
        idle = not item.streaming
        self.action_row.setVisible(stored and idle)
        self.copy_button.setVisible(stored)
        self.edit_button.setVisible(item.role == "user")
        self.regenerate_button.setVisible(is_assistant)
        self.continue_button.setVisible(is_assistant and item.finish_reason in CONTINUABLE)
        self.delete_button.setVisible(stored)
        many = item.sibling_count > 1
        for widget in (self.prev_branch, self.branch_label, self.next_branch):
            widget.setVisible(many)
        self.branch_label.setText(f"{item.sibling_index + 1} / {item.sibling_count}")
        self.prev_branch.setEnabled(item.sibling_index > 0)
        self.next_branch.setEnabled(item.sibling_index + 1 < item.sibling_count)

    # -- actions ----------------------------------------------------------------------------
    def _anchor_clicked(self, url: QUrl) -> None:
        if url.scheme() == "copy":
            index = int(url.path() or 0)
            if 0 <= index < len(self.code_blocks):
                QGuiApplication.clipboard().setText(self.code_blocks[index])

    def _copy_message(self) -> None:
        QGuiApplication.clipboard().setText(self.item.content)

    def _message_id(self) -> int:
        return self.item.message_id if self.item.message_id is not None else -1

    def _regenerate(self) -> None:
        self.regenerate_requested.emit(self._message_id())

    def _continue(self) -> None:
        self.continue_requested.emit(self._message_id())

    def _delete(self) -> None:
        self.delete_requested.emit(self._message_id())

    def _branch(self, step: int) -> None:
        self.branch_requested.emit(self._message_id(), step)

    def _start_edit(self) -> None:
        self.editor.setPlainText(self.item.content)
        for widget in (self.editor, self.edit_buttons):
            widget.setVisible(True)
        for widget in (self.body, self.action_row):
            widget.setVisible(False)
        self._fit_editor()
        self.editor.moveCursor(QTextCursor.MoveOperation.Start)  # the text from its start, the cursor at its start
        self.editor.setFocus()
        self.view.reveal(self.editor)

    def _fit_editor(self, *args: object) -> None:
        """As tall as its text (a plain-text layout counts lines), from 3 lines up to 60% of the chat's height:
        the text shows without an empty box under it, and a long text scrolls inside the editor."""
        lines = max(self.editor.document().documentLayout().documentSize().height(), 1.0)
        spacing = self.editor.fontMetrics().lineSpacing()
        frame = 2 * self.editor.frameWidth() + int(2 * self.editor.document().documentMargin()) + 10
        most = max(int(self.view.viewport().height() * 0.6), 5 * spacing + frame)
        self.editor.setFixedHeight(min(max(math.ceil(lines + 0.5) * spacing + frame, 3 * spacing + frame), most))

    def _end_edit(self) -> None:
        self.view.stop_revealing(self.editor)
        for widget in (self.editor, self.edit_buttons):
            widget.setVisible(False)
        for widget in (self.body, self.action_row):
            widget.setVisible(True)

    def _submit_edit(self) -> None:
        text = self.editor.toPlainText().strip()
        if not text:
            return
        self._end_edit()
        self.edit_submitted.emit(self._message_id(), text)


class ChatView(QScrollArea):
    """Binds MessageWidgets to a ChatModel's rows; keeps the view pinned to the bottom while you are there."""

    regenerate_requested = Signal(int)
    continue_requested = Signal(int)
    delete_requested = Signal(int)
    edit_submitted = Signal(int, str)
    branch_requested = Signal(int, int)

    def __init__(self, model: ChatModel, palette: Palette, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("ChatArea")
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.model = model
        self.palette_ = palette
        self._renderer: MarkdownRenderer | None = None
        self._widgets: list[MessageWidget] = []
        self._stick_to_bottom = True
        self._revealed: QWidget | None = None  # an editor that just opened
        # The work the view has done, counted: a send must cost the same at 2 messages as at 200.
        self.widgets_built = 0
        self.markdown_renders = 0

        container = QWidget()
        self._column = QVBoxLayout(container)
        self._column.setContentsMargins(28, 16, 28, 16)
        self._column.setSpacing(6)
        self._empty = QLabel(
            "<div style='font-size:18pt; font-weight:600'>What can I help with?</div>"
            "<div>Everything runs on this computer: nothing you type leaves it.</div>"
        )
        self._empty.setObjectName("Muted")
        self._empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self._empty.setMinimumHeight(160)  # more would make an empty chat scroll in a 600-px window
        # Layout: [empty-state label, *messages, stretch]; messages start at index 1.
        self._column.addWidget(self._empty)
        self._column.addStretch(1)
        self.setWidget(container)

        bar = self.verticalScrollBar()
        bar.valueChanged.connect(self._scrolled)
        bar.rangeChanged.connect(self._range_changed)
        model.modelReset.connect(self._rebuild)
        model.rowsInserted.connect(self._inserted)
        model.rowsRemoved.connect(self._removed)
        model.dataChanged.connect(self._changed)
        self._rebuild()

    @property
    def renderer(self) -> MarkdownRenderer:
        if self._renderer is None:
            from app.ui.markdown import MarkdownRenderer

            self._renderer = MarkdownRenderer(self.palette_)
        return self._renderer

    def set_palette(self, palette: Palette) -> None:
        self.palette_ = palette
        self._renderer = None
        for widget in self._widgets:
            widget.set_item(widget.item)

    def widgets(self) -> list[MessageWidget]:
        return list(self._widgets)

    def _make(self, item: ChatItem) -> MessageWidget:
        widget = MessageWidget(item, self)
        self.widgets_built += 1
        widget.regenerate_requested.connect(self.regenerate_requested)
        widget.continue_requested.connect(self.continue_requested)
        widget.delete_requested.connect(self.delete_requested)
        widget.edit_submitted.connect(self.edit_submitted)
        widget.branch_requested.connect(self.branch_requested)
        return widget

    def _rebuild(self) -> None:
        for widget in self._widgets:
            self._column.removeWidget(widget)
            widget.deleteLater()
        self._widgets = []
        for row in range(self.model.rowCount()):
            self._insert_widget(row, self.model.item(row))
        self._update_empty()
        self._stick_to_bottom = True
        self._revealed = None

    def _insert_widget(self, row: int, item: ChatItem) -> None:
        widget = self._make(item)
        self._column.insertWidget(1 + row, widget)
        self._widgets.insert(row, widget)

    def _inserted(self, parent: QModelIndex, first: int, last: int) -> None:
        for row in range(first, last + 1):
            self._insert_widget(row, self.model.item(row))
        self._update_empty()
        newest = self.model.item(last)
        if last == self.model.rowCount() - 1 and (newest.role == "user" or newest.streaming):
            # A message the user just sent (or the reply to it) is shown, wherever the view was scrolled to: the
            # view follows the end of the chat again.
            self._stick_to_bottom = True
            self._revealed = None
            self.verticalScrollBar().setValue(self.verticalScrollBar().maximum())

    def _removed(self, parent: QModelIndex, first: int, last: int) -> None:
        for _ in range(first, last + 1):
            widget = self._widgets.pop(first)
            self._column.removeWidget(widget)
            widget.deleteLater()
        self._update_empty()

    def _changed(
        self, top: QModelIndex | QPersistentModelIndex, bottom: QModelIndex | QPersistentModelIndex, roles: list[int]
    ) -> None:
        for row in range(top.row(), bottom.row() + 1):
            item = self.model.item(row)
            if roles == [int(Roles.Text)]:
                self._widgets[row].append_streamed(item.content)
            else:
                self._widgets[row].set_item(item)

    def _update_empty(self) -> None:
        self._empty.setVisible(not self._widgets)

    def reveal(self, widget: QWidget) -> None:
        """Scroll so that `widget` (an editor that just opened) shows from its top; the view stops following the
        end of the chat, which would scroll it away as the message grows."""
        self._stick_to_bottom = False
        self._revealed = widget  # kept in view while the messages above settle their heights (see _range_changed)
        self._column.activate()  # the message's new height, now, not at the next event
        self.ensureWidgetVisible(widget, 0, 24)

    def stop_revealing(self, widget: QWidget) -> None:
        if self._revealed is widget:
            self._revealed = None

    def _scrolled(self, value: int) -> None:
        self._stick_to_bottom = value >= self.verticalScrollBar().maximum() - 8

    def _range_changed(self, minimum: int, maximum: int) -> None:
        if self._revealed is not None:
            try:
                if self._revealed.isVisible():
                    self.ensureWidgetVisible(self._revealed, 0, 24)
                    return
            except RuntimeError:  # its message was deleted meanwhile
                pass
            self._revealed = None
        if self._stick_to_bottom:
            self.verticalScrollBar().setValue(maximum)
