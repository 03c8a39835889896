"""Exact reads at a file offset, for weight rows read while a model is loaded (never through a map: a page fault
there makes the pages around it resident too). Torch-free: the torch path's RowFile and the torch-free runtime's
embedding rows both read through it."""

from __future__ import annotations

import io
import os
import threading
from pathlib import Path


class RowReadError(RuntimeError):
    """The weight file no longer holds what was loaded (changed, cut short or removed while the model was open)."""


def read_exactly_at(handle: io.BufferedReader, lock: threading.Lock, path: Path, offset: int, view: memoryview) -> None:
    """Fill `view` from `offset` of the open file: `preadv` where the OS has it, else a seek and read under `lock`
    (Windows)."""
    try:
        if hasattr(os, "preadv"):
            count = os.preadv(handle.fileno(), [view], offset)
        else:
            with lock:
                handle.seek(offset)
                count = handle.readinto(view)
    except OSError as exc:
        raise RowReadError(f"{path} could not be read while the model was loaded ({exc})") from exc
    if count != len(view):
        raise RowReadError(f"{path} was cut short while the model was loaded (a row read {count} bytes)")
