"""A real process killed with SIGKILL mid-write, for the tests of what such a process leaves behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def killed_mid_write(script: str, *args: str) -> list[Path]:
    """Run `script` (python -c, with `args`) until it prints, on one line, the paths it is writing, then kill it with
    SIGKILL (nothing of its own cleaned up); those paths."""
    process = subprocess.Popen(
        [sys.executable, "-c", script, *args], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    paths = [Path(word) for word in process.stdout.readline().split()]
    process.send_signal(signal.SIGKILL)
    process.wait(30)
    return paths
