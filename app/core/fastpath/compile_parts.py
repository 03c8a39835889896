"""The kernel library compiled from its source in parts side by side (hearth_decode.c's HEARTH_PART), then linked:
one gcc -O3 of the whole file takes 36-41 s single-threaded on the 2-core Zen 4 CI guest, its four parts 16 s
together there. The compiler's processes and files are this module's: each part in a process group of its own, its
temporary files in a staging folder beside the library, all of it stopped and removed when a part fails or the time
runs out. Plain subprocesses, no numpy, no ctypes: app.core.fastpath.kernel checks and loads what this publishes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any

from app.core.fastpath import integrity
from app.core.storage import staging

# hearth_decode.c's HEARTH_PART objects, biggest first (gcc -O3 on the 2-core Zen 4 guest: x16_rows 14.6 s, gg_rows
# 8.0 s, amx_rows 5.0 s, everything else 3.7 s; the whole file as one object 36-41 s): compiled side by side, linked.
PARTS = (2, 1, 3, 0)
POSIX = os.name == "posix"  # each compiler runs in a process group of its own, stopped as one (_stop)


def compile_library(compiler: str, flags: list[str], source: Path, target: Path, timeout_s: float) -> str:
    """`source` compiled with `flags` in parts and linked, published at `target` with its checksum (integrity.publish);
    "" on success, else why (one sentence; nothing is left behind)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    # The parts' objects and the compiler's own temporary files (TMPDIR) go in a folder of this process's, removed
    # after: a compiler stopped mid-way (its part no longer needed) leaves its temporary files, and a killed process
    # leaves the folder, which app.core.storage.staging sweeps once the process is gone.
    with staging.staging_folder(target.parent, "compile") as scratch:
        try:
            objects = [scratch / f"part{part}.o" for part in PARTS]
            compiles = [
                [compiler, *flags, f"-DHEARTH_PART={part}", "-c", "-o", str(obj), str(source)]
                for part, obj in zip(PARTS, objects, strict=True)
            ]
            link = [compiler, *flags, "-o", str(partial), *(str(obj) for obj in objects), "-lm"]
            environment = {**os.environ, "TMPDIR": str(scratch), "TMP": str(scratch), "TEMP": str(scratch)}
            deadline = time.monotonic() + timeout_s
            error = _run_side_by_side(compiles, deadline, timeout_s, environment) or _run_side_by_side(
                [link], deadline, timeout_s, environment
            )
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    if error:
        partial.unlink(missing_ok=True)
        return error
    # Hash, sidecar, then an atomic move: another process never loads a half-written or unrecorded library.
    integrity.publish(partial, target)
    return ""


def _run_side_by_side(commands: list[list[str]], deadline: float, timeout_s: float, environment: dict[str, str]) -> str:
    """Run the compiler commands, as many at once as there are cores, in order; "" when all succeed, else why (the
    first failure's first error line; the others are stopped)."""
    waiting: list[list[str]] = list(commands)
    running: list[tuple[subprocess.Popen[bytes], Any]] = []
    cores = max(1, os.cpu_count() or 1)
    with ExitStack() as files:
        try:
            while waiting or running:
                while waiting and len(running) < cores:
                    errors = files.enter_context(tempfile.TemporaryFile())  # not a pipe: warnings never fill one
                    command = waiting.pop(0)
                    process = subprocess.Popen(
                        command, stdout=subprocess.DEVNULL, stderr=errors, env=environment, start_new_session=POSIX
                    )
                    running.append((process, errors))
                for process, errors in list(running):
                    if process.poll() is None:
                        continue
                    running.remove((process, errors))
                    if process.returncode != 0:
                        errors.seek(0)
                        text = errors.read().decode(errors="replace")
                        first = next((line for line in text.splitlines() if "error" in line), text.strip()[:200])
                        return f"compiling the fused decode kernel failed: {first.strip()}"
                if time.monotonic() > deadline:
                    return f"compiling the fused decode kernel took over {timeout_s:g} s"
                if running:
                    time.sleep(0.02)
        except OSError as exc:
            return f"the C compiler could not run ({exc})"
        finally:
            for process, _ in running:
                _stop(process)
    return ""


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Stop a compiler and what it started (gcc's driver runs cc1 and as as children, which outlive a driver stopped
    alone): its whole process group on POSIX, SIGTERM first (the driver removes its temporary files then)."""
    if not POSIX:
        process.kill()
        process.wait()
        return
    for signal_number in (signal.SIGTERM, signal.SIGKILL):
        with suppress(ProcessLookupError, PermissionError):  # the group has already gone
            os.killpg(process.pid, signal_number)
        try:
            process.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue
