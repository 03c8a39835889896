"""Files and folders Hearth writes before moving them into place, named for the process that writes them, so what a
killed process left behind can be found and removed.

A cache entry is written in full under a temporary name, then renamed: a reader never sees half of it. But a process
killed mid-write (`kill -9`, a power cut) leaves the temporary copy forever, hundreds of MB for a model. So each one
is named for its owner, the process id and its start time (a pid alone is reused):

    NAME.<pid>-<start>.partial          a file being written (partial_path, writing)
    .staging-<label>-<pid>-<start>/     a folder being filled (staging_folder)

`find_leftovers` lists those whose owner is gone, `sweep` removes them (every start does, in the cache and settings
folders, see `sweep_at_start`; `hearth models --cache` shows and reclaims them). Older names are understood too:
`NAME.<pid>.partial` (owner gone when the pid is; when a live process has the pid, gone only once the file is an hour
untouched) and the GGUF conversion's `.convert-XXXX/` folders (no owner recorded: gone once an hour untouched).
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from app.core.storage import paths

log = logging.getLogger(__name__)

PARTIAL_SUFFIX = ".partial"
STAGING_PREFIX = ".staging-"
UNOWNED_PREFIXES = (".convert-",)  # staging folders of older versions, named with no owner
ABANDONED_AFTER_S = 3600.0  # an ownerless leftover untouched this long is abandoned
SEARCH_DEPTH = 3  # cache/KIND/FILE and cache/converted/.convert-x/...: deeper is inside a leftover or a model
START_TOLERANCE_MS = 2000  # two readings of one process's start time differ by less than this

_PARTIAL = re.compile(r"\.(\d+)(?:-(\d+))?\.partial$")
_STAGING = re.compile(r"^\.staging-.*-(\d+)-(\d+)$")
_swept = threading.Event()


def _start_ms(pid: int) -> int | None:
    """When process `pid` started, in ms since the epoch; None when there is no such process (or no way to ask)."""
    import psutil

    try:
        return int(psutil.Process(pid).create_time() * 1000)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    except psutil.Error:  # it exists but can't be asked (another user's): call it the same one
        return -1


def owner_tag() -> str:
    """'<pid>-<start ms>' for this process."""
    pid = os.getpid()
    return f"{pid}-{_start_ms(pid) or 0}"


def partial_path(final: Path) -> Path:
    """Where to write `final` before renaming it into place: FINAL.<pid>-<start>.partial, beside it."""
    return final.with_name(f"{final.name}.{owner_tag()}{PARTIAL_SUFFIX}")


@contextmanager
def writing(final: Path) -> Iterator[Path]:
    """The partial path to write `final` to; removed if the block fails (the caller renames it into place)."""
    partial = partial_path(final)
    try:
        yield partial
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def write_atomically(final: Path, data: bytes) -> None:
    """`data` into `final` whole or not at all: written under a partial name of this process (NAME.<random>.<pid>-
    <start>.partial: the random part for two threads writing one file), fsynced, renamed into place; removed on any
    failure, and swept at a later start if the process is killed mid-write."""
    with writing(final.with_name(f"{final.name}.{secrets.token_hex(4)}")) as partial:
        with open(partial, "xb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, final)


@contextmanager
def staging_folder(parent: Path, label: str) -> Iterator[Path]:
    """A new folder .staging-<label>-<pid>-<start> in `parent` to fill, removed with what is in it if the block
    fails (the caller renames it into place when done)."""
    parent.mkdir(parents=True, exist_ok=True)
    folder = parent / f"{STAGING_PREFIX}{label}-{owner_tag()}"
    shutil.rmtree(folder, ignore_errors=True)  # this very process's earlier attempt
    folder.mkdir()
    try:
        yield folder
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


@dataclass(frozen=True)
class Leftover:
    path: Path
    size_bytes: int
    why: str  # "its process (pid 4242) has ended"


def _owner_gone(pid: int, start: int | None, touched_s: float) -> str:
    """Why the owner is gone, or "" while it may still be writing."""
    now_start = _start_ms(pid)
    if now_start is None:
        return f"its process (pid {pid}) has ended"
    if start is None:  # an older name: the pid may belong to another process by now
        return f"untouched for {touched_s / 3600:.1f} h" if touched_s >= ABANDONED_AFTER_S else ""
    if now_start != -1 and abs(now_start - start) > START_TOLERANCE_MS:
        return f"its process (pid {pid}) has ended (the pid now belongs to another)"
    return ""


def _size_and_age(path: Path) -> tuple[int, float]:
    """Bytes under `path` and seconds since anything in it was last written."""
    try:
        if not path.is_dir():
            stat = path.stat()
            return stat.st_size, time.time() - stat.st_mtime
        size, newest = 0, path.stat().st_mtime
        for dirpath, _, files in os.walk(path):
            for name in files:
                stat = Path(dirpath, name).stat()
                size += stat.st_size
                newest = max(newest, stat.st_mtime)
        return size, time.time() - newest
    except OSError:
        return 0, 0.0


def _judge(path: Path) -> Leftover | None:
    name = path.name
    pid_start: tuple[int, int | None] | None = None
    if (found := _PARTIAL.search(name)) and not path.is_dir():
        pid_start = int(found.group(1)), int(found.group(2)) if found.group(2) else None
    elif (found := _STAGING.match(name)) and path.is_dir():
        pid_start = int(found.group(1)), int(found.group(2))
    elif not name.startswith(UNOWNED_PREFIXES) or not path.is_dir():
        return None
    size, age = _size_and_age(path)
    if pid_start is None:
        why = f"left by an interrupted conversion, untouched for {age / 3600:.1f} h" if age >= ABANDONED_AFTER_S else ""
    else:
        why = _owner_gone(pid_start[0], pid_start[1], age)
    return Leftover(path, size, why) if why else None


def find_leftovers(root: Path | None = None) -> list[Leftover]:
    """Partial files and staging folders under `root` (default: the cache folder) whose owner is gone."""
    root = root if root is not None else paths.cache_dir()
    found: list[Leftover] = []

    def visit(folder: Path, depth: int) -> None:
        try:
            entries = sorted(folder.iterdir())
        except OSError:
            return
        for entry in entries:
            if entry.is_symlink():
                continue  # never follow a link out of the cache
            leftover = _judge(entry)
            if leftover is not None:
                found.append(leftover)
            elif entry.is_dir() and depth < SEARCH_DEPTH and not _is_in_progress(entry):
                visit(entry, depth + 1)

    visit(root, 1)
    return found


def _is_in_progress(folder: Path) -> bool:
    """A staging folder whose owner is alive: its content is its owner's, not to be looked into."""
    return folder.name.startswith((STAGING_PREFIX, *UNOWNED_PREFIXES))


def remove(leftovers: list[Leftover]) -> list[Leftover]:
    """Remove `leftovers` (judged again first: an owner may have finished meanwhile); the ones removed."""
    removed = []
    for leftover in leftovers:
        again = _judge(leftover.path)
        if again is None:
            continue
        try:
            if leftover.path.is_dir():
                shutil.rmtree(leftover.path)
            else:
                leftover.path.unlink()
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("could not remove the leftover %s: %s", leftover.path, exc)
            continue
        log.info("removed %s (%d bytes): %s", leftover.path, again.size_bytes, again.why)
        removed.append(again)
    return removed


def sweep(root: Path | None = None) -> list[Leftover]:
    """Remove what killed processes left under `root` (default: the cache folder); the leftovers removed."""
    return remove(find_leftovers(root))


def sweep_at_start() -> list[Leftover]:
    """`sweep` once per process, the cache folder and the settings folder (a settings or engines file being written
    when its process was killed), never raising (a start must not fail over a leftover it could not remove)."""
    if _swept.is_set():
        return []
    _swept.set()
    removed: list[Leftover] = []
    for folder in (paths.cache_dir, paths.config_dir):
        try:
            removed += sweep(folder())
        except Exception:
            log.exception("sweeping %s for leftovers failed", folder.__name__)
    return removed
