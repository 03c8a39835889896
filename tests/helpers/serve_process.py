"""A real `hearth serve` in its own process on a free port: started, its address read from its stderr, stopped."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ADDRESS = re.compile(r"at (http://127\.0\.0\.1:\d+/v1) · ")


class ServeProcess:
    def __init__(self, process: subprocess.Popen[str], base_url: str, lines: list[str]) -> None:
        self.process = process
        self.base_url = base_url
        self.lines = lines  # stderr so far (read on in a thread)

    @property
    def runtime(self) -> str:
        """Its `hearth: runtime: …` line."""
        return next((line.strip() for line in self.lines if line.startswith("hearth: runtime: ")), "")


@contextmanager
def hearth_serve(home: Path, *args: str, timeout_s: float = 300) -> Iterator[ServeProcess]:
    """`hearth serve --port 0 ARGS` with HEARTH_HOME=home (the test run's model cache is shared)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HEARTH_HOME": str(home)}
    process = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--port", "0", *args],
        cwd=REPO, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    lines: list[str] = []
    assert process.stderr is not None
    address = None
    deadline = time.monotonic() + timeout_s
    try:
        while address is None and time.monotonic() < deadline:
            line = process.stderr.readline()
            if not line:
                break
            lines.append(line)
            if found := ADDRESS.search(line):
                address = found.group(1)
        if address is None:
            raise AssertionError("hearth serve did not start:\n" + "".join(lines)[-3000:])
        stderr = process.stderr
        reader = threading.Thread(target=lambda: lines.extend(iter(stderr.readline, "")), daemon=True)
        reader.start()  # a full pipe would block the server's request log
        yield ServeProcess(process, address, lines)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
