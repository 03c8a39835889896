"""The one error path: uncaught exceptions (any thread) go to a rotating log file and to one callback.

Qt-free: the GUI passes a callback that shows a dialog; the command line can pass one that prints.
"""

from __future__ import annotations

import logging
import sys
import threading
import traceback
from collections.abc import Callable
from logging.handlers import RotatingFileHandler
from pathlib import Path
from types import TracebackType

from app.core.errors import HearthError
from app.core.storage import paths, secrets

log = logging.getLogger("hearth.crash")

ErrorCallback = Callable[[str, str], None]  # (one-line message for the user, full traceback for details)

LOG_FILE_NAME = "hearth.log"
LOG_MAX_BYTES = 1_000_000
LOG_BACKUPS = 3


def setup_logging(level: int = logging.INFO) -> Path:
    """Send the root logger to a rotating file under the log dir (once); returns the file's path."""
    path = paths.log_dir() / LOG_FILE_NAME
    root = logging.getLogger()
    for handler in root.handlers:
        if isinstance(handler, RotatingFileHandler) and Path(handler.baseFilename) == path:
            return path
    secrets.install_log_redaction()  # a Hub token must never reach the log file
    handler = RotatingFileHandler(path, maxBytes=LOG_MAX_BYTES, backupCount=LOG_BACKUPS, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s"))
    root.addHandler(handler)
    if root.level == logging.NOTSET or root.level > level:
        root.setLevel(level)
    return path


def user_message(exc: BaseException) -> str:
    """What the user sees: a HearthError's own sentence, otherwise the exception's type and text."""
    if isinstance(exc, HearthError):
        return str(exc)
    text = str(exc).strip()
    return f"Unexpected error: {type(exc).__name__}" + (f": {text}" if text else "")


class CrashHandler:
    """Installs sys.excepthook and threading.excepthook; `uninstall()` restores the previous hooks."""

    def __init__(self, callback: ErrorCallback) -> None:
        self.callback = callback
        self._previous_sys = sys.excepthook
        self._previous_threading = threading.excepthook
        self.installed = False

    def install(self) -> CrashHandler:
        setup_logging()
        sys.excepthook = self._sys_hook
        threading.excepthook = self._thread_hook
        self.installed = True
        return self

    def uninstall(self) -> None:
        if self.installed:
            sys.excepthook = self._previous_sys
            threading.excepthook = self._previous_threading
            self.installed = False

    def handle(self, exc: BaseException, where: str = "main thread") -> None:
        details = secrets.redact("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
        if isinstance(exc, HearthError):
            log.warning("%s (%s)", exc, where)
        else:
            log.error("uncaught exception in %s\n%s", where, details)
        try:
            self.callback(secrets.redact(user_message(exc)), details)
        except Exception:  # the reporter must never raise from inside a hook
            log.exception("error callback failed")

    def _sys_hook(self, kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if issubclass(kind, KeyboardInterrupt):
            self._previous_sys(kind, exc, tb)
            return
        self.handle(exc.with_traceback(tb))

    def _thread_hook(self, args: threading.ExceptHookArgs) -> None:
        if args.exc_value is None or issubclass(args.exc_type, SystemExit):
            return
        name = args.thread.name if args.thread is not None else "a thread"
        self.handle(args.exc_value, where=f"thread {name}")


def install_hooks(callback: ErrorCallback) -> CrashHandler:
    return CrashHandler(callback).install()
