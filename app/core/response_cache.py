"""Greedy replies kept on disk: asking the same again (same model, precision and prompt tokens) replays them.

The cheapest token is the one not generated. Only temperature-0 replies are stored, since only they are
deterministic. Bounded by entry count, least recently used evicted first. SQLite gives atomic writes.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core import paths

DEFAULT_MAX_ENTRIES = 2000


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


class ResponseCache:
    def __init__(self, path: Path | None = None, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        self.path = path or paths.cache_dir() / "responses.sqlite"
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS replies (key TEXT PRIMARY KEY, pieces TEXT NOT NULL, "
            "finish_reason TEXT NOT NULL, generated_tokens INTEGER NOT NULL, last_used REAL NOT NULL)"
        )

    def get(self, key: str) -> CachedReply | None:
        with self._lock:
            row = self._db.execute(
                "SELECT pieces, finish_reason, generated_tokens FROM replies WHERE key = ?", (key,)
            ).fetchone()
            if row is None:
                return None
            self._db.execute("UPDATE replies SET last_used = ? WHERE key = ?", (time.time(), key))
        return CachedReply(pieces=json.loads(row[0]), finish_reason=row[1], generated_tokens=row[2])

    def put(self, key: str, reply: CachedReply) -> None:
        with self._lock:
            self._db.execute("BEGIN")
            self._db.execute(
                "INSERT OR REPLACE INTO replies VALUES (?, ?, ?, ?, ?)",
                (key, json.dumps(reply.pieces), reply.finish_reason, reply.generated_tokens, time.time()),
            )
            self._db.execute(
                "DELETE FROM replies WHERE key IN (SELECT key FROM replies ORDER BY last_used DESC LIMIT -1 OFFSET ?)",
                (self.max_entries,),
            )
            self._db.execute("COMMIT")

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM replies").fetchone()[0])

    def clear(self) -> None:
        with self._lock:
            self._db.execute("DELETE FROM replies")

    def close(self) -> None:
        with self._lock:
            self._db.close()
