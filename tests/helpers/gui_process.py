"""Run the real `hearth-gui` entry point in its own process, offscreen, and read the window it opened."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_gui_and_probe(home: Path, probe: str) -> subprocess.CompletedProcess[str]:
    """Start `gui.main(['--no-autoload'])` with HEARTH_HOME=home; half a second in, `probe` (Python lines with
    the main window bound to `w`) prints what the test reads, then the window closes."""
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
        "QTimer.singleShot(500, check)\n"
        "sys.exit(gui.main(['--no-autoload']))\n"
    )
    env = {**os.environ, "HEARTH_HOME": str(home), "QT_QPA_PLATFORM": "offscreen"}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False
    )
