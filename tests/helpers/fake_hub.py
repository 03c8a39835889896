"""A Hub-shaped HTTP server on 127.0.0.1 for download tests: the endpoints huggingface_hub calls, nothing more.

- GET  /api/models/{repo}[/revision/{rev}]  repo listing (siblings with sizes and LFS sha256, gated flag)
- HEAD /{repo}/resolve/{rev}/{file}          metadata: X-Repo-Commit, ETag / X-Linked-Etag, sizes
- GET  /{repo}/resolve/{rev}/{file}          the bytes, honouring `Range: bytes=N-` (206 + Content-Range)

Gated repos answer 401 (no token) or 403 (a token without access) with X-Error-Code: GatedRepo; a token the
server does not know gets 401 "Invalid credentials in Authorization header" like the real Hub. The server
stops by itself after `max_requests` requests or when the test ends; every socket has a timeout.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

LFS_SUFFIXES = (".safetensors", ".gguf", ".bin")


@dataclass
class FakeRepo:
    files: dict[str, bytes]
    gated: bool = False
    allowed_tokens: set[str] = field(default_factory=set)
    commit: str = "0123456789abcdef0123456789abcdef01234567"
    corrupt: set[str] = field(default_factory=set)  # served with one byte flipped, advertised with the true hash
    license: str = "apache-2.0"

    @classmethod
    def from_folder(cls, folder: Path, **kwargs: object) -> FakeRepo:
        files = {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}
        return cls(files=files, **kwargs)  # type: ignore[arg-type]


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    authorized: bool


class FakeHub:
    def __init__(self, *, valid_tokens: set[str] | None = None, max_requests: int = 500) -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.valid_tokens = valid_tokens or set()
        self.requests: list[Request] = []
        self.max_requests = max_requests
        self.stop_after_bytes: int | None = None  # cut the connection mid-body once, to simulate a drop
        self.ignore_range = False  # answer 200 with the whole file to a Range request (some proxies do)
        # Pace bodies like a real network (~1 s for a tiny model's weights), so progress, speed, ETA, pause and
        # cancel midway happen on any machine, however fast its loopback is. None = as fast as possible.
        self.bytes_per_second: float | None = 16 * 2**20
        hub = self

        class Handler(BaseHTTPRequestHandler):
            timeout = 10
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:  # keep test output clean
                pass

            def do_HEAD(self) -> None:
                hub._handle(self, head=True)

            def do_GET(self) -> None:
                hub._handle(self, head=False)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._server.timeout = 1
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def add(self, repo_id: str, repo: FakeRepo) -> FakeRepo:
        self.repos[repo_id] = repo
        return repo

    def start(self) -> FakeHub:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def _serve(self) -> None:
        self._server.serve_forever(poll_interval=0.05)

    def downloads_of(self, name: str) -> list[Request]:
        return [r for r in self.requests if r.method == "GET" and r.path.endswith("/" + name)]

    # -- request handling -----------------------------------------------------------------------------------------

    def _handle(self, handler: BaseHTTPRequestHandler, *, head: bool) -> None:
        path = unquote(urlsplit(handler.path).path)
        auth = handler.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else None
        self.requests.append(Request("HEAD" if head else "GET", path, handler.headers.get("Range"), token is not None))
        if len(self.requests) > self.max_requests:
            threading.Thread(target=self._server.shutdown, daemon=True).start()
            return self._send(handler, 503, b"request budget exhausted", head=head)
        if token is not None and token not in self.valid_tokens:
            return self._error(handler, 401, None, "Invalid credentials in Authorization header", head)
        if match := re.fullmatch(r"/api/models/(.+?)(?:/revision/([^/]+))?", path):
            return self._api_model(handler, match.group(1), head)
        if match := re.fullmatch(r"/(.+?)/resolve/([^/]+)/(.+)", path):
            return self._resolve(handler, match.group(1), match.group(3), token, head)
        return self._error(handler, 404, None, "Not found", head)

    def _api_model(self, handler: BaseHTTPRequestHandler, repo_id: str, head: bool) -> None:
        repo = self.repos.get(repo_id)
        if repo is None:
            return self._error(handler, 401, "RepoNotFound", "Repository not found", head)
        siblings = []
        for name, data in repo.files.items():
            sibling: dict[str, object] = {"rfilename": name, "size": len(data), "blobId": git_blob_sha1(data)}
            if name.endswith(LFS_SUFFIXES):
                sibling["lfs"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "pointerSize": 134}
            siblings.append(sibling)
        body = {
            "_id": "fake",
            "id": repo_id,
            "modelId": repo_id,
            "sha": repo.commit,
            "private": False,
            "gated": "manual" if repo.gated else False,
            "disabled": False,
            "siblings": siblings,
            "cardData": {"license": repo.license},
            "tags": [],
        }
        self._send(handler, 200, json.dumps(body).encode(), head=head, content_type="application/json")

    def _resolve(self, handler: BaseHTTPRequestHandler, repo_id: str, name: str, token: str | None, head: bool) -> None:
        repo = self.repos.get(repo_id)
        if repo is None:
            return self._error(handler, 401, "RepoNotFound", "Repository not found", head)
        if repo.gated and token is None:
            message = f"Access to model {repo_id} is restricted. You must have access to it and be authenticated."
            return self._error(handler, 401, "GatedRepo", message, head)
        if repo.gated and token not in repo.allowed_tokens:
            return self._error(handler, 403, "GatedRepo", f"Access to model {repo_id} is restricted.", head)
        data = repo.files.get(name)
        if data is None:
            return self._error(handler, 404, "EntryNotFound", "Entry not found", head, commit=repo.commit)
        headers = {"X-Repo-Commit": repo.commit, "Accept-Ranges": "bytes"}
        if name.endswith(LFS_SUFFIXES):
            digest = hashlib.sha256(data).hexdigest()
            headers |= {"ETag": f'"{digest}"', "X-Linked-Etag": f'"{digest}"', "X-Linked-Size": str(len(data))}
        else:
            headers["ETag"] = f'"{git_blob_sha1(data)}"'
        if name in repo.corrupt:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        start = 0
        status = 200
        if not head and not self.ignore_range and (requested := handler.headers.get("Range")):
            match = re.fullmatch(r"bytes=(\d+)-", requested.strip())
            if match:
                start = int(match.group(1))
                if start >= len(data):
                    headers["Content-Range"] = f"bytes */{len(data)}"
                    return self._send(handler, 416, b"", head=head, headers=headers)
                status = 206
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        body = data[start:]
        cut = None
        if not head and self.stop_after_bytes is not None and name.endswith(LFS_SUFFIXES):
            cut, self.stop_after_bytes = self.stop_after_bytes, None
        self._send(handler, status, body, head=head, headers=headers, cut_after=cut)

    def _error(
        self,
        handler: BaseHTTPRequestHandler,
        status: int,
        code: str | None,
        message: str,
        head: bool,
        commit: str | None = None,
    ) -> None:
        headers = {"X-Error-Message": message}
        if code:
            headers["X-Error-Code"] = code
        if commit:
            headers["X-Repo-Commit"] = commit
        body = json.dumps({"error": message}).encode()
        self._send(handler, status, body, head=head, headers=headers, content_type="application/json")

    def _send(
        self,
        handler: BaseHTTPRequestHandler,
        status: int,
        body: bytes,
        *,
        head: bool,
        headers: dict[str, str] | None = None,
        content_type: str = "application/octet-stream",
        cut_after: int | None = None,
    ) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.end_headers()
        if head:
            return
        try:
            if cut_after is not None:
                handler.wfile.write(body[:cut_after])
                handler.wfile.flush()
                handler.close_connection = True
                handler.connection.close()
                return
            if self.bytes_per_second is None:
                handler.wfile.write(body)
                return
            chunk = 64 * 1024
            for start in range(0, len(body), chunk):
                handler.wfile.write(body[start : start + chunk])
                time.sleep(chunk / self.bytes_per_second)
        except (BrokenPipeError, ConnectionResetError):  # the client stopped reading (a paused download)
            handler.close_connection = True


@contextmanager
def serving(monkeypatch: pytest.MonkeyPatch, hf_cache: Path, **kwargs: object) -> Iterator[FakeHub]:
    """A started FakeHub with huggingface_hub pointed at it (endpoint, cache, online) for one test."""
    from huggingface_hub import constants

    server = FakeHub(**kwargs).start()  # type: ignore[arg-type]
    # huggingface_hub reads these at import: point them at this test's server and cache.
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hf_cache))
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 1 << 20)  # several progress steps for a 13 MB file
    monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    try:
        yield server
    finally:
        server.stop()
