"""Screens a person can look at: the main window (empty, streaming, a long conversation, editing a message, with the
server panel, with attachments) and every dialog, rendered with the real widgets and the built-in model, on a
1366x768 laptop screen and a 960x600 half screen, to PNGs under docs/screens/.

Run: `make screens` (or `python bench/screens.py [--sizes 1366x768] [--scripted]`). Each screen size runs in a
process of its own on Qt's offscreen platform configured with a screen of that size, so the window opens and fits as
it would there. After each PNG the layout audit (tests/ui/layout_audit.py) lists overlapping widgets, cut text and
windows that do not fit their screen; it is no substitute for looking at the PNGs.

--scripted uses a scripted model (seconds, for working on the layout); the committed PNGs use the real one.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.helpers.gui_process import offscreen_screen  # noqa: E402

SIZES = ("1366x768", "960x600")
OUT = REPO / "docs" / "screens"
QUESTIONS = (
    "What is a KV cache, in two short paragraphs?",
    "Write a Python function that adds two numbers.",
    "Give me three tips for writing clear emails.",
)


SCRATCH_ENV = "HEARTH_SCREENS_SCRATCH"  # where a child writes the files it attaches (its parent removes the folder)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), help="screen sizes, WxH (default: both)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--scripted", action="store_true", help="a scripted model instead of the built-in one")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one screen size, in this process
    args = parser.parse_args()
    if args.child:
        return ScreenRun(args.child, args.out, scripted=args.scripted).run()
    args.out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for size in args.sizes:
        with tempfile.TemporaryDirectory(prefix="hearth-screens-") as folder:
            env = {
                **os.environ,
                "QT_QPA_PLATFORM": offscreen_screen(Path(folder), *(int(n) for n in size.split("x"))),
                "HEARTH_HOME": str(Path(folder) / "home"),  # a new user: no settings, history or engines
                SCRATCH_ENV: folder,  # the child's dragged files: removed with the folder
                "HEARTH_CACHE_DIR": os.environ.get("HEARTH_CACHE_DIR", str(REPO / ".cache" / "test-models")),
                "HF_HUB_OFFLINE": "1",
                "TQDM_DISABLE": "1",
            }
            command = [sys.executable, __file__, "--child", size, "--out", str(args.out)]
            command += ["--scripted"] if args.scripted else []
            failed |= subprocess.run(command, env=env, check=False).returncode
    return failed


class ScreenRun:
    """The screens of one screen size, in this process (its QApplication is on that offscreen screen)."""

    def __init__(self, size: str, out: Path, *, scripted: bool) -> None:
        from PySide6.QtWidgets import QApplication

        self.size, self.out, self.scripted = size, out, scripted
        self.app = QApplication.instance() or QApplication([sys.argv[0]])
        self.problems: dict[str, list[str]] = {}
        self.scratch = Path(os.environ.get(SCRATCH_ENV) or tempfile.mkdtemp(prefix="hearth-screens-"))

    # -- helpers ---------------------------------------------------------------------------------------------
    def wait_until(self, done: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.size}: timed out waiting for {what}")
            self.app.processEvents()
            time.sleep(0.01)

    def settle(self, seconds: float = 0.3) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.app.processEvents()
            time.sleep(0.01)

    def shoot(self, name: str, widget: Any) -> None:
        """`widget` (a window or dialog, shown) to docs/screens/NAME-SIZE.png, and its audit."""
        from tests.ui.layout_audit import fits, problems

        self.settle()
        found = problems(widget)
        available = self.app.primaryScreen().availableGeometry()
        if not fits(widget, available):
            found.insert(0, f"does not fit the screen: {widget.frameGeometry()} in {available}")
        path = self.out / f"{name}-{self.size}.png"
        save_png(widget.grab().toImage(), path)
        self.problems[path.name] = found
        state = "ok" if not found else f"{len(found)} problem(s)"
        print(f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}: {state}", flush=True)
        for line in found:
            print(f"    {line}", flush=True)

    # -- the run ---------------------------------------------------------------------------------------------
    def run(self) -> int:
        from app.core.chat.sampling import SamplingParams
        from app.core.engines.backend import ScriptedBackend, scripted_factory
        from app.core.settings import Settings
        from app.ui import theme
        from app.ui.main_window import MainWindow

        theme.apply(self.app, "light")
        # Greedy replies, each generated (no response cache: the screens show real figures, and the cache the tests
        # share is left alone)
        settings = Settings(sampling=SamplingParams(temperature=0.0, max_new_tokens=96), response_cache=False)
        factory = None
        if self.scripted:
            replies = [f"A scripted reply to question {i + 1}. " * 12 for i in range(8)]
            factory = scripted_factory(ScriptedBackend(replies=replies, name="SmolLM2-135M-Instruct", tokens_per_s=40))
        window = MainWindow(settings, backend_factory=factory, save_settings_to_disk=False)
        window.show()
        self.window = window
        self.wait_until(lambda: window.model_info is not None, 600, "the built-in model to load")
        self.settle(1.0)  # the first memory reading and the plan
        self.shoot("main-empty", window)

        window.chat.send(QUESTIONS[0])
        self.wait_until(lambda: self._streamed() > 120, 300, "the reply to stream")
        self.shoot("main-streaming", window)
        self._wait_reply()
        for question in QUESTIONS[1:]:
            window.chat.send(question)
            self._wait_reply()
        self.shoot("main-long", window)

        first = window.chat_view.widgets()[0]
        window.chat_view.ensureWidgetVisible(first)
        first.edit_button.click()
        self.shoot("main-editing", window)
        first._end_edit()

        self._attachments()
        self.shoot("main-attachments", window)
        window.attachments.clear()
        window.attachments.set_destination(None)
        window.input_box.editor.clear()

        address = self._serve()
        self.shoot("main-server", window)

        self._dialogs(address)
        window.panels.server_action.setChecked(False)
        window.close()
        (self.out / f"audit-{self.size}.json").write_text(json.dumps(self.problems, indent=1) + "\n")
        return 0

    def _streamed(self) -> int:
        items = self.window.chat_model.items()
        return len(items[-1].content) if items and items[-1].role == "assistant" else 0

    def _wait_reply(self) -> None:
        self.wait_until(lambda: self.window.chat.reply is None, 600, "the reply to finish")
        self.settle(0.3)

    def _attachments(self) -> None:
        """Two files, one of them a link to a file elsewhere, with a remote engine named as their destination."""
        folder = Path(tempfile.mkdtemp(prefix="attach-", dir=self.scratch))
        (folder / "meeting-notes.md").write_text("# Notes\n\nShip on Friday.\n" * 40, encoding="utf-8")
        elsewhere = Path(tempfile.mkdtemp(prefix="elsewhere-", dir=self.scratch)) / "budget-2027.csv"
        elsewhere.write_text("item,cost\nlaptop,1200\n" * 30, encoding="utf-8")
        (folder / "budget.csv").symlink_to(elsewhere)
        bar = self.window.attachments
        bar.add_paths([folder / "meeting-notes.md", folder / "budget.csv"])
        self.wait_until(lambda: not bar.busy, 60, "the attachments to be read")
        # What the window shows when a remote engine is loaded (its destination line); the engine itself is not
        # needed to draw it.
        bar.set_destination("engine gpu-box (http://10.0.0.5:8000/v1)")
        self.window.input_box.editor.setPlainText("Summarise these two files.")

    def _serve(self) -> str:
        window = self.window
        window.panels.server_action.setChecked(True)
        panel = window.server_panel
        panel.port.setValue(0)  # any free port: 8080 may be taken on this machine
        panel.switch.setChecked(True)
        self.wait_until(lambda: panel.state == "on" or panel.status.text() != "Starting…", 60, "the server")
        if panel.state != "on":
            raise RuntimeError(f"the server did not start: {panel.status.text()}")
        address = panel.address.text()

        def ask() -> None:
            message = {"role": "user", "content": "Say hello."}
            body = json.dumps({"model": "hearth", "messages": [message], "max_tokens": 16})
            request = urllib.request.Request(
                f"{address}/chat/completions", body.encode(), {"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=120) as response:
                response.read()

        thread = threading.Thread(target=ask)
        thread.start()
        self.wait_until(lambda: panel.log_table.rowCount() > 0, 180, "a request in the server log")
        thread.join(30)
        return address

    def _dialogs(self, address: str) -> None:
        from app.core.documents import FitDecision, extract_document
        from app.ui.attachment_chip import FitChoiceDialog
        from app.ui.connections import ConnectionsDialog
        from app.ui.settings_dialog import SettingsDialog

        window = self.window
        dialog: Any = SettingsDialog(window.settings, window)
        dialog.show()
        self.shoot("dialog-settings", dialog)
        dialog.tabs.setCurrentIndex(1)  # Sampling, with the prompt-lookup switch
        self.shoot("dialog-settings-sampling", dialog)
        dialog.reject()

        window.open_library()
        library = window.library_window
        self.wait_until(lambda: not library._tasks.busy, 300, "the library's listing and verdicts")
        self.shoot("dialog-library", library)
        library.tabs.setCurrentIndex(1)
        self.shoot("dialog-library-recommended", library)
        download = library.open_download("Qwen/Qwen2.5-0.5B-Instruct")
        assert download is not None
        self.wait_until(lambda: download.state == "failed", 60, "the offline download to fail")
        self.shoot("dialog-download-offline", download)
        download.reject()
        library.close()

        window.remote.open_connections()
        connections = window.remote.dialog
        assert connections is not None
        self.shoot("dialog-connections", connections)
        connections.name.setText("this-computer")
        connections.url.setText(address)
        connections.test_connection()
        self.wait_until(lambda: not connections._tasks.busy, 120, "the connection test")
        self.shoot("dialog-connections-tested", connections)
        connections.reject()
        assert isinstance(connections, ConnectionsDialog)

        notes = Path(tempfile.mkdtemp(prefix="fit-", dir=self.scratch)) / "handbook.md"
        notes.write_text("A long handbook.\n" * 400, encoding="utf-8")
        document = extract_document(notes)
        decision = FitDecision(document_tokens=(6_400,), question_tokens=12, remaining_tokens=2_000)
        fit = FitChoiceDialog(decision, [document], window)
        fit.show()
        self.shoot("dialog-fit", fit)
        fit.reject()


def save_png(image: Any, path: Path) -> None:
    """A small PNG: a 256-colour palette (flat UI colours survive it) where Pillow is installed, else Qt's PNG."""
    from PySide6.QtCore import QBuffer, QIODevice

    buffer = QBuffer()
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buffer, "PNG")
    data = bytes(buffer.data().data())
    try:
        from PIL import Image
    except ImportError:
        path.write_bytes(data)
        return
    picture = Image.open(io.BytesIO(data)).convert("RGB")
    picture.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(path, optimize=True)


if __name__ == "__main__":
    raise SystemExit(main())
