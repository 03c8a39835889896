"""The conversation history store: message trees in SQLite, with branches, streaming saves and schema migrations.

Plain stdlib (no torch, no Qt), so the GUI can open it before any model library is imported. What the tables and
records are lives in history_schema, the JSON/Markdown exports and their import in history_transfer; the names
callers use are re-exported here.

Durability: every write is one transaction. WAL with synchronous=NORMAL survives the app being killed (the
OS already holds the committed pages); only a power cut may lose the last commits, never corrupt the file.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from app.core.storage import history_schema, history_transfer, space
from app.core.storage.history_schema import (
    APPLICATION_ID,
    Attachment,
    Conversation,
    HistoryDamagedError,
    HistoryDiskFullError,
    HistoryError,
    HistoryImportError,
    HistoryNotFoundError,
    Message,
    check_finish_reason,
    check_role,
    clean_title,
    default_history_path,
)

__all__ = [
    "Attachment",
    "Conversation",
    "HistoryDamagedError",
    "HistoryDiskFullError",
    "HistoryError",
    "HistoryImportError",
    "HistoryNotFoundError",
    "HistoryStore",
    "Message",
    "default_history_path",
]

log = logging.getLogger(__name__)

_BUSY_TIMEOUT_S = 10.0


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
        try:
            foreign = space.holds_other_than_sqlite(path)
        except OSError as err:
            raise HistoryError(f"The history database {path} cannot be read: {err.strerror}.") from err
        if foreign:
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
        if version > history_schema.schema_version():
            raise HistoryError(
                f"The history database {self.path} was written by a newer version of Hearth (schema {version}; "
                f"this version understands up to {history_schema.schema_version()}). Update Hearth to open it."
            )

    def _migrate(self, db: sqlite3.Connection) -> None:
        version = int(db.execute("PRAGMA user_version").fetchone()[0])
        target = history_schema.schema_version()
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
            migration = history_schema.MIGRATIONS[index]
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
        which, them = ("1 message is", "it") if count == 1 else (f"{count} messages are", "them")
        return (
            f"{which} not saved yet: {self.pending_reason}. {self.path.name} was not changed; Hearth saves {them} as "
            f"soon as there is space, and quitting before then loses {them}."
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
        title = clean_title(title)
        settings_json = json.dumps(settings or {})
        now = time.time()
        with self._writing() as db:
            cursor = db.execute(
                "INSERT INTO conversations (title, created_at, updated_at, settings) VALUES (?, ?, ?, ?)",
                (title, now, now, settings_json),
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
        title = clean_title(title)
        with self._writing() as db:
            self._fetch_conversation(db, conversation_id)
            db.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id))

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
        check_role(role)
        check_finish_reason(finish_reason)
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
        check_finish_reason(finish_reason)
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
                    self.pending_reason = space.where_full(self.path.parent)  # "the disk holding X is full (…)"
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
        """The whole tree (every branch) as plain JSON data (history_transfer.export_json)."""
        with self._reading() as db:
            conversation = self._fetch_conversation(db, conversation_id)
            rows = db.execute(
                f"SELECT {self._MESSAGE_COLUMNS} FROM messages WHERE conversation_id = ? ORDER BY id",
                (conversation_id,),
            ).fetchall()
            messages = self._messages_from_rows(db, rows)
        return history_transfer.export_json(conversation, messages)

    def export_markdown(self, conversation_id: int) -> str:
        """The active branch as readable Markdown (history_transfer.export_markdown)."""
        return history_transfer.export_markdown(
            self.get_conversation(conversation_id), self.active_branch(conversation_id)
        )

    def import_json(self, data: Any) -> Conversation:
        """Import an `export_json` document as a new conversation, all of it or (on any error) nothing."""
        parsed = history_transfer.parse_export(data)
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
        return self.import_json(history_transfer.read_export_file(path))
