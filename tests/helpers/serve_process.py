"""A real `hearth serve` process on 127.0.0.1 (a free port), its stderr collected line by line, and raw HTTP over a
socket: what a hostile client sends is sent byte for byte (no client library normalises the path or the headers)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 300


@dataclass
class RawReply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class ServeProcess:
    process: subprocess.Popen[bytes]
    port: int
    lines: list[bytes] = field(default_factory=list)  # stderr, raw bytes per line (escape codes kept as sent)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def runtime(self) -> str:
        """Its `hearth: runtime: …` line."""
        return next((line.decode().strip() for line in self.lines if line.startswith(b"hearth: runtime: ")), "")

    def stderr_bytes(self) -> bytes:
        return b"".join(self.lines)

    def wait_for_line(self, predicate: Callable[[bytes], bool], timeout_s: float = 30) -> bytes:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if predicate(line):
                    return line
            time.sleep(0.05)
        raise AssertionError(f"no such line on stderr; it holds:\n{self.stderr_bytes()[-3000:]!r}")

    def request(
        self,
        method: str,
        target: str,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        *,
        half_close: bool = False,
        timeout_s: float = 120,
    ) -> RawReply:
        """One HTTP/1.1 request as raw bytes (`target` exactly as given); `half_close` shuts the socket for writing
        once the request is sent, and the reply is still read."""
        head = {"Host": f"127.0.0.1:{self.port}", "Connection": "close", **(headers or {})}
        if body or method == "POST":
            head.setdefault("Content-Type", "application/json")
            head["Content-Length"] = str(len(body))
        raw = f"{method} {target} HTTP/1.1\r\n".encode() + b"".join(
            f"{k}: {v}\r\n".encode("latin-1") for k, v in head.items()
        )
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout_s) as sock:
            sock.sendall(raw + b"\r\n" + body)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return parse_reply(b"".join(chunks))

    def post_json(self, path: str, payload: Any, **kwargs: Any) -> RawReply:
        return self.request("POST", path, json.dumps(payload).encode(), **kwargs)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def parse_reply(data: bytes) -> RawReply:
    """The final response in `data` (1xx interim responses before it are skipped), its body de-chunked."""
    while True:
        head, _, rest = data.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if status >= 200:
            break
        data = rest
    headers = {}
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding") == "chunked":
        body, rest = b"", rest
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                break
            body, rest = body + rest[:size], rest[size + 2 :]
        rest = body
    return RawReply(status, headers, rest)


@contextmanager
def hearth_serve(home: Path, *args: str) -> Iterator[ServeProcess]:
    """`hearth serve --port 0 ARGS` as a user starts it (the runtime `hearth chat` would pick), stopped at the end."""
    served = start_serve(home, *args, bf16=False)
    try:
        yield served
    finally:
        served.stop()


def start_serve(home: Path, *args: str, env: dict[str, str] | None = None, bf16: bool = True) -> ServeProcess:
    """`hearth serve --port 0 ARGS` on the embedded model (in bf16 on the torch runtime unless `bf16` is False);
    returns once it listens."""
    environment = {**os.environ, "PYTHONPATH": str(REPO), "HEARTH_HOME": str(home), **(env or {})}
    forced = ["--quant", "bf16", "--device", "cpu"] if bf16 else []
    process = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--port", "0", *forced, *args],
        cwd=REPO, env=environment, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    served = ServeProcess(process, 0)
    assert process.stderr is not None
    stream = process.stderr

    def read() -> None:
        for line in iter(stream.readline, b""):
            served.lines.append(line)

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        for line in list(served.lines):
            if found := re.search(rb"at http://127\.0\.0\.1:(\d+)/v1", line):
                served.port = int(found.group(1))
                return served
        if process.poll() is not None:
            time.sleep(0.2)  # let the reader take the last lines
            raise AssertionError(f"hearth serve exited ({process.returncode}):\n{served.stderr_bytes().decode()}")
        time.sleep(0.05)
    served.stop()
    raise AssertionError(f"hearth serve did not start:\n{served.stderr_bytes().decode()}")
