"""Entry point of the frozen bundle: the window when started with no arguments (a double-click), the command line
when given any (`hearth chat …`, `hearth --self-test`).

A single argument naming an existing .gguf file (a file manager's "Open with Hearth", the .desktop entry's %f)
opens the window with that model: the launcher passes it in HEARTH_OPEN_MODEL. Without the window in the build,
it starts the command-line chat with `--model FILE`.

HEARTH_QUIT_AFTER_MS=N asks a started window to quit after N milliseconds (packaging tests start the installed
window offscreen this way); the GUI may honour it itself, and the launcher requests the quit too, so either works.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import sys
import threading
from collections.abc import Sequence
from typing import Literal

QUIT_AFTER_ENV = "HEARTH_QUIT_AFTER_MS"
OPEN_MODEL_ENV = "HEARTH_OPEN_MODEL"

Entry = Literal["gui", "cli"]


def gui_available() -> bool:
    """The desktop app is in this build (it may not be yet: then a double-click opens the command-line chat)."""
    try:
        return importlib.util.find_spec("app.gui") is not None
    except ImportError:
        return False


def model_file_argument(argv: Sequence[str]) -> str | None:
    """The one .gguf file a file manager passes when the user opens a model with Hearth, else None."""
    if len(argv) == 1 and argv[0].lower().endswith(".gguf") and os.path.isfile(argv[0]):
        return os.path.abspath(argv[0])
    return None


def choose_entry(argv: Sequence[str], has_gui: bool) -> Entry:
    opens_window = not argv or model_file_argument(argv) is not None
    return "gui" if opens_window and has_gui else "cli"


def quit_after_ms() -> int | None:
    raw = os.environ.get(QUIT_AFTER_ENV, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        print(f"hearth: {QUIT_AFTER_ENV} must be a number of milliseconds, not {raw!r}.", file=sys.stderr)
        raise SystemExit(2) from None
    return max(value, 0)


def request_quit_later(delay_ms: int, *, keep_asking_s: float = 30.0) -> threading.Thread:
    """Ask the Qt event loop to quit after the delay; a queued call is the thread-safe way in. The app may still
    be starting then (imports, first paint), so the request repeats for `keep_asking_s` seconds."""

    def wait_then_quit() -> None:
        threading.Event().wait(delay_ms / 1000)
        from PySide6.QtCore import QCoreApplication, QMetaObject, Qt

        asked_for = 0.0
        while True:
            app = QCoreApplication.instance()
            if app is not None:
                QMetaObject.invokeMethod(app, "quit", Qt.ConnectionType.QueuedConnection)
            if asked_for >= keep_asking_s:
                return
            threading.Event().wait(0.5)
            asked_for += 0.5

    thread = threading.Thread(target=wait_then_quit, name="hearth-quit-after", daemon=True)
    thread.start()
    return thread


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    model_file = model_file_argument(args)
    if choose_entry(args, gui_available()) == "gui":
        if model_file is not None:
            os.environ[OPEN_MODEL_ENV] = model_file
            sys.argv = sys.argv[:1]  # the window's own argument parsing sees a plain start
        delay = quit_after_ms()
        if delay is not None:
            request_quit_later(delay)
        from app.gui import main as gui_main

        return int(gui_main() or 0)
    from app.cli import main as cli_main

    if model_file is not None:
        args = ["chat", "--model", model_file]
    return cli_main(args)


if __name__ == "__main__":
    multiprocessing.freeze_support()  # a frozen Windows build re-executes itself for child processes
    raise SystemExit(main())
