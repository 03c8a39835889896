"""Run the real `hearth-gui` entry point in its own process, offscreen (on a screen of a given size where asked: Qt's
offscreen platform reads the screens from a JSON file), and read the window it opened."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def offscreen_screen(folder: Path, width: int, height: int) -> str:
    """QT_QPA_PLATFORM for one offscreen screen of width x height at 96 dpi (its JSON written into `folder`)."""
    config = folder / f"screen-{width}x{height}.json"
    screen = {"name": f"screen-{width}x{height}", "x": 0, "y": 0, "width": width, "height": height}
    config.write_text(json.dumps({"screens": [{**screen, "logicalDpi": 96, "logicalBaseDpi": 96, "dpr": 1}]}))
    return f"offscreen:configfile={config}"


def run_gui_and_probe(
    home: Path, probe: str, *, platform: str = "offscreen", after_ms: int = 500
) -> subprocess.CompletedProcess[str]:
    """Start `gui.main(['--no-autoload'])` with HEARTH_HOME=home on `platform`; `after_ms` in, `probe` (Python lines
    with the main window bound to `w`, the application to `app`) prints what the test reads, then the window closes
    (saving its geometry)."""
    body = "".join(f"    {line}\n" for line in probe.strip().splitlines())
    code = (
        "import sys; from PySide6.QtCore import QTimer; from PySide6.QtWidgets import QApplication\n"
        "app = QApplication([])\n"
        "import app.gui as gui\n"
        "from app.ui.main_window import MainWindow\n"
        "def check():\n"
        "    w = next(x for x in app.topLevelWidgets() if isinstance(x, MainWindow))\n"
        f"{body}"
        "    w.close()\n"
        f"QTimer.singleShot({after_ms}, check)\n"
        "sys.exit(gui.main(['--no-autoload']))\n"
    )
    env = {**os.environ, "HEARTH_HOME": str(home), "QT_QPA_PLATFORM": platform}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False
    )
