"""Lines of Python run in a fresh interpreter, for the tests of what a path imports: torch and transformers cost
seconds and the gguf package ~30 ms, so a path that must not need them is checked where nothing is imported yet."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WATCHED = ("torch", "transformers", "gguf")
_MARKER = "--imported--"


@dataclass(frozen=True)
class FreshRun:
    out: str  # what the lines printed, stripped
    err: str
    imported: frozenset[str]  # which of WATCHED they imported


def run_fresh(code: str, *, timeout: float = 300) -> FreshRun:
    """`code` in a fresh `python -c` from the repository's root, which must exit 0 (its stderr in the failure)."""
    script = f"{code}\nimport sys as _sys\nprint({_MARKER!r}, *[m for m in {WATCHED!r} if m in _sys.modules])\n"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    out, _, imported = done.stdout.rpartition(_MARKER)
    return FreshRun(out.strip(), done.stderr.strip(), frozenset(imported.split()))
