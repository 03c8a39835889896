"""`make package` for the packaging tests, started in the background as soon as the session knows it will run them.

PyInstaller over torch takes minutes of mostly one core; started at collection, niced, it runs beside the rest of the
suite instead of after it, and the first packaging test only waits for what is left. HEARTH_PACKAGE_DIST=DIR reuses a
dist/ that `make package` already built (then nothing is started).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import IO

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
BUILD_TIMEOUT_S = 3600

_build: tuple[subprocess.Popen[bytes], IO[bytes], Path] | None = None


def prebuilt() -> Path | None:
    found = os.environ.get("HEARTH_PACKAGE_DIST")
    return Path(found).resolve() if found else None


def start() -> None:
    """Start `make package` (once), at a lower priority than the tests (idle priority where the OS has it)."""
    global _build
    if _build is not None or prebuilt() is not None:
        return
    log_path = Path(tempfile.mkstemp(prefix="hearth-make-package-", suffix=".log")[1])
    log = log_path.open("wb")
    # Idle priority where the OS has it (Linux: SCHED_IDLE): the build runs only on a core no test wants. Merely niced,
    # it still took slices from tests whose torch or OpenMP teams wait at a barrier for every thread, and a test that
    # packs the default model's weights ran 1 s alone and 44 s beside the build.
    if shutil.which("chrt"):
        niced = ["chrt", "--idle", "0"]
    elif shutil.which("nice"):
        niced = ["nice", "-n", "19"]
    else:
        niced = []
    process = subprocess.Popen(
        [*niced, "make", "package"],
        cwd=REPO_ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        # A process group of its own (stopped as one if the session ends first), in pytest's session: with the
        # scheduler's autogroup (on by default with most Linux kernels) a new session would be a task group of its
        # own, weighed against the tests' group as an equal whatever its priority inside, and the tests would get
        # half the CPU while it runs (measured: a torch engine test 26 s beside it, 7 s alone).
        process_group=0,
    )
    _build = (process, log, log_path)


def finish() -> Path:
    """The built dist/ folder, waiting for the build (starting it if nothing did); fails with the build's log."""
    ready = prebuilt()
    if ready is not None:
        return ready
    start()
    assert _build is not None
    process, log, log_path = _build
    code = process.wait(timeout=BUILD_TIMEOUT_S)
    log.flush()
    output = log_path.read_bytes().decode("utf-8", "replace")
    assert code == 0, f"make package failed ({code}):\n{output[-8000:]}"
    return REPO_ROOT / "dist"


def stop() -> None:
    """End a build still running when the session ends (an aborted run), and remove its log."""
    if _build is None:
        return
    process, log, log_path = _build
    if process.poll() is None:
        try:
            os.killpg(process.pid, 15)
        except OSError:
            process.terminate()
        process.wait(timeout=60)
    log.close()
    log_path.unlink(missing_ok=True)  # a failed build's tail is in its test's failure; nothing piles up in /tmp
