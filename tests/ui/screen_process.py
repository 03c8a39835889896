"""Run the real `hearth-gui` entry point in a process of its own on an offscreen screen of a given size, and read
what the window did there."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.helpers.gui_process import offscreen_screen, run_gui_and_probe


def run_gui_on_screen(home: Path, width: int, height: int, probe: str) -> subprocess.CompletedProcess[str]:
    """run_gui_and_probe on a width x height screen, the probe once the window is shown and fitted (700 ms in)."""
    return run_gui_and_probe(home, probe, platform=offscreen_screen(home.parent, width, height), after_ms=700)
