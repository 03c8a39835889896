"""Greedy replies kept on disk: asking the same again (same model, precision and prompt tokens) replays them.

The cheapest token is the one not generated. Only temperature-0 replies are stored, since only they are
deterministic. Bounded by entry count, least recently used evicted first. SQLite gives atomic writes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from app.core.storage import paths, space

DEFAULT_MAX_ENTRIES = 2000
log = logging.getLogger(__name__)
_T = TypeVar("_T")


@dataclass(frozen=True)
class CachedReply:
    pieces: list[str]
    finish_reason: str
    generated_tokens: int

    @property
    def text(self) -> str:
        return "".join(self.pieces)


def cache_key(model_id: str, quantization: str, prompt_ids: list[int], params: dict[str, Any]) -> str:
    payload = json.dumps(
        {"model": model_id, "quant": quantization, "ids": prompt_ids, "params": params}, sort_keys=True
    )
    return hashlib.sha256(payload.encode()).hexdigest()


CACHE_SCHEMA = 2  # PRAGMA user_version; another version is rebuilt (it is only a cache)
_CREATE_TABLE = (
    "CREATE TABLE IF NOT EXISTS replies (key TEXT PRIMARY KEY, pieces TEXT NOT NULL, finish_reason TEXT NOT NULL, "
    "generated_tokens INTEGER NOT NULL, last_used REAL NOT NULL, checksum TEXT NOT NULL)"
)


def _entry_checksum(key: str, pieces: str, finish_reason: str, generated_tokens: int) -> str:
    return hashlib.sha256(f"{key}\0{pieces}\0{finish_reason}\0{generated_tokens}".encode()).hexdigest()


class ResponseCache:
    """Derived data: a damaged file is moved aside as `responses.sqlite.damaged` and rebuilt, a damaged entry is
    dropped; both leave a line in `notices` for the front end to show. A cache problem never fails a reply.

    Only a damaged file (SQLITE_CORRUPT, SQLITE_NOTADB) is moved aside. A file that can't be written (a full disk, a
    read-only folder, another process holding it) is healthy and left exactly as it is: the cache is then off
    (replies are generated, not stored) with one notice saying why, and is tried again the next time it is opened."""

    def __init__(self, path: Path | None = None, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        self.path = path or paths.cache_dir() / "responses.sqlite"
        self.max_entries = max_entries
        self.notices: list[str] = []
        self._lock = threading.Lock()
        self.off_reason = ""  # why the cache is off for this session ("" while it works)
        try:
            self._db = self._open()
        except (sqlite3.Error, OSError) as exc:
            self._db = self._after_failure("opening", exc)

    def _after_failure(self, action: str, exc: sqlite3.Error | OSError) -> sqlite3.Connection:
        """The connection to go on with after `exc`: a rebuilt file when the file is damaged, else (the file is
        healthy, only unwritable now) an empty cache in memory, the file untouched."""
        full = space.failed_for_space(exc, self.path.parent)
        if isinstance(exc, sqlite3.Error) and space.is_damaged_database(exc) and not full:
            try:
                return self._rebuild(exc)
            except (sqlite3.Error, OSError) as again:  # e.g. the cache folder went read-only: run without a cache
                exc = again
        self._switch_off(action, exc)
        db = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        db.execute(_CREATE_TABLE)
        return db

    def _switch_off(self, action: str, exc: BaseException) -> None:
        if self.off_reason:
            return
        if space.failed_for_space(exc, self.path.parent):
            why = space.where_full(self.path.parent)
        else:
            why = f"{self.path} could not be used ({exc})"
        self.off_reason = why
        log.warning("response cache off while %s: %s", action, why)
        self.notices.append(
            f"The response cache is off for this session: {why}. Replies are still generated and shown; the file "
            "was left as it is."
        )

    def _open(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if space.holds_other_than_sqlite(self.path):  # its own header, whatever a leftover WAL holds
            raise sqlite3.DatabaseError("file is not a database")
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            if int(db.execute("PRAGMA user_version").fetchone()[0]) != CACHE_SCHEMA:
                db.execute("DROP TABLE IF EXISTS replies")
                db.execute(f"PRAGMA user_version = {CACHE_SCHEMA}")
            db.execute(_CREATE_TABLE)
            db.execute("SELECT COUNT(*) FROM replies").fetchone()  # reads the table's pages: a cut file fails here
        except BaseException:
            db.close()
            raise
        return db

    def _rebuild(self, error: sqlite3.Error) -> sqlite3.Connection:
        """Quarantine the damaged file under `.damaged` (replacing an older one) and start an empty cache."""
        damaged = self.path.with_name(self.path.name + ".damaged")
        for suffix in ("", "-wal", "-shm"):
            part = self.path.with_name(self.path.name + suffix)
            if part.exists():
                os.replace(part, damaged.with_name(damaged.name + suffix))
        log.warning("response cache %s damaged (%s); moved to %s", self.path, error, damaged)
        self.notices.append(
            f"The response cache {self.path} was damaged ({error}); it was moved to {damaged.name} and rebuilt "
            "empty. Replies are generated anew."
        )
        return self._open()

    def _guarded(self, action: str, run: Callable[[sqlite3.Connection], _T], fallback: _T) -> _T:
        """Run one cache operation; a damaged database is rebuilt, an unwritable one switched off (untouched), and
        the operation skipped, never raised."""
        with self._lock:
            try:
                return run(self._db)
            except (sqlite3.Error, OSError) as exc:
                try:
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    self._db.close()
                except sqlite3.Error:
                    pass  # the connection is dropped either way
                self._db = self._after_failure(action, exc)
                return fallback

    def get(self, key: str) -> CachedReply | None:
        def read(db: sqlite3.Connection) -> CachedReply | None:
            row = db.execute(
                "SELECT pieces, finish_reason, generated_tokens, checksum FROM replies WHERE key = ?", (key,)
            ).fetchone()
            if row is None:
                return None
            pieces, finish_reason, generated_tokens, checksum = row
            try:
                valid = checksum == _entry_checksum(key, pieces, finish_reason, generated_tokens)
                reply = CachedReply(json.loads(pieces), finish_reason, generated_tokens) if valid else None
            except (TypeError, ValueError):
                reply = None
            if reply is None or not all(isinstance(piece, str) for piece in reply.pieces):
                db.execute("DELETE FROM replies WHERE key = ?", (key,))
                self.notices.append(f"A damaged entry in the response cache {self.path} was dropped, not replayed.")
                return None
            db.execute("UPDATE replies SET last_used = ? WHERE key = ?", (time.time(), key))
            return reply

        return self._guarded("reading", read, None)

    def put(self, key: str, reply: CachedReply) -> None:
        pieces = json.dumps(reply.pieces)
        checksum = _entry_checksum(key, pieces, reply.finish_reason, reply.generated_tokens)

        def write(db: sqlite3.Connection) -> None:
            db.execute("BEGIN")
            db.execute(
                "INSERT OR REPLACE INTO replies VALUES (?, ?, ?, ?, ?, ?)",
                (key, pieces, reply.finish_reason, reply.generated_tokens, time.time(), checksum),
            )
            db.execute(
                "DELETE FROM replies WHERE key IN (SELECT key FROM replies ORDER BY last_used DESC LIMIT -1 OFFSET ?)",
                (self.max_entries,),
            )
            db.execute("COMMIT")

        self._guarded("writing", write, None)

    def take_notices(self) -> list[str]:
        """Notices not yet shown (each is shown once)."""
        with self._lock:
            taken, self.notices = self.notices, []
        return taken

    def __len__(self) -> int:
        return self._guarded("counting", lambda db: int(db.execute("SELECT COUNT(*) FROM replies").fetchone()[0]), 0)

    def clear(self) -> None:
        self._guarded("clearing", lambda db: db.execute("DELETE FROM replies"), None)

    def close(self) -> None:
        with self._lock:
            self._db.close()
