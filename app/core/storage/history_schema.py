"""What a conversation history is: its SQLite tables and their migrations, the records read from them, and the
errors a store raises.

Storage: one SQLite file (WAL, foreign keys on) with three tables. `conversations` holds the title, settings
(JSON) and the active leaf; `messages` is the tree (each row points at its parent; a NULL parent is a root, so
an edit or a regeneration is simply a second child of the same parent); `attachments` hangs off a message.
`PRAGMA user_version` is the schema version, `PRAGMA application_id` marks the file as Hearth's.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core.errors import HearthError
from app.core.storage import paths

ROLES: tuple[str, ...] = ("system", "user", "assistant")
FINISH_REASONS: tuple[str, ...] = ("stop", "length", "cancelled", "error")

# 'HRTH': tells our files apart from other SQLite databases that happen to sit at the path.
APPLICATION_ID = 0x48525448


class HistoryError(HearthError):
    """The history database cannot be used as asked."""


class HistoryDamagedError(HistoryError):
    """The file at the history's path is not a usable Hearth history (not SQLite, damaged, another program's).
    It is never modified; the user may move it aside and start a new history (HistoryStore.move_aside)."""


class HistoryDiskFullError(HistoryError):
    """The disk holding the history is full: nothing in the file was changed (it is not damaged)."""


class HistoryNotFoundError(HistoryError):
    """A conversation or message id that does not exist (any more)."""


class HistoryImportError(HistoryError):
    """A conversation file that cannot be imported; nothing was written."""


@dataclass(frozen=True)
class Attachment:
    name: str
    mime_type: str
    size_bytes: int
    sha256: str  # of the original file's bytes
    text: str  # the extracted text the model sees
    token_count: int | None = None


@dataclass(frozen=True)
class Message:
    id: int
    conversation_id: int
    parent_id: int | None
    role: str  # "system" | "user" | "assistant"
    content: str
    created_at: float
    finish_reason: str | None  # None while a reply streams (or if the app died while it did)
    stats: dict[str, Any] | None  # ReplyStats.to_dict()
    attachments: tuple[Attachment, ...]
    model: str | None


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    created_at: float
    updated_at: float  # last change to its messages; the list is ordered by it
    active_leaf_id: int | None
    settings: dict[str, Any]


def default_history_path() -> Path:
    return paths.data_dir() / "history.sqlite"


# ---------------------------------------------------------------------------------------------------------------
# Schema migrations: MIGRATIONS[i] upgrades a database from version i to i + 1, inside one transaction.
# Append new ones; never edit a released one. A migration that must rebuild a table has to switch foreign keys
# off around its transaction itself (the pragma is ignored inside one).


def _migrate_to_1(db: sqlite3.Connection) -> None:
    db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    db.execute(
        """CREATE TABLE conversations (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            title TEXT NOT NULL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            active_leaf_id INTEGER REFERENCES messages(id) ON DELETE SET NULL,
            settings TEXT NOT NULL DEFAULT '{}'
        )"""
    )
    # parent_id has no cascade on purpose: a cascade recurses once per tree level and SQLite caps that depth,
    # so subtrees are deleted explicitly in one statement (foreign keys are checked at its end).
    db.execute(
        """CREATE TABLE messages (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            parent_id INTEGER REFERENCES messages(id),
            role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
            content TEXT NOT NULL,
            created_at REAL NOT NULL,
            finish_reason TEXT CHECK (finish_reason IN ('stop', 'length', 'cancelled', 'error')),
            stats TEXT,
            model TEXT
        )"""
    )
    db.execute("CREATE INDEX messages_by_parent ON messages(conversation_id, parent_id)")
    db.execute("CREATE INDEX messages_parent ON messages(parent_id)")
    db.execute(
        """CREATE TABLE attachments (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
            position INTEGER NOT NULL,
            name TEXT NOT NULL,
            mime_type TEXT NOT NULL,
            size_bytes INTEGER NOT NULL,
            sha256 TEXT NOT NULL,
            text TEXT NOT NULL,
            token_count INTEGER
        )"""
    )
    db.execute("CREATE INDEX attachments_by_message ON attachments(message_id, position)")
    db.execute("CREATE INDEX conversations_by_update ON conversations(updated_at)")


Migration = Callable[[sqlite3.Connection], None]
MIGRATIONS: list[Migration] = [_migrate_to_1]


def schema_version() -> int:
    """The schema version this code writes (the number of migrations)."""
    return len(MIGRATIONS)


def clean_title(title: str) -> str:
    clean = " ".join(str(title).split())
    if not clean:
        raise HistoryError("A conversation title cannot be empty.")
    return clean


def check_role(role: str) -> None:
    if role not in ROLES:
        raise HistoryError(f"A message role must be one of {', '.join(ROLES)} (got {role!r}).")


def check_finish_reason(finish_reason: str | None) -> None:
    if finish_reason is not None and finish_reason not in FINISH_REASONS:
        raise HistoryError(f"A finish reason must be one of {', '.join(FINISH_REASONS)} (got {finish_reason!r}).")
