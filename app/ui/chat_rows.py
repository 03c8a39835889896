"""The rows the chat shows for a conversation's active branch, the smallest change that brings the chat model there,
what the model sees of a message, and the context gauge's estimate for a reopened conversation.

Rows that stay the same keep their widgets (and rendered Markdown): a send appends rows, a finished reply updates
one, and only from the first row that is a different message on are rows replaced (a new branch, a deletion).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, cast

from app.core.chat.events import ChatMessage
from app.core.engines.backend import ContextUsage, estimate_context
from app.core.storage.history import HistoryStore, Message
from app.ui.chat_model import ChatItem, ChatModel


def known_siblings(chat_model: ChatModel) -> dict[int, tuple[int, int]]:
    """Message id -> (sibling index, sibling count) of the stored rows shown now, in order, up to the first
    unstored row: those did not change (new siblings only appear where the rows diverge)."""
    known: dict[int, tuple[int, int]] = {}
    for item in chat_model.items():
        if item.message_id is None:
            break
        known[item.message_id] = (item.sibling_index, item.sibling_count)
    return known


def branch_items(
    store: HistoryStore,
    branch: list[Message],
    streaming: tuple[int, str] | None,
    known: dict[int, tuple[int, int]],
) -> list[ChatItem]:
    """The rows for `branch`. `streaming`: (message id, text streamed so far) of the reply being generated in this
    conversation: the store lags the stream by up to a second, so that row shows what has streamed. `known`: rows
    whose sibling position need not be asked of the store again."""
    items: list[ChatItem] = []
    for message in branch:
        if message.role == "system":
            continue
        if message.id in known:
            index, count = known[message.id]
        else:
            siblings = store.siblings(message.id)
            index = next((i for i, s in enumerate(siblings) if s.id == message.id), 0)
            count = len(siblings)
        is_streaming = streaming is not None and message.id == streaming[0]
        finish = message.finish_reason
        if message.role == "assistant" and finish is None and not is_streaming:
            finish = "interrupted"  # saved while streaming, never finished: the app died or was killed
        item = ChatItem(
            role=message.role,
            content=message.content,
            message_id=message.id,
            finish_reason=finish,
            stats=message.stats,
            sibling_index=index,
            sibling_count=count,
            model=message.model,
            extra={"attachments": [a.name for a in message.attachments]} if message.attachments else {},
        )
        if streaming is not None and is_streaming:
            item = replace(item, content=streaming[1], streaming=True, finish_reason=None, stats=None)
        items.append(item)
    return items


def sync_rows(chat_model: ChatModel, wanted: list[ChatItem]) -> None:
    """Make the model's rows `wanted`, touching only rows that differ."""
    shown = chat_model.items()
    keep = 0
    while keep < min(len(wanted), len(shown)) and wanted[keep].message_id == shown[keep].message_id:
        if wanted[keep] != shown[keep]:  # e.g. the reply being continued: this row only
            chat_model.update(keep, **wanted[keep].__dict__)
        keep += 1
    for row in range(len(shown) - 1, keep - 1, -1):
        chat_model.remove(row)
    for item in wanted[keep:]:
        chat_model.append(item)


def content_for_model(message: Message) -> str:
    """What the model sees for a message: its attached documents (as the documents feature lays them out), then the
    text. The store keeps the text and the attachments apart."""
    if not message.attachments:
        return message.content
    from app.core.documents.layout import compose_user_message

    return compose_user_message(message.content, cast(Any, message.attachments))


def context_estimate(
    branch: list[Message], system_prompt: str, count_tokens: Callable[[str], int], window: int
) -> tuple[ContextUsage, int] | None:
    """How the branch fills the context, counted message by message (no chat template), with the number of turns
    before the newest user message; None when there is no user message yet."""
    turns = [m for m in branch if m.role in ("user", "assistant")]
    last_user = max((i for i, m in enumerate(turns) if m.role == "user"), default=None)
    if last_user is None:
        return None
    messages = [ChatMessage("system", system_prompt)] if system_prompt.strip() else []
    messages += [ChatMessage(m.role, content_for_model(m)) for m in turns[: last_user + 1]]  # type: ignore[arg-type]
    reply = "".join(m.content for m in turns[last_user + 1 :])
    return estimate_context(messages, reply, count_tokens, window), last_user
