"""The window's history file: opened so that the window always starts, and replaced only when the user asks.

A file that cannot be used is never modified: the window keeps its conversations in memory and says so (the banner
offers to move a damaged file aside); a new file starts with this window's conversations.
"""

from __future__ import annotations

import logging
from pathlib import Path

from app.core.storage.history import HistoryError, HistoryStore

log = logging.getLogger(__name__)


def open_history(path: Path) -> tuple[HistoryStore, HistoryError | None]:
    """The history at `path`, or, when that file cannot be used, a store in memory and why."""
    store: HistoryStore | None = None
    try:
        store = HistoryStore(path)
        store.list_conversations()  # a file damaged past its header fails here, not in the middle of a chat
        return store, None
    except HistoryError as exc:
        if store is not None:
            store.close()
        log.warning("history unavailable: %s", exc)
        return HistoryStore(path, in_memory=True), exc


def start_new_history_file(store: HistoryStore) -> tuple[HistoryStore, Path]:
    """Move the unusable file aside (never deleted), write `store`'s conversations to a new file in its place;
    the new store and where the old file went. Raises OSError or HistoryError."""
    path = store.path
    old = HistoryStore.move_aside(path)
    store.copy_into(path)
    return HistoryStore(path), old
