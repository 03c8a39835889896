"""A full disk is a full disk: told as such (which folder, how much is free), never taken for a damaged file.

SQLite reports a write that found no space as SQLITE_FULL ("database or disk is full"), an OS call as ENOSPC (or
EDQUOT, a quota). Neither says anything about the file being written: it is healthy, and it must never be renamed,
moved aside or rebuilt because of it. Only SQLITE_CORRUPT and SQLITE_NOTADB say a file is damaged.
"""

from __future__ import annotations

import errno
import shutil
import sqlite3
from pathlib import Path

from app.core.errors import HearthError

DISK_FULL_ERRNOS = frozenset(code for code in (errno.ENOSPC, getattr(errno, "EDQUOT", None)) if code is not None)
_SQLITE_FULL = 13
_SQLITE_CORRUPT = 11
_SQLITE_NOTADB = 26
NEARLY_FULL_BYTES = 2**20  # less free than this, and a failed write is put down to the full disk
SPARE_BYTES = 64 * 2**20  # what a large write leaves free for everything else (the history, the logs)


def format_size(size: int | float) -> str:
    value = float(size)
    for unit in ("bytes", "KB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit in ("bytes", "KB") else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"  # pragma: no cover - the loop always returns


def free_bytes(folder: Path) -> int | None:
    """Bytes free for this user in the file system holding `folder` (its nearest existing parent); None if unknown."""
    path = Path(folder)
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def where_full(folder: Path) -> str:
    """'the disk holding FOLDER is full (12 KB free)'."""
    free = free_bytes(folder)
    shown = f"{format_size(free)} free" if free is not None else "free space unknown"
    return f"the disk holding {folder} is full ({shown})"


def is_disk_full(exc: BaseException) -> bool:
    """Whether `exc` (an OSError or a sqlite3 error, or one caused by them) says the disk or a quota is full."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in DISK_FULL_ERRNOS:
            return True
        if isinstance(current, sqlite3.Error):
            code = getattr(current, "sqlite_errorcode", None)
            if (code is not None and code & 0xFF == _SQLITE_FULL) or "disk is full" in str(current):
                return True
        current = current.__cause__ or current.__context__
    return False


def failed_for_space(exc: BaseException, folder: Path) -> bool:
    """Whether a failed write into `folder` was for want of space: said so by the error, or (SQLite reports a full
    disk met while growing its shared-memory file as a plain 'disk I/O error') the disk has next to nothing free."""
    if is_disk_full(exc):
        return True
    free = free_bytes(folder)
    return free is not None and free < NEARLY_FULL_BYTES


SQLITE_HEADER = b"SQLite format 3\x00"


def holds_other_than_sqlite(path: Path) -> bool:
    """Whether `path` holds bytes that are not an SQLite database, by the file's own header (a missing or empty file
    does not: SQLite makes it one). Checked before connecting: a WAL left by a process that ended without closing
    supplies every page it wrote, so a damaged main file beside it would otherwise open as if healthy. OSError when
    the file can't be read."""
    if not path.exists() or path.stat().st_size == 0:
        return False
    with path.open("rb") as handle:
        return handle.read(len(SQLITE_HEADER)) != SQLITE_HEADER


def is_damaged_database(exc: sqlite3.Error) -> bool:
    """Whether a sqlite3 error says the file itself is damaged or not a database (the only reasons to set a file
    aside); locked, read-only, full or unopenable files are not damaged."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (_SQLITE_CORRUPT, _SQLITE_NOTADB)
    text = str(exc)
    return "malformed" in text or "not a database" in text


class DiskFullError(HearthError):
    """There is not enough space to write something; nothing partial was left behind."""

    def __init__(self, folder: Path, what: str, needed: int | None = None, free: int | None = None) -> None:
        self.folder = folder
        self.needed = needed
        self.free = free if free is not None else free_bytes(folder)
        have = f"{format_size(self.free)} free" if self.free is not None else "free space unknown"
        need = f"needs {format_size(needed)}, " if needed is not None else ""
        super().__init__(
            f"Not enough disk space for {what} in {folder}: {need}{have}. Nothing was left half-written; free some "
            "space (or point HEARTH_CACHE_DIR at a larger disk) and try again."
        )


def check_space(folder: Path, needed: int, what: str, spare: int = SPARE_BYTES) -> None:
    """Raise DiskFullError before writing `needed` bytes into `folder` when the disk would keep less than `spare`."""
    free = free_bytes(folder)
    if free is not None and free < needed + spare:
        raise DiskFullError(folder, what, needed, free)
