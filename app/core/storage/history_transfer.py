"""A conversation in and out of Hearth: the JSON export (every branch, re-importable), the Markdown export (the
active branch, readable) and the checks that an imported file is a whole, valid conversation before anything of it
is written. Plain data in, plain data out: HistoryStore reads and writes the database around these.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core.stats_text import reply_stats_text
from app.core.storage.history_schema import (
    FINISH_REASONS,
    ROLES,
    Attachment,
    Conversation,
    HistoryError,
    HistoryImportError,
    Message,
    clean_title,
)

EXPORT_FORMAT = "hearth-conversation"
EXPORT_VERSION = 1
_ROLE_HEADINGS = {"system": "System prompt", "user": "User", "assistant": "Assistant"}


def export_json(conversation: Conversation, messages: list[Message]) -> dict[str, Any]:
    """The whole tree (every branch, `messages` in creation order) as plain JSON data; ids are renumbered 1..n."""
    local_ids = {message.id: index + 1 for index, message in enumerate(messages)}
    return {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "exported_at": time.time(),
        "conversation": {
            "title": conversation.title,
            "created_at": conversation.created_at,
            "updated_at": conversation.updated_at,
            "settings": conversation.settings,
            "active_leaf_id": local_ids.get(conversation.active_leaf_id)
            if conversation.active_leaf_id is not None
            else None,
        },
        "messages": [
            {
                "id": local_ids[message.id],
                "parent_id": local_ids[message.parent_id] if message.parent_id is not None else None,
                "role": message.role,
                "content": message.content,
                "created_at": message.created_at,
                "finish_reason": message.finish_reason,
                "model": message.model,
                "stats": message.stats,
                "attachments": [
                    {
                        "name": attachment.name,
                        "mime_type": attachment.mime_type,
                        "size_bytes": attachment.size_bytes,
                        "sha256": attachment.sha256,
                        "token_count": attachment.token_count,
                        "text": attachment.text,
                    }
                    for attachment in message.attachments
                ],
            }
            for message in messages
        ],
    }


def export_markdown(conversation: Conversation, branch: list[Message]) -> str:
    """The active branch as readable Markdown, with the window's stats line under each reply and attachments
    listed."""
    lines = [f"# {conversation.title}", ""]
    lines.append(f"*Exported from Hearth on {time.strftime('%Y-%m-%d %H:%M', time.localtime())}.*")
    for message in branch:
        lines += ["", f"## {_ROLE_HEADINGS[message.role]}", ""]
        if message.attachments:
            lines.append("Attachments:")
            lines += [f"- {_describe_attachment(attachment)}" for attachment in message.attachments]
            lines.append("")
        lines.append(message.content.rstrip("\n") if message.content.strip() else "*(empty)*")
        if message.role == "assistant":
            summary = reply_stats_text(message.stats, message.finish_reason, model=message.model)
            if summary:
                lines += ["", f"*{summary}*"]
    return "\n".join(lines) + "\n"


def read_export_file(path: Path) -> Any:
    """A `.json` export's data, read from disk; unreadable or non-JSON files raise HistoryImportError."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise HistoryImportError(f"Cannot import {path}: {err.strerror or err}.") from err
    except UnicodeDecodeError as err:
        raise HistoryImportError(f"Cannot import {path}: it is not a UTF-8 text file.") from err
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise HistoryImportError(
            f"Cannot import {path}: it is not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})."
        ) from err


def _human_size(size_bytes: int) -> str:
    if size_bytes < 1024:
        return f"{size_bytes} bytes"
    size = size_bytes / 1024
    for unit in ("KB", "MB"):
        if size < 1024:
            return f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"


def _describe_attachment(attachment: Attachment) -> str:
    parts = [attachment.mime_type, _human_size(attachment.size_bytes)]
    if attachment.token_count is not None:
        parts.append(f"{attachment.token_count:,} tokens")
    return f"`{attachment.name}` ({', '.join(parts)})"


@dataclass(frozen=True)
class ImportedConversation:
    title: str
    created_at: float
    updated_at: float
    settings: dict[str, Any]
    active_leaf_id: int | None


@dataclass(frozen=True)
class ImportedMessage:
    file_id: int
    parent_id: int | None
    role: str
    content: str
    created_at: float
    finish_reason: str | None
    model: str | None
    stats: dict[str, Any] | None
    attachments: tuple[Attachment, ...]


@dataclass(frozen=True)
class ParsedExport:
    conversation: ImportedConversation
    messages: list[ImportedMessage]


def _bad(where: str, problem: str) -> HistoryImportError:
    return HistoryImportError(f"This is not a valid Hearth conversation file: {where} {problem}.")


def _field(
    data: dict[str, Any], key: str, where: str, kinds: type | tuple[type, ...], *, optional: bool = False
) -> Any:
    """data[key], checked against `kinds` (bool is never accepted as a number)."""
    if key not in data:
        if optional:
            return None
        raise _bad(f"{where}.{key}", "is missing")
    value = data[key]
    if value is None and optional:
        return None
    kinds_tuple = kinds if isinstance(kinds, tuple) else (kinds,)
    numeric = any(kind in (int, float) for kind in kinds_tuple)
    if not isinstance(value, kinds_tuple) or (numeric and isinstance(value, bool)):
        names = " or ".join(_TYPE_NAMES.get(kind, kind.__name__) for kind in kinds_tuple)
        raise _bad(f"{where}.{key}", f"must be {names} (got {_TYPE_NAMES.get(type(value), type(value).__name__)})")
    if isinstance(value, float) and not math.isfinite(value):
        raise _bad(f"{where}.{key}", "must be a finite number")
    return value


_TYPE_NAMES: dict[type, str] = {
    str: "text",
    int: "a whole number",
    float: "a number",
    bool: "true/false",
    dict: "an object",
    list: "a list",
    type(None): "null",
}


def parse_export(data: Any) -> ParsedExport:
    if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
        raise HistoryImportError(
            'This file is not a Hearth conversation export (it lacks "format": "hearth-conversation").'
        )
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise _bad("version", "must be a whole number from 1 up")
    if version > EXPORT_VERSION:
        raise HistoryImportError(
            f"This conversation was exported by a newer version of Hearth (format version {version}; this version "
            f"reads up to {EXPORT_VERSION}). Update Hearth to import it."
        )
    header = _field(data, "conversation", "file", dict)
    title = _field(header, "title", "conversation", str)
    try:
        title = clean_title(title)
    except HistoryError:
        raise _bad("conversation.title", "is empty") from None
    conversation = ImportedConversation(
        title=title,
        created_at=float(_field(header, "created_at", "conversation", (int, float))),
        updated_at=float(_field(header, "updated_at", "conversation", (int, float))),
        settings=_field(header, "settings", "conversation", dict, optional=True) or {},
        active_leaf_id=_field(header, "active_leaf_id", "conversation", int, optional=True),
    )
    raw_messages = _field(data, "messages", "file", list)
    messages: list[ImportedMessage] = []
    seen: set[int] = set()
    for index, raw in enumerate(raw_messages):
        where = f"messages[{index}]"
        if not isinstance(raw, dict):
            raise _bad(where, "must be an object")
        file_id = _field(raw, "id", where, int)
        if file_id in seen:
            raise _bad(f"{where}.id", f"repeats id {file_id}")
        parent_id = _field(raw, "parent_id", where, int, optional=True)
        # Parents must come first: this also rules out cycles.
        if parent_id is not None and parent_id not in seen:
            raise _bad(f"{where}.parent_id", f"refers to message {parent_id}, which does not come before it")
        role = _field(raw, "role", where, str)
        if role not in ROLES:
            raise _bad(f"{where}.role", f"must be one of {', '.join(ROLES)} (got {role!r})")
        finish_reason = _field(raw, "finish_reason", where, str, optional=True)
        if finish_reason is not None and finish_reason not in FINISH_REASONS:
            raise _bad(f"{where}.finish_reason", f"must be one of {', '.join(FINISH_REASONS)} (got {finish_reason!r})")
        raw_attachments = _field(raw, "attachments", where, list, optional=True) or []
        attachments: list[Attachment] = []
        for position, raw_attachment in enumerate(raw_attachments):
            attachment_where = f"{where}.attachments[{position}]"
            if not isinstance(raw_attachment, dict):
                raise _bad(attachment_where, "must be an object")
            attachments.append(
                Attachment(
                    name=_field(raw_attachment, "name", attachment_where, str),
                    mime_type=_field(raw_attachment, "mime_type", attachment_where, str),
                    size_bytes=_field(raw_attachment, "size_bytes", attachment_where, int),
                    sha256=_field(raw_attachment, "sha256", attachment_where, str),
                    text=_field(raw_attachment, "text", attachment_where, str),
                    token_count=_field(raw_attachment, "token_count", attachment_where, int, optional=True),
                )
            )
        messages.append(
            ImportedMessage(
                file_id=file_id,
                parent_id=parent_id,
                role=role,
                content=_field(raw, "content", where, str),
                created_at=float(_field(raw, "created_at", where, (int, float))),
                finish_reason=finish_reason,
                model=_field(raw, "model", where, str, optional=True),
                stats=_field(raw, "stats", where, dict, optional=True),
                attachments=tuple(attachments),
            )
        )
        seen.add(file_id)
    if conversation.active_leaf_id is not None and conversation.active_leaf_id not in seen:
        raise _bad(
            "conversation.active_leaf_id", f"refers to message {conversation.active_leaf_id}, which is not in the file"
        )
    return ParsedExport(conversation=conversation, messages=messages)
