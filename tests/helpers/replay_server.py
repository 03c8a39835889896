"""A real HTTP server on 127.0.0.1 (FastAPI + uvicorn, ephemeral port) that replays what a test scripts: recorded
SSE files byte for byte, error bodies with their headers, a stream that hangs until the client leaves, a stream
cut off mid-body. It records every request it got, headers included."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "remote"


def sse_events(text: str) -> list[str]:
    """A recorded SSE file split into its events (each ends with a blank line), comments kept."""
    return [block + "\n\n" for block in text.strip("\n").split("\n\n") if block.strip()]


@dataclass
class Reply:
    status: int = 200
    body: Any = None  # dict -> JSON, str -> SSE text
    headers: dict[str, str] = field(default_factory=dict)
    hang_after: int | None = None  # send this many events, then wait until the client goes away
    cut_after: int | None = None  # send this many events, then drop the connection mid-body


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: dict[str, Any] | None


class ReplayServer:
    def __init__(self) -> None:
        self.replies: list[Reply] = []
        self.requests: list[Recorded] = []
        self.models: list[str] = ["test-model"]
        self.metrics: str | None = None
        self.client_left = threading.Event()
        self.app = self._build()
        self._server: uvicorn.Server | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def queue(self, reply: Reply) -> None:
        self.replies.append(reply)

    def queue_file(self, name: str, **kwargs: Any) -> None:
        path = FIXTURES / name
        text = path.read_text(encoding="utf-8")
        body = {k: v for k, v in json.loads(text).items() if k != "_shape"} if name.endswith(".json") else text
        self.queue(Reply(body=body, **kwargs))

    def _build(self) -> FastAPI:
        app = FastAPI()

        @app.get("/v1/models")
        async def models(request: Request) -> Response:
            self._record(request, None)
            if self.replies and self.replies[0].status != 200:
                return self._respond(self.replies.pop(0))
            return JSONResponse({"object": "list", "data": [{"id": m, "object": "model"} for m in self.models]})

        @app.get("/metrics")
        async def metrics() -> Response:
            if self.metrics is None:
                return PlainTextResponse("not found", status_code=404)
            return PlainTextResponse(self.metrics)

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Response:
            self._record(request, await request.json())
            return self._respond(self.replies.pop(0))

        @app.post("/v1/messages")
        async def messages(request: Request) -> Response:
            self._record(request, await request.json())
            return self._respond(self.replies.pop(0))

        return app

    def _record(self, request: Request, body: dict[str, Any] | None) -> None:
        self.requests.append(Recorded(request.url.path, {k.lower(): v for k, v in request.headers.items()}, body))

    def _respond(self, reply: Reply) -> Response:
        if isinstance(reply.body, dict):
            return JSONResponse(reply.body, status_code=reply.status, headers=reply.headers)
        events = sse_events(reply.body or "")

        async def stream() -> AsyncIterator[bytes]:
            try:
                for index, event in enumerate(events):
                    if reply.cut_after is not None and index >= reply.cut_after:
                        raise ConnectionAbortedError("replay: dropping the connection mid-stream")
                    if reply.hang_after is not None and index >= reply.hang_after:
                        await asyncio.sleep(3600)  # until the client leaves and Starlette cancels us
                    yield event.encode()
            finally:
                self.client_left.set()

        return StreamingResponse(stream(), status_code=reply.status, media_type="text/event-stream")

    @contextmanager
    def running(self) -> Iterator[ReplayServer]:
        config = uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="critical", lifespan="off")
        self._server = uvicorn.Server(config)
        thread = threading.Thread(target=self._server.run, daemon=True)
        thread.start()
        while not self._server.started:
            if not thread.is_alive():
                raise RuntimeError("the replay server did not start")
            threading.Event().wait(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        try:
            yield self
        finally:
            self._server.should_exit = True
            thread.join(timeout=10)
