"""`transformers serve` (Hugging Face's own OpenAI-compatible server, not written here) on 127.0.0.1, offline, serving
the default model as a Hugging Face folder (tests/conftest.py's default_model_folder): the real server the
remote-engine tests talk to."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx2


@dataclass(frozen=True)
class RunningServer:
    base_url: str
    model: str  # the id the server lists: the folder path it was started with
    log: Path


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def transformers_serve(folder: Path, log: Path, timeout_s: float = 180.0) -> Iterator[RunningServer]:
    port = _free_port()
    cli = Path(sys.executable).with_name("transformers")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TQDM_DISABLE="1")
    command = [str(cli), "serve", "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"]
    command += ["--dtype", "bfloat16", "--log-level", "warning", str(folder)]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"transformers serve exited ({process.returncode}): {log.read_text()[-2000:]}")
            try:
                if httpx2.get(f"http://127.0.0.1:{port}/health", timeout=1.0).status_code == 200:
                    break
            except httpx2.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"transformers serve did not start in {timeout_s:g} s: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield RunningServer(f"http://127.0.0.1:{port}/v1", str(folder), log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
