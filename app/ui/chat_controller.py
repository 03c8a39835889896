"""The chat flow, apart from the window that shows it: input box -> controller -> worker -> backend -> events -> view.

The controller owns the HistoryStore writes and the ChatModel the chat view shows. It sends the worker requests
(through a WorkerHost: the worker may drive a local engine or, later, a remote one; nothing here assumes which)
and turns the worker's events into store writes and row updates. Streamed text is buffered and flushed to the
chat model every 40 ms, and saved to the store about once a second, so a killed app loses at most the last
second of a reply.

Rows change only where something changed: sending appends the new rows, streaming updates one row's text, and
only opening another conversation rebuilds the list, so the cost of a send does not grow with the conversation.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import QObject, Qt, QTimer, Signal, Slot

from app.core.chat.events import ChatMessage, ReplyStats
from app.core.engines.backend import ContextUsage, ModelInfo, ReplyRequest
from app.core.errors import HearthError
from app.core.storage.history import HistoryStore, Message
from app.ui.chat_model import ChatItem, ChatModel
from app.ui.chat_rows import branch_items, content_for_model, context_estimate, known_siblings, sync_rows
from app.ui.settings_store import SettingsStore
from app.ui.worker import GenerateRequest, WorkerHost

log = logging.getLogger(__name__)

FLUSH_EVERY_MS = 40  # streamed text reaches the view in batches (30–50 ms)
SAVE_EVERY_S = 1.0  # a streaming reply is written to the database this often
TITLE_LENGTH = 48
NO_MODEL = "No model is loaded: load one from the model bar first."
BUSY = "A reply is being generated: stop it first (Esc)."


@dataclass
class ActiveReply:
    request: GenerateRequest
    conversation_id: int
    message_id: int
    created: bool  # a new message (deleted again if nothing was generated); False when continuing one
    prefix: str
    text: str
    buffer: list[str] = field(default_factory=list)
    tokens: int = 0
    last_saved: float = field(default_factory=time.monotonic)
    earlier_turns: int = 0  # messages in the prompt before the newest one (system prompt aside)
    stats: ReplyStats | None = None
    usage: ContextUsage | None = None
    final_usage: ContextUsage | None = None


class ChatController(QObject):
    """Send, reply, regenerate, continue, edit, delete and branch; conversations; the stream buffer."""

    reply_finished = Signal(str)  # finish reason ("error" when nothing was generated)
    generating_changed = Signal(bool)  # a reply is streaming: the input box offers Stop
    notice = Signal(str)  # for the banner
    conversations_changed = Signal()  # titles or order changed: the sidebar lists them again
    # The context gauge: ContextUsage | None, the turns before the newest message (none: the engine's "history" is
    # only the chat template's tokens), and whether the window estimated it (a reopened conversation)
    context_changed = Signal(object, int, bool)
    remaining_context = Signal(int)  # tokens left after the last reply (the attachment bar's fit check)
    text_returned = Signal(str)  # a message that was not sent: back into the input box

    def __init__(
        self, store: HistoryStore, settings: SettingsStore, host: WorkerHost, parent: QObject | None = None
    ) -> None:
        super().__init__(parent)
        self.store = store
        self.settings = settings
        self.host = host
        self.chat_model = ChatModel()
        self.conversation_id: int | None = None
        self.model_info: ModelInfo | None = None
        self.loading = False
        self.reply: ActiveReply | None = None
        self.pending_parent: Message | None = None  # a message sent while the model was loading
        self.attachments: Any = None  # app.ui.attachments.AttachmentBar, once the window installed it
        self.token_counter: Callable[[str], int] | None = None  # the loaded model's tokenizer (the window sets it)

        self.flush_timer = QTimer(self)
        self.flush_timer.setInterval(FLUSH_EVERY_MS)
        self.flush_timer.timeout.connect(self.flush)
        worker = host.worker
        for signal, slot in (
            (worker.token, self._on_token),
            (worker.stats, self._on_stats),
            (worker.context, self._on_context),
            (worker.finished, self._on_finished),
            (worker.failed, self._on_failed),
        ):
            signal.connect(slot, Qt.ConnectionType.QueuedConnection)

    # -- the model's state (the window drives loading; the controller only needs to know) ----------------
    def model_loading(self) -> None:
        self.stop()
        self.loading = True
        self.model_info = None

    def model_loaded(self, info: ModelInfo) -> None:
        self.loading = False
        self.model_info = info
        if self.pending_parent is not None:
            parent, self.pending_parent = self.pending_parent, None
            if parent.conversation_id == self.conversation_id:
                self._start_reply(parent)
                return
        self.estimate_context()

    def model_load_failed(self, message: str) -> None:
        self.loading = False
        self.model_info = None
        if self.pending_parent is not None:
            self.pending_parent = None
            self._chat_error(f"The model could not be loaded, so there is no reply: {message}")

    def model_unloaded(self) -> None:
        self.loading = False
        self.model_info = None

    # -- conversations -------------------------------------------------------------------------------------
    def new_conversation(self) -> None:
        """Also while a reply streams: it keeps streaming into its own conversation."""
        self.conversation_id = None
        self.chat_model.reset([])
        self.context_changed.emit(None, 0, False)
        self.conversations_changed.emit()

    def open_conversation(self, conversation_id: int) -> None:
        """The one place the rows are rebuilt: a different conversation."""
        self.conversation_id = conversation_id
        self.chat_model.reset(self._branch_items())
        self.conversations_changed.emit()
        self.estimate_context()

    def estimate_context(self) -> None:
        """The gauge for the open conversation before its next reply (a relaunch, another conversation opened),
        counted with the loaded model's tokenizer; the engine's exact figures replace it at the next reply."""
        if self.reply is not None and self.reply.conversation_id == self.conversation_id:
            return  # the streaming reply keeps the gauge up to date
        info, count = self.model_info, self.token_counter
        found = None
        if self.conversation_id is not None and info is not None and count is not None:
            branch = self.store.active_branch(self.conversation_id)
            found = context_estimate(branch, self.settings.current.system_prompt, count, info.context_window)
        if found is None:
            self.context_changed.emit(None, 0, False)
        else:
            self.context_changed.emit(found[0], found[1], True)

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        try:
            self.store.rename_conversation(conversation_id, title)
        except HearthError as exc:
            self.notice.emit(str(exc))
        self.conversations_changed.emit()

    def can_delete_conversation(self, conversation_id: int) -> bool:
        """Not the one a reply is streaming into (says why)."""
        if self.reply is not None and self.reply.conversation_id == conversation_id:
            return not self.busy()
        return True

    def delete_conversation(self, conversation_id: int) -> None:
        self.store.delete_conversation(conversation_id)
        self.host.forget(conversation_id)
        if conversation_id == self.conversation_id:
            self.conversation_id = None
            self.chat_model.reset([])
        self.conversations_changed.emit()

    def replace_store(self, store: HistoryStore) -> None:
        """A new history file took over (the old one could not be used); this window's conversations moved there."""
        self.store.close()
        self.store = store
        self.conversations_changed.emit()

    def busy(self) -> bool:
        if self.reply is not None:
            self.notice.emit(BUSY)
            return True
        return False

    # -- sending ---------------------------------------------------------------------------------------------
    def send(self, text: str) -> None:
        text = text.strip()
        if not text or self.busy():
            return
        if self.model_info is None and not self.loading:
            self.text_returned.emit(text)
            self._chat_error(NO_MODEL)
            return
        documents: list[Any] = []
        if self.attachments is not None:
            chosen = self.attachments.documents_for_send(text)
            if chosen is None:  # files still being read, or the user cancelled the fit choice
                self.text_returned.emit(text)
                return
            documents = list(chosen)
        if self.conversation_id is None:
            title = " ".join(text.split())[:TITLE_LENGTH] or "New chat"
            conversation = self.store.create_conversation(title, settings=self.settings.current.to_dict())
            self.conversation_id = conversation.id
        branch = self.store.active_branch(self.conversation_id)
        parent_id = branch[-1].id if branch else None
        attachments = self._new_attachments(documents, branch, self._attachment_token_counts())
        message = self.store.add_message(self.conversation_id, "user", text, parent_id, attachments=attachments)
        if self.attachments is not None:
            self.attachments.clear()
        self._after_new_user_message(message, branch=[*branch, message])

    def _attachment_token_counts(self) -> dict[str, int]:
        if self.attachments is None:
            return {}
        pairs = zip(self.attachments.documents(), self.attachments.token_counts(), strict=False)
        return {document.sha256: count for document, count in pairs if count is not None}

    @staticmethod
    def _new_attachments(documents: list[Any], branch: list[Message], counts: dict[str, int]) -> list[Any]:
        """History attachments for the documents, minus those already sent earlier in this branch."""
        if not documents:
            return []
        from app.core.documents.layout import not_yet_in_conversation

        earlier = {a.sha256 for m in branch for a in m.attachments}
        return [
            d.as_history_attachment(max(counts.get(d.sha256, 0) - d.dropped_tokens, 0))
            for d in not_yet_in_conversation(documents, earlier)
        ]

    def _after_new_user_message(self, message: Message, branch: list[Message] | None = None) -> None:
        """`branch`: the active branch ending in `message`, when the caller has it (one read of the store less)."""
        self._sync_rows(branch)
        self.conversations_changed.emit()
        if self.model_info is None:
            self.pending_parent = message  # sent when the model has loaded
            return
        self._start_reply(message, branch=branch)

    def _prompt_messages(self, up_to: Message, branch: list[Message]) -> tuple[ChatMessage, ...]:
        """System prompt + the active branch down to `up_to` (inclusive), as the engine's messages."""
        messages: list[ChatMessage] = []
        system_prompt = self.settings.current.system_prompt
        if system_prompt.strip():
            messages.append(ChatMessage("system", system_prompt))
        for message in branch:
            if message.role in ("user", "assistant"):
                messages.append(ChatMessage(message.role, content_for_model(message)))  # type: ignore[arg-type]
            if message.id == up_to.id:
                break
        return tuple(messages)

    def _start_reply(
        self,
        parent: Message,
        *,
        continue_message: Message | None = None,
        cache: bool = True,
        branch: list[Message] | None = None,
    ) -> None:
        """A new reply to `parent`, or (continue_message) more of an existing one; the worker streams it.
        `branch`: the active branch ending in `parent`, when the caller has it."""
        assert self.model_info is not None
        settings = self.settings.current
        if branch is None or branch[-1].id != parent.id:
            branch = self.store.active_branch(parent.conversation_id)
        messages = self._prompt_messages(parent, branch)
        if continue_message is not None:
            target, created, prefix = continue_message, False, continue_message.content
            shown: list[Message] | None = None
        else:
            target = self.store.add_message(
                parent.conversation_id, "assistant", "", parent.id, model=self.model_info.name
            )
            created, prefix = True, ""
            ids = [m.id for m in branch]
            # the new reply is the active branch's new end (else the store is asked)
            shown = [*branch[: ids.index(parent.id) + 1], target] if parent.id in ids else None
        request = GenerateRequest(
            self.host.next_request_id(),
            ReplyRequest(
                messages,
                params=settings.sampling,
                conversation_id=parent.conversation_id,
                assistant_prefix=prefix,
                context_policy=settings.context_policy,
                use_response_cache=cache and settings.response_cache,
            ),
            compare_cost_with=settings.compare_cost_with,
        )
        self.reply = ActiveReply(request, parent.conversation_id, target.id, created, prefix, prefix)
        self.reply.earlier_turns = sum(1 for m in messages if m.role != "system") - 1
        if parent.conversation_id == self.conversation_id:
            self._sync_rows(shown)
        self.generating_changed.emit(True)
        self.flush_timer.start()
        self.host.generate(request)

    def _current(self, request_id: int) -> ActiveReply | None:
        reply = self.reply
        return reply if reply is not None and reply.request.request_id == request_id else None

    # -- streaming -------------------------------------------------------------------------------------------
    @Slot(int, str, int)
    def _on_token(self, request_id: int, text: str, count: int) -> None:
        reply = self._current(request_id)
        if reply is not None:
            reply.buffer.append(text)
            reply.tokens += count

    def flush(self) -> None:
        """Move the buffered text into the reply's row (one dataChanged) and, about once a second, the store."""
        reply = self.reply
        if reply is None or not reply.buffer:
            return
        delta = "".join(reply.buffer)
        reply.buffer.clear()
        reply.text += delta
        if self.conversation_id == reply.conversation_id:
            row = self.chat_model.row_of(reply.message_id)
            if row is not None:
                self.chat_model.append_text(row, delta)
        if reply.usage is not None and reply.final_usage is None:
            self.context_changed.emit(
                reply.usage.with_reply(reply.usage.reply + reply.tokens), reply.earlier_turns, False
            )
        now = time.monotonic()
        if now - reply.last_saved >= SAVE_EVERY_S:
            reply.last_saved = now
            self.store.update_message(reply.message_id, content=reply.text)

    @Slot(int, object)
    def _on_stats(self, request_id: int, stats: ReplyStats) -> None:
        reply = self._current(request_id)
        if reply is not None:
            reply.stats = stats

    @Slot(int, object)
    def _on_context(self, request_id: int, usage: ContextUsage) -> None:
        """First an estimate before prefill (reply grows live as tokens arrive), then exact numbers at the end."""
        reply = self._current(request_id)
        if reply is None:
            return
        if reply.stats is None:
            reply.usage = usage
            self.context_changed.emit(usage.with_reply(usage.reply + reply.tokens), reply.earlier_turns, False)
        else:
            reply.final_usage = usage
            self.context_changed.emit(usage, reply.earlier_turns, False)
            self.remaining_context.emit(max(0, usage.window - usage.used))

    @Slot(int, str, str, str)
    def _on_finished(self, request_id: int, finish_reason: str, text: str, error: str) -> None:
        reply = self._current(request_id)
        if reply is None:
            return
        self.flush_timer.stop()
        self.flush()
        full = reply.prefix + text
        stats = reply.stats.to_dict() if reply.stats is not None else None
        self.store.update_message(reply.message_id, content=full, finish_reason=finish_reason, stats=stats)
        self.reply = None
        self.generating_changed.emit(False)
        if self.conversation_id == reply.conversation_id:
            row = self.chat_model.row_of(reply.message_id)
            if row is not None:  # one row re-rendered, as Markdown, once
                self.chat_model.update(
                    row, content=full, streaming=False, finish_reason=finish_reason, stats=stats, error=error or None
                )
            if finish_reason == "error" and error:
                self._chat_error(error)
        self.conversations_changed.emit()
        self.reply_finished.emit(finish_reason)

    @Slot(int, str)
    def _on_failed(self, request_id: int, message: str) -> None:
        """Nothing was generated (e.g. the prompt does not fit): undo the empty reply, say why in the chat."""
        reply = self._current(request_id)
        if reply is None:
            return
        self.flush_timer.stop()
        self.reply = None
        self.generating_changed.emit(False)
        if reply.created:
            self.store.delete_message(reply.message_id)
        else:
            self.store.update_message(reply.message_id, content=reply.prefix, finish_reason="length")
        if self.conversation_id == reply.conversation_id:
            self._sync_rows()
            self._chat_error(message)
        self.reply_finished.emit("error")

    def stop(self) -> None:
        self.host.cancel_generation()

    def close(self) -> None:
        """The window is closing: keep what was streamed (the worker's last events will not be delivered)."""
        reply = self.reply
        self.flush_timer.stop()
        if reply is not None:
            self.flush()
            self.store.update_message(reply.message_id, content=reply.text, finish_reason="cancelled")
            self.reply = None

    # -- actions on messages -----------------------------------------------------------------------------------
    def regenerate(self, message_id: int) -> None:
        """Answer the reply's user message again: a new sibling, the old one stays reachable."""
        self._reply_again(message_id, continuing=False)

    def continue_reply(self, message_id: int) -> None:
        """More of a reply cut at the length limit (or interrupted), in the same message."""
        self._reply_again(message_id, continuing=True)

    def _reply_again(self, message_id: int, *, continuing: bool) -> None:
        if self.busy():
            return
        if self.model_info is None:
            self._chat_error(NO_MODEL)
            return
        message = self.store.get_message(message_id)
        if message.parent_id is None:
            return
        parent = self.store.get_message(message.parent_id)
        if continuing:
            self._start_reply(parent, continue_message=message)
        else:
            self._start_reply(parent, cache=False)  # a different answer: never the cached one

    def edit_message(self, message_id: int, text: str) -> None:
        if self.busy():
            return
        original = self.store.get_message(message_id)
        message = self.store.add_message(original.conversation_id, "user", text, original.parent_id)
        if self.model_info is None and not self.loading:
            self._sync_rows()
            self._chat_error(NO_MODEL)
            return
        self._after_new_user_message(message)

    def delete_message(self, message_id: int) -> None:
        if self.busy():
            return
        self.store.delete_message(message_id)
        self._sync_rows()
        self.conversations_changed.emit()

    def switch_branch(self, message_id: int, step: int) -> None:
        if self.busy():
            return
        siblings = self.store.siblings(message_id)
        index = next((i for i, s in enumerate(siblings) if s.id == message_id), 0) + step
        if 0 <= index < len(siblings):
            self.store.switch_to(siblings[index].id)
            self._sync_rows()

    # -- rows ------------------------------------------------------------------------------------------------------
    def _chat_error(self, message: str) -> None:
        """An error about the conversation: shown in the chat, where the reply would have been."""
        self.chat_model.append(ChatItem("error", message))

    def _branch_items(self, branch: list[Message] | None = None) -> list[ChatItem]:
        if self.conversation_id is None:
            return []
        if branch is None:
            branch = self.store.active_branch(self.conversation_id)
        reply = self.reply if self.reply is not None and self.reply.conversation_id == self.conversation_id else None
        streaming = (reply.message_id, reply.text) if reply is not None else None
        return branch_items(self.store, branch, streaming, known_siblings(self.chat_model))

    def _sync_rows(self, branch: list[Message] | None = None) -> None:
        sync_rows(self.chat_model, self._branch_items(branch))
