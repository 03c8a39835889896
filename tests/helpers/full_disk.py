"""A real, small, full file system for the full-disk faults: a tmpfs mounted for the test (as root, or where the
machine lets this user mount), filled to the last block. Where no file system can be mounted the test is skipped, and
its injected-ENOSPC twin (which always runs) stands for it."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

FILLER = "filler.bin"


def can_mount() -> bool:
    return shutil.which("mount") is not None and hasattr(os, "geteuid") and os.geteuid() == 0


@contextlib.contextmanager
def small_filesystem(mount_point: Path, size: str = "4m") -> Iterator[Path]:
    """A tmpfs of `size` at `mount_point` for the block; skips the test where it can't be mounted."""
    if not can_mount():
        pytest.skip("needs a small real file system: mounting a tmpfs needs root here")
    mount_point.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"could not mount a tmpfs: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, check=False)


def fill(folder: Path) -> Path:
    """Write a filler file in `folder` until the file system says it is full (ENOSPC); returns the filler."""
    filler = folder / FILLER
    block = b"\0" * 65536
    with filler.open("wb") as handle:
        try:
            while True:
                handle.write(block)
                handle.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    with contextlib.suppress(OSError), filler.open("ab") as handle:  # the last, smaller blocks too
        while True:
            handle.write(b"\0" * 512)
            handle.flush()
    return filler


def free_space(filler: Path) -> None:
    filler.unlink()


class FullDiskConnection:
    """A sqlite3 connection whose writes fail as SQLite fails on a full disk."""

    def __init__(self, inner: sqlite3.Connection) -> None:
        self.inner = inner

    def execute(self, sql: str, *args: Any) -> Any:
        if sql.startswith(("INSERT", "UPDATE", "DELETE", "BEGIN")):
            raise sqlite3.OperationalError("database or disk is full")
        return self.inner.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
