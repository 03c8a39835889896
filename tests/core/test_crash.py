"""The one error path: uncaught exceptions from any thread reach the callback and the rotating log file."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from app.core.crash import LOG_FILE_NAME, install_hooks, user_message
from app.core.errors import ContextOverflowError
from app.core.storage import paths


def test_main_thread_and_worker_thread_errors_reach_callback_and_log(hearth_home: Path) -> None:
    seen: list[tuple[str, str]] = []
    handler = install_hooks(lambda message, details: seen.append((message, details)))
    try:
        try:
            raise ValueError("bad value")
        except ValueError as exc:
            sys.excepthook(type(exc), exc, exc.__traceback__)

        def boom() -> None:
            raise RuntimeError("worker exploded")

        thread = threading.Thread(target=boom, name="test-worker")
        thread.start()
        thread.join()
    finally:
        handler.uninstall()
    assert [m for m, _ in seen] == [
        "Unexpected error: ValueError: bad value",
        "Unexpected error: RuntimeError: worker exploded",
    ]
    assert "Traceback" in seen[1][1] and "boom" in seen[1][1]
    log_text = (paths.log_dir() / LOG_FILE_NAME).read_text(encoding="utf-8")
    assert "worker exploded" in log_text and "thread test-worker" in log_text
    assert sys.excepthook is not handler._sys_hook and threading.excepthook is not handler._thread_hook


def test_hearth_errors_are_shown_as_their_own_sentence() -> None:
    error = ContextOverflowError(5000, 2048)
    assert user_message(error) == str(error)
    assert user_message(KeyError()) == "Unexpected error: KeyError"


def test_a_failing_callback_never_raises_from_the_hook(hearth_home: Path) -> None:
    def broken(message: str, details: str) -> None:
        raise OSError("display gone")

    handler = install_hooks(broken)
    try:
        handler.handle(RuntimeError("x"))  # must not raise
    finally:
        handler.uninstall()
    assert "error callback failed" in (paths.log_dir() / LOG_FILE_NAME).read_text(encoding="utf-8")
