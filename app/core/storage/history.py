"""Conversations as message trees in SQLite: branches, streaming saves, exports, schema migrations.

Plain stdlib (no torch, no Qt), so the GUI can open it before any model library is imported.

Storage: one SQLite file (WAL, foreign keys on) with three tables. `conversations` holds the title, settings
(JSON) and the active leaf; `messages` is the tree (each row points at its parent; a NULL parent is a root, so
an edit or a regeneration is simply a second child of the same parent); `attachments` hangs off a message.
`PRAGMA user_version` is the schema version, `PRAGMA application_id` marks the file as Hearth's.

Durability: every write is one transaction. WAL with synchronous=NORMAL survives the app being killed (the
OS already holds the committed pages); only a power cut may lose the last commits, never corrupt the file.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core.errors import HearthError
from app.core.storage import paths, space

log = logging.getLogger(__name__)

ROLES: tuple[str, ...] = ("system", "user", "assistant")
FINISH_REASONS: tuple[str, ...] = ("stop", "length", "cancelled", "error")

# 'HRTH': tells our files apart from other SQLite databases that happen to sit at the path.
APPLICATION_ID = 0x48525448
EXPORT_FORMAT = "hearth-conversation"
EXPORT_VERSION = 1
_SQLITE_HEADER = b"SQLite format 3\x00"
_BUSY_TIMEOUT_S = 10.0


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


def _lenient_text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


def _casefold(value: str | None) -> str | None:
    return value.casefold() if value is not None else None


class HistoryStore:
    """The one connection to the history database, shared by the GUI and worker threads under a lock."""

    def __init__(self, path: Path | None = None, *, in_memory: bool = False) -> None:
        """in_memory: a store that lives only in this process (the window's stand-in while the file at `path`
        cannot be used); `path` then only names the file it stands in for."""
        self.path = Path(path) if path is not None else default_history_path()
        self.in_memory = in_memory
        self._lock = threading.RLock()
        # Message updates a full disk kept from the file: {message id: {column: value}}, written before the next
        # write (or by save_pending), shown by every read meanwhile. See update_message.
        self._pending: dict[int, dict[str, Any]] = {}
        self.pending_reason = ""
        self._db: sqlite3.Connection | None = self._open_memory() if in_memory else self._open()

    # -- opening, closing, transactions --------------------------------------------------------------------------

    def _open_memory(self) -> sqlite3.Connection:
        db = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        db.create_function("hearth_casefold", 1, _casefold, deterministic=True)
        db.execute("PRAGMA foreign_keys = ON")
        self._migrate(db)
        return db

    @staticmethod
    def move_aside(path: Path) -> Path:
        """Rename a history file Hearth cannot use (with its WAL and shared-memory files) to a free
        `NAME.damaged-YYYYmmdd-HHMMSS` name beside it; nothing is deleted. Returns the new path."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        target = path.with_name(f"{path.name}.damaged-{stamp}")
        counter = 1
        while target.exists():
            counter += 1
            target = path.with_name(f"{path.name}.damaged-{stamp}-{counter}")
        for suffix in ("-wal", "-shm"):
            sidecar = path.with_name(path.name + suffix)
            if sidecar.exists():
                sidecar.rename(target.with_name(target.name + suffix))
        path.rename(target)
        return target

    def copy_into(self, path: Path) -> None:
        """Write this store's conversations into a new database file at `path` (which must not exist)."""
        if path.exists():
            raise HistoryError(f"{path} already exists; the history was not copied over it.")
        path.parent.mkdir(parents=True, exist_ok=True)
        target = sqlite3.connect(path)
        try:
            with self._lock:
                self._connection().backup(target)
        finally:
            target.close()

    def _open(self) -> sqlite3.Connection:
        path = self.path
        if path.is_dir():
            raise HistoryError(f"The history database {path} is a folder, not a file.")
        path.parent.mkdir(parents=True, exist_ok=True)
        # Refuse foreign files before SQLite touches them, so they are never modified.
        if path.exists() and path.stat().st_size > 0:
            try:
                with path.open("rb") as handle:
                    header = handle.read(len(_SQLITE_HEADER))
            except OSError as err:
                raise HistoryError(f"The history database {path} cannot be read: {err.strerror}.") from err
            if header != _SQLITE_HEADER:
                raise HistoryDamagedError(
                    f"The file {path} is not a SQLite database, so it cannot be the conversation history; "
                    "it was left untouched (move it away to start a new history)."
                )
        try:
            db = sqlite3.connect(path, timeout=_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as err:
            raise HistoryError(f"The history database {path} cannot be opened: {err}.") from err
        try:
            # A damaged byte inside a message shows as U+FFFD instead of making the whole conversation unreadable.
            db.text_factory = _lenient_text
            db.create_function("hearth_casefold", 1, _casefold, deterministic=True)
            db.execute("PRAGMA foreign_keys = ON")
            self._check_ownership(db)
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = NORMAL")
            self._migrate(db)
        except HistoryError:
            db.close()
            raise
        except sqlite3.DatabaseError as err:
            db.close()
            if isinstance(err, sqlite3.OperationalError) and "locked" in str(err):
                raise HistoryError(
                    f"The history database {path} is busy: another Hearth window may be using it."
                ) from err
            if space.failed_for_space(err, path.parent):
                raise self._disk_full(err) from err
            if not space.is_damaged_database(err):
                raise HistoryError(
                    f"The history database {path} cannot be opened ({err}); it was left untouched."
                ) from err
            raise HistoryDamagedError(
                f"The history database {path} is damaged or cannot be opened ({err}); it was left untouched."
            ) from err
        return db

    def _check_ownership(self, db: sqlite3.Connection) -> None:
        """Refuse a database that is not ours or is newer than this code, before writing anything."""
        version = int(db.execute("PRAGMA user_version").fetchone()[0])
        application_id = int(db.execute("PRAGMA application_id").fetchone()[0])
        has_tables = db.execute("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0] > 0
        fresh = version == 0 and application_id == 0 and not has_tables
        if not fresh and application_id != APPLICATION_ID:
            raise HistoryDamagedError(
                f"The file {self.path} is a SQLite database of another program, not Hearth's conversation "
                "history; it was left untouched."
            )
        if version > schema_version():
            raise HistoryError(
                f"The history database {self.path} was written by a newer version of Hearth (schema {version}; "
                f"this version understands up to {schema_version()}). Update Hearth to open it."
            )

    def _migrate(self, db: sqlite3.Connection) -> None:
        version = int(db.execute("PRAGMA user_version").fetchone()[0])
        target = schema_version()
        if version == target:
            return
        if version > 0:
            # A copy of the old version, in case an upgrade is wrong in a way its transaction cannot undo.
            backup_path = self.path.with_name(f"{self.path.name}.v{version}.bak")
            backup = sqlite3.connect(backup_path)
            try:
                db.backup(backup)
            except sqlite3.Error as err:  # no half-written copy is left beside the file
                backup.close()
                backup_path.unlink(missing_ok=True)
                if space.failed_for_space(err, backup_path.parent):
                    raise self._disk_full(err) from err
                raise
            finally:
                backup.close()
        for index in range(version, target):
            migration = MIGRATIONS[index]
            try:
                db.execute("BEGIN IMMEDIATE")
                migration(db)
                db.execute(f"PRAGMA user_version = {index + 1}")
                db.execute("COMMIT")
            except Exception as err:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise HistoryError(
                    f"The history database {self.path} could not be upgraded to schema {index + 1} ({err}); "
                    f"it was left at schema {index}."
                ) from err

    def close(self) -> None:
        with self._lock:
            if self._db is not None and not self.save_pending():
                log.error("history: %d message update(s) lost at close: %s", len(self._pending), self.pending_reason)
            if self._db is not None:
                try:
                    self._db.execute("PRAGMA optimize")
                except sqlite3.Error:
                    pass  # only statistics for the query planner; never worth failing a close over
                finally:
                    self._db.close()
                    self._db = None

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            raise HistoryError(f"The history database {self.path} is closed.")
        return self._db

    def _disk_full(self, err: BaseException) -> HistoryDiskFullError:
        return HistoryDiskFullError(
            f"The conversation history could not be saved: {space.where_full(self.path.parent)}. The file "
            f"{self.path.name} was not changed; free some space and it is saved again."
        )

    def _damaged(self, err: sqlite3.Error) -> HistoryError:
        if isinstance(err, sqlite3.OperationalError) and "locked" in str(err):
            return HistoryError(
                f"The history database {self.path} is busy: another Hearth window may be writing to it."
            )
        if space.failed_for_space(err, self.path.parent):
            return self._disk_full(err)
        if space.is_damaged_database(err):
            return HistoryDamagedError(
                f"The history database {self.path} is damaged ({err}): restore it from a backup or move it away "
                "to start a new history."
            )
        return HistoryError(f"The history database {self.path} could not be read or written ({err}).")

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            db = self._connection()
            try:
                yield db
            except sqlite3.DatabaseError as err:
                if isinstance(err, sqlite3.IntegrityError):
                    raise  # a bug in this module, not a damaged file
                raise self._damaged(err) from err

    @contextmanager
    def _writing(self) -> Iterator[sqlite3.Connection]:
        """One transaction: all of it is written or none of it."""
        with self._lock:
            db = self._connection()
            try:
                db.execute("BEGIN IMMEDIATE")
                try:
                    self._write_pending(db)
                    yield db
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
                db.execute("COMMIT")
            except sqlite3.DatabaseError as err:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                if isinstance(err, sqlite3.IntegrityError):
                    raise  # a bug in this module, not a damaged file
                raise self._damaged(err) from err
            self._pending.clear()  # committed with this transaction
            self.pending_reason = ""

    def _write_pending(self, db: sqlite3.Connection) -> None:
        for message_id, changes in self._pending.items():
            assignments = ", ".join(f"{column} = ?" for column in changes)
            db.execute(f"UPDATE messages SET {assignments} WHERE id = ?", (*changes.values(), message_id))

    def save_pending(self) -> bool:
        """Write the message updates a full disk held back; whether none is left unsaved. Cheap when there is none."""
        if not self._pending:
            return True
        try:
            with self._writing():
                pass
        except HistoryError as err:
            log.warning("history: %d message(s) still unsaved: %s", len(self._pending), err)
            return False
        return True

    def unsaved_notice(self) -> str:
        """A sentence for the window while updates are held back ("" when everything is saved)."""
        if not self._pending:
            return ""
        count = len(self._pending)
        which = "1 message is" if count == 1 else f"{count} messages are"
        return (
            f"{which} not saved yet: {self.pending_reason} They are saved as soon as there is space; quitting Hearth "
            "before then loses them."
        )

    # -- row helpers ---------------------------------------------------------------------------------------------

    @staticmethod
    def _conversation_from_row(row: Sequence[Any]) -> Conversation:
        return Conversation(
            id=row[0],
            title=row[1],
            created_at=row[2],
            updated_at=row[3],
            active_leaf_id=row[4],
            settings=json.loads(row[5]),
        )

    _CONVERSATION_COLUMNS = "id, title, created_at, updated_at, active_leaf_id, settings"
    _MESSAGE_COLUMNS = "id, conversation_id, parent_id, role, content, created_at, finish_reason, stats, model"

    def _fetch_conversation(self, db: sqlite3.Connection, conversation_id: int) -> Conversation:
        row = db.execute(
            f"SELECT {self._CONVERSATION_COLUMNS} FROM conversations WHERE id = ?", (conversation_id,)
        ).fetchone()
        if row is None:
            raise HistoryNotFoundError(f"Conversation {conversation_id} does not exist (it may have been deleted).")
        return self._conversation_from_row(row)

    def _attachments_for(self, db: sqlite3.Connection, message_ids: Iterable[int]) -> dict[int, list[Attachment]]:
        ids = list(message_ids)
        found: dict[int, list[Attachment]] = {}
        # Chunked: SQLite limits the number of bound parameters per statement.
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for row in db.execute(
                "SELECT message_id, name, mime_type, size_bytes, sha256, text, token_count FROM attachments "
                f"WHERE message_id IN ({marks}) ORDER BY message_id, position",
                chunk,
            ):
                found.setdefault(row[0], []).append(Attachment(*row[1:]))
        return found

    def _messages_from_rows(self, db: sqlite3.Connection, rows: list[Sequence[Any]]) -> list[Message]:
        attachments = self._attachments_for(db, (row[0] for row in rows))
        if self._pending:  # what the file will hold once there is space
            rows = [self._with_pending(row) for row in rows]
        return [
            Message(
                id=row[0],
                conversation_id=row[1],
                parent_id=row[2],
                role=row[3],
                content=row[4],
                created_at=row[5],
                finish_reason=row[6],
                stats=json.loads(row[7]) if row[7] is not None else None,
                attachments=tuple(attachments.get(row[0], ())),
                model=row[8],
            )
            for row in rows
        ]

    def _with_pending(self, row: Sequence[Any]) -> Sequence[Any]:
        changes = self._pending.get(row[0])
        if not changes:
            return row
        updated = list(row)
        for column, index in (("content", 4), ("finish_reason", 6), ("stats", 7)):
            if column in changes:
                updated[index] = changes[column]
        return updated

    def _fetch_message(self, db: sqlite3.Connection, message_id: int) -> Message:
        row = db.execute(f"SELECT {self._MESSAGE_COLUMNS} FROM messages WHERE id = ?", (message_id,)).fetchone()
        if row is None:
            raise HistoryNotFoundError(f"Message {message_id} does not exist (it may have been deleted).")
        return self._messages_from_rows(db, [row])[0]

    def _message_location(self, db: sqlite3.Connection, message_id: int) -> tuple[int, int | None]:
        """(conversation_id, parent_id) of a message."""
        row = db.execute("SELECT conversation_id, parent_id FROM messages WHERE id = ?", (message_id,)).fetchone()
        if row is None:
            raise HistoryNotFoundError(f"Message {message_id} does not exist (it may have been deleted).")
        return row[0], row[1]

    @staticmethod
    def _latest_descendant(db: sqlite3.Connection, message_id: int) -> int:
        """Follow the newest child down to a leaf."""
        current = message_id
        while True:
            row = db.execute("SELECT MAX(id) FROM messages WHERE parent_id = ?", (current,)).fetchone()
            if row[0] is None:
                return current
            current = row[0]

    @staticmethod
    def _ancestor_ids(db: sqlite3.Connection, message_id: int) -> list[int]:
        """The message and its ancestors, leaf first."""
        rows = db.execute(
            """WITH RECURSIVE chain(id, parent_id, depth) AS (
                   SELECT id, parent_id, 0 FROM messages WHERE id = ?
                   UNION ALL
                   SELECT m.id, m.parent_id, chain.depth + 1 FROM messages m JOIN chain ON m.id = chain.parent_id
               ) SELECT id FROM chain ORDER BY depth""",
            (message_id,),
        ).fetchall()
        return [row[0] for row in rows]

    @staticmethod
    def _touch(db: sqlite3.Connection, conversation_id: int) -> None:
        db.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (time.time(), conversation_id))

    # -- conversations -------------------------------------------------------------------------------------------

    def create_conversation(self, title: str = "New chat", settings: dict[str, Any] | None = None) -> Conversation:
        clean_title = _clean_title(title)
        settings_json = json.dumps(settings or {})
        now = time.time()
        with self._writing() as db:
            cursor = db.execute(
                "INSERT INTO conversations (title, created_at, updated_at, settings) VALUES (?, ?, ?, ?)",
                (clean_title, now, now, settings_json),
            )
            assert cursor.lastrowid is not None
            return self._fetch_conversation(db, cursor.lastrowid)

    def get_conversation(self, conversation_id: int) -> Conversation:
        with self._reading() as db:
            return self._fetch_conversation(db, conversation_id)

    def list_conversations(self, search: str | None = None) -> list[Conversation]:
        """Newest updated first. `search` matches the title or any message's text, ignoring case."""
        query = f"SELECT {self._CONVERSATION_COLUMNS} FROM conversations c"
        params: tuple[Any, ...] = ()
        if search and search.strip():
            needle = search.strip().casefold()
            query += (
                " WHERE instr(hearth_casefold(c.title), ?) > 0 OR EXISTS (SELECT 1 FROM messages m"
                " WHERE m.conversation_id = c.id AND instr(hearth_casefold(m.content), ?) > 0)"
            )
            params = (needle, needle)
        query += " ORDER BY c.updated_at DESC, c.id DESC"
        with self._reading() as db:
            return [self._conversation_from_row(row) for row in db.execute(query, params)]

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        clean_title = _clean_title(title)
        with self._writing() as db:
            self._fetch_conversation(db, conversation_id)
            db.execute("UPDATE conversations SET title = ? WHERE id = ?", (clean_title, conversation_id))

    def update_conversation_settings(self, conversation_id: int, settings: dict[str, Any]) -> None:
        settings_json = json.dumps(settings)
        with self._writing() as db:
            self._fetch_conversation(db, conversation_id)
            db.execute("UPDATE conversations SET settings = ? WHERE id = ?", (settings_json, conversation_id))

    def delete_conversation(self, conversation_id: int) -> None:
        with self._writing() as db:
            self._fetch_conversation(db, conversation_id)
            db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    # -- messages ------------------------------------------------------------------------------------------------

    def add_message(
        self,
        conversation_id: int,
        role: str,
        content: str,
        parent_id: int | None,
        *,
        attachments: Iterable[Attachment] = (),
        model: str | None = None,
        finish_reason: str | None = None,
        stats: dict[str, Any] | None = None,
    ) -> Message:
        """Add a message under `parent_id` (None: a new root) and make it the conversation's active leaf.

        Regenerating a reply adds an assistant message under the same user message; editing a user message adds
        a user message under the edited one's parent. The earlier branch stays, reachable via siblings/switch_to.
        """
        _check_role(role)
        _check_finish_reason(finish_reason)
        attachment_list = list(attachments)
        stats_json = json.dumps(stats) if stats is not None else None
        with self._writing() as db:
            self._fetch_conversation(db, conversation_id)
            if parent_id is not None:
                parent_conversation, _ = self._message_location(db, parent_id)
                if parent_conversation != conversation_id:
                    raise HistoryError(
                        f"Message {parent_id} belongs to another conversation, so it cannot be a parent here."
                    )
            message_id = self._insert_message(
                db, conversation_id, parent_id, role, content, time.time(), finish_reason, stats_json, model
            )
            for position, attachment in enumerate(attachment_list):
                self._insert_attachment(db, message_id, position, attachment)
            db.execute(
                "UPDATE conversations SET active_leaf_id = ?, updated_at = ? WHERE id = ?",
                (message_id, time.time(), conversation_id),
            )
            return self._fetch_message(db, message_id)

    @staticmethod
    def _insert_message(
        db: sqlite3.Connection,
        conversation_id: int,
        parent_id: int | None,
        role: str,
        content: str,
        created_at: float,
        finish_reason: str | None,
        stats_json: str | None,
        model: str | None,
    ) -> int:
        cursor = db.execute(
            "INSERT INTO messages (conversation_id, parent_id, role, content, created_at, finish_reason, stats, model)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (conversation_id, parent_id, role, content, created_at, finish_reason, stats_json, model),
        )
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    @staticmethod
    def _insert_attachment(db: sqlite3.Connection, message_id: int, position: int, attachment: Attachment) -> None:
        db.execute(
            "INSERT INTO attachments (message_id, position, name, mime_type, size_bytes, sha256, text, token_count)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                message_id,
                position,
                attachment.name,
                attachment.mime_type,
                attachment.size_bytes,
                attachment.sha256,
                attachment.text,
                attachment.token_count,
            ),
        )

    def update_message(
        self,
        message_id: int,
        *,
        content: str | None = None,
        finish_reason: str | None = None,
        stats: dict[str, Any] | None = None,
    ) -> None:
        """Overwrite the given fields (None leaves a field as it is). Cheap enough to call every second while a
        reply streams: one small transaction, committed to the WAL without waiting for the disk.

        On a full disk the update is kept (reads show it) and written with the next write that finds space, or by
        save_pending; unsaved_notice says so meanwhile. A streaming reply is never lost to a full disk mid-reply."""
        _check_finish_reason(finish_reason)
        changes: dict[str, Any] = {}
        if content is not None:
            changes["content"] = content
        if finish_reason is not None:
            changes["finish_reason"] = finish_reason
        if stats is not None:
            changes["stats"] = json.dumps(stats)
        try:
            with self._writing() as db:
                conversation_id, _ = self._message_location(db, message_id)
                if changes:
                    assignments = ", ".join(f"{column} = ?" for column in changes)
                    db.execute(f"UPDATE messages SET {assignments} WHERE id = ?", (*changes.values(), message_id))
                    self._touch(db, conversation_id)
        except HistoryDiskFullError as err:
            if changes:
                with self._lock:
                    self._pending[message_id] = {**self._pending.get(message_id, {}), **changes}
                    self.pending_reason = str(err)
                log.warning("history: update of message %d held back: %s", message_id, err)

    def get_message(self, message_id: int) -> Message:
        with self._reading() as db:
            return self._fetch_message(db, message_id)

    def active_branch(self, conversation_id: int) -> list[Message]:
        """The messages from the root to the active leaf: what the model sees as the conversation."""
        with self._reading() as db:
            conversation = self._fetch_conversation(db, conversation_id)
            if conversation.active_leaf_id is None:
                return []
            columns = ", ".join(f"m.{column.strip()}" for column in self._MESSAGE_COLUMNS.split(","))
            rows = db.execute(
                f"""WITH RECURSIVE chain(id, depth) AS (
                        SELECT ?, 0
                        UNION ALL
                        SELECT m.parent_id, chain.depth + 1 FROM messages m JOIN chain ON m.id = chain.id
                        WHERE m.parent_id IS NOT NULL
                    ) SELECT {columns} FROM chain JOIN messages m ON m.id = chain.id ORDER BY chain.depth DESC""",
                (conversation.active_leaf_id,),
            ).fetchall()
            return self._messages_from_rows(db, rows)

    def reply_stats(self, conversation_id: int) -> list[dict[str, Any]]:
        """The stats of every finished reply in the conversation, on every branch (a regenerated reply was paid
        for too), oldest first: what the window sums into the conversation's cost."""
        with self._reading() as db:
            rows = db.execute(
                "SELECT stats FROM messages WHERE conversation_id = ? AND role = 'assistant' AND stats IS NOT NULL "
                "ORDER BY id",
                (conversation_id,),
            ).fetchall()
        return [json.loads(row[0]) for row in rows]

    def children(self, message_id: int | None, conversation_id: int) -> list[Message]:
        """The replies to a message in creation order; `message_id` None gives the conversation's roots."""
        with self._reading() as db:
            self._fetch_conversation(db, conversation_id)
            rows = db.execute(
                f"SELECT {self._MESSAGE_COLUMNS} FROM messages WHERE conversation_id = ? AND parent_id IS ? "
                "ORDER BY id",
                (conversation_id, message_id),
            ).fetchall()
            return self._messages_from_rows(db, rows)

    def siblings(self, message_id: int) -> list[Message]:
        """The alternatives at this point of the tree (regenerations or edits), itself included, oldest first."""
        with self._reading() as db:
            conversation_id, parent_id = self._message_location(db, message_id)
            return self.children(parent_id, conversation_id)

    def switch_to(self, message_id: int) -> None:
        """Make the branch through this message the active one.

        If the active branch already passes through it nothing changes; otherwise the active leaf becomes its
        newest descendant, following the latest child at each step.
        """
        with self._writing() as db:
            conversation_id, _ = self._message_location(db, message_id)
            conversation = self._fetch_conversation(db, conversation_id)
            if conversation.active_leaf_id is not None and message_id in self._ancestor_ids(
                db, conversation.active_leaf_id
            ):
                return
            leaf = self._latest_descendant(db, message_id)
            db.execute("UPDATE conversations SET active_leaf_id = ? WHERE id = ?", (leaf, conversation_id))

    def delete_message(self, message_id: int) -> None:
        """Delete a message and everything below it.

        If the active branch went through it, the branch moves to the newest remaining sibling (the previous
        alternative), else to the parent, else to the newest remaining root, else to nothing.
        """
        with self._writing() as db:
            conversation_id, parent_id = self._message_location(db, message_id)
            conversation = self._fetch_conversation(db, conversation_id)
            leaf = conversation.active_leaf_id
            active_affected = leaf is None or message_id in self._ancestor_ids(db, leaf)
            db.execute(
                """WITH RECURSIVE subtree(id) AS (
                       SELECT ? UNION ALL SELECT m.id FROM messages m JOIN subtree ON m.parent_id = subtree.id
                   ) DELETE FROM messages WHERE id IN (SELECT id FROM subtree)""",
                (message_id,),
            )
            if active_affected:
                sibling = db.execute(
                    "SELECT MAX(id) FROM messages WHERE conversation_id = ? AND parent_id IS ?",
                    (conversation_id, parent_id),
                ).fetchone()[0]
                leaf = self._latest_descendant(db, sibling) if sibling is not None else parent_id
                db.execute("UPDATE conversations SET active_leaf_id = ? WHERE id = ?", (leaf, conversation_id))
            self._touch(db, conversation_id)

    # -- export and import ---------------------------------------------------------------------------------------

    def export_json(self, conversation_id: int) -> dict[str, Any]:
        """The whole tree (every branch) as plain JSON data; ids are renumbered 1..n in creation order."""
        with self._reading() as db:
            conversation = self._fetch_conversation(db, conversation_id)
            rows = db.execute(
                f"SELECT {self._MESSAGE_COLUMNS} FROM messages WHERE conversation_id = ? ORDER BY id",
                (conversation_id,),
            ).fetchall()
            messages = self._messages_from_rows(db, rows)
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

    def export_markdown(self, conversation_id: int) -> str:
        """The active branch as readable Markdown, with a stats line under each reply and attachments listed."""
        conversation = self.get_conversation(conversation_id)
        branch = self.active_branch(conversation_id)
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
                summary = _reply_summary(message)
                if summary:
                    lines += ["", f"*{summary}*"]
        return "\n".join(lines) + "\n"

    def import_json(self, data: Any) -> Conversation:
        """Import an `export_json` document as a new conversation, all of it or (on any error) nothing."""
        parsed = _parse_export(data)
        with self._writing() as db:
            header = parsed.conversation
            cursor = db.execute(
                "INSERT INTO conversations (title, created_at, updated_at, settings) VALUES (?, ?, ?, ?)",
                (header.title, header.created_at, header.updated_at, json.dumps(header.settings)),
            )
            assert cursor.lastrowid is not None
            conversation_id = cursor.lastrowid
            new_ids: dict[int, int] = {}
            for item in parsed.messages:
                new_id = self._insert_message(
                    db,
                    conversation_id,
                    new_ids[item.parent_id] if item.parent_id is not None else None,
                    item.role,
                    item.content,
                    item.created_at,
                    item.finish_reason,
                    json.dumps(item.stats) if item.stats is not None else None,
                    item.model,
                )
                new_ids[item.file_id] = new_id
                for position, attachment in enumerate(item.attachments):
                    self._insert_attachment(db, new_id, position, attachment)
            leaf = new_ids[header.active_leaf_id] if header.active_leaf_id is not None else None
            db.execute("UPDATE conversations SET active_leaf_id = ? WHERE id = ?", (leaf, conversation_id))
            return self._fetch_conversation(db, conversation_id)

    def import_json_file(self, path: Path) -> Conversation:
        """Read a `.json` export from disk and import it; unreadable or non-JSON files raise HistoryImportError."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as err:
            raise HistoryImportError(f"Cannot import {path}: {err.strerror or err}.") from err
        except UnicodeDecodeError as err:
            raise HistoryImportError(f"Cannot import {path}: it is not a UTF-8 text file.") from err
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise HistoryImportError(
                f"Cannot import {path}: it is not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})."
            ) from err
        return self.import_json(data)


# ---------------------------------------------------------------------------------------------------------------
# Validation and formatting helpers.


def _clean_title(title: str) -> str:
    clean = " ".join(str(title).split())
    if not clean:
        raise HistoryError("A conversation title cannot be empty.")
    return clean


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise HistoryError(f"A message role must be one of {', '.join(ROLES)} (got {role!r}).")


def _check_finish_reason(finish_reason: str | None) -> None:
    if finish_reason is not None and finish_reason not in FINISH_REASONS:
        raise HistoryError(f"A finish reason must be one of {', '.join(FINISH_REASONS)} (got {finish_reason!r}).")


_ROLE_HEADINGS = {"system": "System prompt", "user": "User", "assistant": "Assistant"}
_FINISH_NOTES = {"length": "stopped at the length limit", "cancelled": "stopped by the user", "error": "failed"}


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


def _reply_summary(message: Message) -> str:
    """One line of numbers under a reply, from the stored ReplyStats dict (any field may be missing)."""
    parts: list[str] = []
    stats = message.stats or {}
    if isinstance(stats.get("generated_tokens"), int):
        parts.append(f"{stats['generated_tokens']:,} tokens")
    speed = stats.get("decode_tokens_per_s")
    if isinstance(speed, int | float) and math.isfinite(speed) and speed > 0:
        parts.append(f"{speed:.1f} tok/s")
    ttft = stats.get("ttft_s")
    if isinstance(ttft, int | float) and math.isfinite(ttft):
        parts.append(f"first token after {ttft:.2f} s")
    prompt_tokens = stats.get("prompt_tokens")
    if isinstance(prompt_tokens, int):
        cached = stats.get("cached_tokens")
        cached_note = f" ({cached:,} cached)" if isinstance(cached, int) and cached else ""
        parts.append(f"prompt {prompt_tokens:,} tokens{cached_note}")
    if stats.get("from_response_cache"):
        parts.append("replayed from the response cache")
    if message.model:
        parts.append(message.model)
    cost = stats.get("cost")
    if isinstance(cost, dict) and isinstance(cost.get("total_usd"), int | float):
        what = "would cost" if cost.get("hypothetical") else "cost"
        parts.append(f"{what} ~${cost['total_usd']:.4f} on {cost.get('provider')}/{cost.get('model')} (estimate)")
    if message.finish_reason in _FINISH_NOTES:
        parts.append(_FINISH_NOTES[message.finish_reason])
    return " · ".join(parts)


@dataclass(frozen=True)
class _ImportedConversation:
    title: str
    created_at: float
    updated_at: float
    settings: dict[str, Any]
    active_leaf_id: int | None


@dataclass(frozen=True)
class _ImportedMessage:
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
class _ParsedExport:
    conversation: _ImportedConversation
    messages: list[_ImportedMessage]


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


def _parse_export(data: Any) -> _ParsedExport:
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
        title = _clean_title(title)
    except HistoryError:
        raise _bad("conversation.title", "is empty") from None
    conversation = _ImportedConversation(
        title=title,
        created_at=float(_field(header, "created_at", "conversation", (int, float))),
        updated_at=float(_field(header, "updated_at", "conversation", (int, float))),
        settings=_field(header, "settings", "conversation", dict, optional=True) or {},
        active_leaf_id=_field(header, "active_leaf_id", "conversation", int, optional=True),
    )
    raw_messages = _field(data, "messages", "file", list)
    messages: list[_ImportedMessage] = []
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
            _ImportedMessage(
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
    return _ParsedExport(conversation=conversation, messages=messages)
