"""The HTTP side: Starlette routes for the OpenAI endpoints, a guard in front of them, and the bridge from the
queue's worker thread to each request's event loop.

Every reply waits for its first event before the status line goes out, so a prompt that does not fit or a
full queue is a proper 400 or 503, also for streams. A client that goes away sets the request's cancel Event,
which the model checks before every token; a request still waiting in the queue is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from app.core.chat.events import DoneEvent, ReplyStats, StatsEvent, TokenEvent
from app.core.engines.constrained import SchemaError
from app.core.engines.tool_prompt import TOOL_CALL_OPEN
from app.core.errors import ContextOverflowError, HearthError
from app.core.memory.release import release_freed_memory
from app.core.server import protocol
from app.core.server.guard import Guard, Policy, error_response, too_large
from app.core.server.logsafe import printable
from app.core.server.metrics import Metrics
from app.core.server.prompt_bound import PromptBound, TooLong
from app.core.server.protocol import ApiError, ParsedRequest
from app.core.server.queue import END, End, JobItem, QueueFullError, RequestQueue
from app.core.server.stops import StopFilter

log = logging.getLogger(__name__)
RELEASE_AFTER_BYTES = 2**20  # after a request body this large, freed heap memory goes back to the system
ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completions", "/v1/models": "models"}
Item = tuple[str, JobItem]  # (the text the client sees, the backend's item)
Items = asyncio.Queue[Item]


@dataclass(frozen=True)
class RequestRecord:
    """One answered request, for the window's live log (never holds a key or the prompt). Its text fields are safe
    to print: control characters escaped, client-chosen values cut (see `safe`)."""

    at: float
    client: str
    method: str
    path: str
    status: int
    stream: bool = False
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    ttft_ms: float = 0.0
    decode_tokens_per_s: float = 0.0
    queued_ms: float = 0.0
    duration_ms: float = 0.0
    finish_reason: str = ""
    error: str = ""

    def safe(self) -> RequestRecord:
        """This record with every text field a client could choose escaped and bounded (logsafe.printable)."""
        return dataclasses.replace(
            self, client=printable(self.client, 64), method=printable(self.method, 16), path=printable(self.path),
            finish_reason=printable(self.finish_reason, 16), error=printable(self.error, 400),
        )  # fmt: skip


RequestLog = Callable[[RequestRecord], None]


def _finish_reason(done: DoneEvent | None, stopped: bool, tool_calls: list[dict[str, Any]]) -> str:
    if tool_calls:
        return "tool_calls"
    if stopped or done is None:
        return "stop"
    return "length" if done.finish_reason == "length" else "stop"


def usage_block(stats: ReplyStats | None) -> dict[str, Any]:
    prompt = stats.prompt_tokens if stats else 0
    completion = stats.generated_tokens if stats else 0
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": stats.cached_tokens if stats else 0},
    }


def timings_block(stats: ReplyStats | None, queued_s: float) -> dict[str, Any]:
    """llama-server's `timings` (prompt = the tokens prefilled now; cache_n = the reused ones), plus TTFT and
    the time spent waiting in the queue."""
    if stats is None:
        return {}
    prompt_n = stats.prompt_tokens - stats.cached_tokens
    prompt_ms = stats.prefill_s * 1000
    predicted_ms = stats.decode_s * 1000
    return {
        "cache_n": stats.cached_tokens,
        "prompt_n": prompt_n,
        "prompt_ms": round(prompt_ms, 3),
        "prompt_per_token_ms": round(prompt_ms / prompt_n, 3) if prompt_n else 0.0,
        "prompt_per_second": round(stats.prefill_tokens_per_s, 2),
        "predicted_n": stats.generated_tokens,
        "predicted_ms": round(predicted_ms, 3),
        "predicted_per_token_ms": round(predicted_ms / max(stats.generated_tokens - 1, 1), 3),
        "predicted_per_second": round(stats.decode_tokens_per_s, 2),
        "ttft_ms": round(stats.ttft_s * 1000, 3),
        "queue_ms": round(queued_s * 1000, 3),
    }


class Reply:
    """One request's events, turned into what the client sees: text after stop sequences, tool calls, stats."""

    def __init__(self, parsed: ParsedRequest, cancel: threading.Event) -> None:
        self.parsed = parsed
        self.cancel = cancel
        self.stops = StopFilter(tuple(parsed.reply.stop))
        self.tool_gate = StopFilter((TOOL_CALL_OPEN,)) if parsed.tools.choice == "auto" else None
        self.forced_tool = parsed.tools.forced
        self.text: list[str] = []
        self.stats: StatsEvent | None = None
        self.done: DoneEvent | None = None
        self.tool_calls: list[dict[str, Any]] = []
        self.error: BaseException | None = None

    def take(self, item: JobItem) -> str:
        """The visible text this event adds."""
        if isinstance(item, BaseException):
            self.error = item
            return ""
        if isinstance(item, StatsEvent):
            self.stats = item
        elif isinstance(item, DoneEvent):
            self.done = item
            return self._visible(self.stops.flush(), final=True)
        elif isinstance(item, TokenEvent):
            visible = self.stops.feed(item.text)
            if self.stops.matched is not None:
                self.cancel.set()  # a stop sequence: the model stops at its next token check
            return self._visible(visible, final=False)
        return ""

    def _visible(self, text: str, *, final: bool) -> str:
        self.text.append(text)
        if self.forced_tool:
            if final:
                self.tool_calls = protocol.parse_tool_calls("".join(self.text), self.parsed.tools)
            return ""
        if self.tool_gate is not None:
            text = self.tool_gate.feed(text) + (self.tool_gate.flush() if final else "")
            if final and self.tool_gate.matched is not None:
                raw = TOOL_CALL_OPEN + self.tool_gate.after
                self.tool_calls = protocol.parse_tool_calls(raw, self.parsed.tools)
                if not self.tool_calls:  # not a call after all: the client gets the text
                    text += raw
        return text

    def incomplete_tool_call(self) -> ApiError | None:
        """A forced tool call that did not complete (cut by max_tokens or a stop sequence): an error the client
        sees, never an empty success."""
        if not self.forced_tool or self.tool_calls or self.done is None or self.done.finish_reason == "error":
            return None
        generated = self.stats.stats.generated_tokens if self.stats is not None else 0
        if self.done.finish_reason == "length":
            return ApiError(
                400, f"The forced tool call was cut by the length limit after {generated} tokens, before its JSON "
                "was complete: raise 'max_tokens'.", param="max_tokens", code="tool_call_incomplete",
            )  # fmt: skip
        return ApiError(
            400, "The forced tool call ended before its JSON was complete (a stop sequence cut it): send the request "
            "without that 'stop'.", param="stop", code="tool_call_incomplete",
        )  # fmt: skip

    @property
    def content(self) -> str:
        full = "".join(self.text)
        if self.forced_tool or (self.tool_calls and self.tool_gate is not None):
            return full.partition(TOOL_CALL_OPEN)[0] if not self.forced_tool else ""
        return full

    @property
    def finish_reason(self) -> str:
        return _finish_reason(self.done, self.stops.matched is not None, self.tool_calls)

    @property
    def reply_stats(self) -> ReplyStats | None:
        return self.stats.stats if self.stats is not None else None


def _tool_call_objects(calls: list[dict[str, Any]], request_id: str) -> list[dict[str, Any]]:
    return [
        {"id": f"call_{request_id[-12:]}_{i}", "type": "function",
         "function": {"name": call["name"], "arguments": call["arguments"]}}
        for i, call in enumerate(calls)
    ]  # fmt: skip


class ServerApp:
    """The ASGI application over one RequestQueue."""

    def __init__(
        self,
        queue: RequestQueue,
        policy: Policy,
        *,
        model_id: str,
        on_request: RequestLog | None = None,
    ) -> None:
        self.queue = queue
        self.policy = policy
        self.model_id = model_id
        self.metrics = Metrics()
        self.on_request = on_request
        self.started_at = int(time.time())
        self.prompt_bound = PromptBound(queue.model.info.tokenizer_file, queue.model.info.context_window)
        self._counting = asyncio.Semaphore(1)  # one prompt counted at a time, off the event loop and the worker
        self._compiler = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hearth-grammar")
        routes = [
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/metrics", self.metrics_text, methods=["GET"]),
        ]
        handlers = {404: self._not_found, 405: self._not_allowed, Exception: self._internal_error}
        starlette = Starlette(routes=routes, exception_handlers=handlers)
        self.asgi: ASGIApp = Guard(starlette, policy, self._refused)

    # --- small endpoints ------------------------------------------------------------------------------------------
    async def models(self, request: Request) -> Response:
        self.metrics.request_done("models", 200)
        return JSONResponse({"object": "list", "data": [
            {"id": self.model_id, "object": "model", "created": self.started_at, "owned_by": "hearth"}
        ]})  # fmt: skip

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": self.model_id, "queue_depth": self.queue.waiting,
                             "running": self.queue.running})  # fmt: skip

    async def metrics_text(self, request: Request) -> Response:
        reading = self.queue.last_memory
        kv = sum(d.kv_bytes for d in reading.devices) if reading is not None else 0
        text = self.metrics.render(self.queue.waiting, self.queue.running, kv)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    async def _not_found(self, request: Request, exc: Exception) -> Response:
        self._log(request, 404, error="not found")
        message = (
            f"There is no {printable(request.url.path, 80)} here; see GET /v1/models, POST /v1/chat/completions, "
            "POST /v1/completions."
        )
        return error_response(ApiError(404, message, code="not_found"))

    async def _not_allowed(self, request: Request, exc: Exception) -> Response:
        self._log(request, 405, error="method not allowed")
        message = f"{printable(request.method, 16)} is not allowed on {printable(request.url.path, 80)}."
        return error_response(ApiError(405, message, code="method_not_allowed"))

    async def _internal_error(self, request: Request, exc: Exception) -> Response:
        """A bug, not the client's fault: a JSON 500 that the metrics count (the Guard logs it, escaped)."""
        error = ApiError(500, f"The server failed: {type(exc).__name__}.", code="server_error")
        self.metrics.request_done(ENDPOINTS.get(request.url.path, "other"), 500)
        self._log(request, 500, error=error.message)
        return error_response(error)

    def _refused(self, scope: Scope, status: int, message: str) -> None:
        self.metrics.request_done("refused", status)
        client = scope.get("client") or ("", 0)
        self._emit(RequestRecord(time.time(), str(client[0]), scope["method"], scope["path"], status, error=message))

    # --- generation -----------------------------------------------------------------------------------------------
    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, "chat")

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, "completions")

    async def _read_body(self, request: Request) -> bytes:
        limit = self.policy.limits.max_body_bytes
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large(limit)
            chunks.append(chunk)
        return b"".join(chunks)

    async def _generate(self, request: Request, endpoint: str) -> Response:
        received = time.perf_counter()
        size = 0
        try:
            raw = await self._read_body(request)
            size = len(raw)
            # A large body is parsed off the event loop (other clients keep being answered meanwhile).
            body = protocol.decode_json(raw) if size < 2**16 else await asyncio.to_thread(protocol.decode_json, raw)
            del raw
            window = self.queue.model.info.context_window
            limits = self.policy.limits
            parse = protocol.chat_request if endpoint == "chat" else protocol.completion_request
            parsed = parse(body, limits, window)
            del body
            await self._check_prompt_size(parsed)
        except ApiError as error:
            self.metrics.request_done(endpoint, error.status)
            self._log(request, error.status, error=error.log_message)
            return _releasing(error_response(error), size)
        refused = await self._compile_grammar(parsed)
        if refused is not None:
            self.metrics.request_done(endpoint, refused.status)
            self._log(request, refused.status, error=refused.log_message)
            return _releasing(error_response(refused), size)
        cancel = threading.Event()
        loop = asyncio.get_running_loop()
        items: Items = asyncio.Queue()
        reply = Reply(parsed, cancel)

        def sink(item: JobItem) -> None:
            # In the model's thread: a stop sequence sets cancel before the model's next token check.
            loop.call_soon_threadsafe(items.put_nowait, (reply.take(item), item))

        try:
            job = self.queue.submit(parsed.reply, cancel, sink)
        except QueueFullError as full:
            busy = ApiError(503, str(full), code="queue_full", headers={"Retry-After": str(full.retry_after_s)})
            self.metrics.request_done(endpoint, 503)
            self._log(request, 503, error=busy.message)
            return error_response(busy)
        gone = threading.Event()
        watcher = asyncio.create_task(_watch_disconnect(request, cancel, gone))
        request_id = ("chatcmpl-" if endpoint == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        first = await items.get()
        if isinstance(first[1], BaseException | End):
            watcher.cancel()
            failure = _as_api_error(first[1])
            if gone.is_set():  # the client left while its request waited: it was skipped
                failure = ApiError(499, "client disconnected while waiting")
            self.metrics.request_done(endpoint, failure.status)
            self._log(request, failure.status, error=failure.log_message)
            return _releasing(error_response(failure), size)
        context = _Exchange(self, request, parsed, reply, request_id, received, lambda: job.queued_s, gone)
        if parsed.stream:
            return EventStream(context.stream(first, items, watcher), release=size >= RELEASE_AFTER_BYTES)
        return _releasing(await context.collect(first, items, watcher), size)

    async def _check_prompt_size(self, parsed: ParsedRequest) -> None:
        """Refuse a prompt whose text alone cannot fit the window, before it is queued (prompt_bound)."""
        reply = parsed.reply
        texts = [reply.raw_prompt] if reply.raw_prompt is not None else [m.content for m in reply.messages]
        if not self.prompt_bound.loaded:
            async with self._counting:
                await asyncio.to_thread(self.prompt_bound.load)
        too_long = self.prompt_bound.by_bytes(texts)
        if too_long is None and self.prompt_bound.tokenizer is not None:
            async with self._counting:
                too_long = await asyncio.to_thread(self.prompt_bound.by_tokens, texts)
        if too_long is not None:
            raise _too_long_error(too_long, "prompt" if reply.raw_prompt is not None else "messages")

    async def _compile_grammar(self, parsed: ParsedRequest) -> ApiError | None:
        """Compile the request's grammar (response_format, forced or fallback tool calls) before it joins the queue,
        in the server's one compile thread, never the model's: a slow schema holds no other request, and one that
        can't be enforced (or passes the compile limit) is a 400 naming why. The reply then finds it compiled."""
        compile_grammar = getattr(self.queue.model, "compile_grammar", None)
        reply = parsed.reply
        if compile_grammar is None or (reply.response_format.kind == "text" and not reply.tools):
            return None
        try:
            await asyncio.get_running_loop().run_in_executor(self._compiler, compile_grammar, reply)
        except HearthError as exc:  # a schema it can't enforce; tools refused (--strict-tools)
            code = "invalid_schema" if isinstance(exc, SchemaError) else None
            return ApiError(400, str(exc), param="tools" if reply.tools else "response_format", code=code)
        return None

    # --- the request log ------------------------------------------------------------------------------------------
    def _log(self, request: Request, status: int, *, reply: Reply | None = None, stream: bool = False,
             started: float | None = None, queued_s: float = 0.0, error: str = "") -> None:  # fmt: skip
        stats = reply.reply_stats if reply is not None else None
        client = request.client.host if request.client else ""
        self._emit(RequestRecord(
            at=time.time(), client=client, method=request.method, path=request.url.path, status=status,
            stream=stream,
            prompt_tokens=stats.prompt_tokens if stats else 0,
            cached_tokens=stats.cached_tokens if stats else 0,
            completion_tokens=stats.generated_tokens if stats else 0,
            ttft_ms=stats.ttft_s * 1000 if stats else 0.0,
            decode_tokens_per_s=stats.decode_tokens_per_s if stats else 0.0,
            queued_ms=queued_s * 1000,
            duration_ms=(time.perf_counter() - started) * 1000 if started is not None else 0.0,
            finish_reason=(reply.finish_reason if reply.done is not None else "cancelled") if reply else "",
            error=error,
        ))  # fmt: skip

    def _emit(self, record: RequestRecord) -> None:
        if self.on_request is None:
            return
        try:
            self.on_request(record.safe())
        except Exception:  # a broken log view must not break serving
            log.exception("request log callback failed")

    def reply_finished(self, endpoint: str, reply: Reply, status: int) -> None:
        stats = reply.reply_stats
        self.metrics.request_done(endpoint, status)
        if stats is not None:
            cancelled = reply.done is not None and reply.done.finish_reason == "cancelled" and not reply.stops.matched
            self.metrics.reply_done(stats.prompt_tokens, stats.cached_tokens, stats.generated_tokens, stats.ttft_s,
                                    stats.decode_tokens_per_s, cancelled)  # fmt: skip


def _too_long_error(too_long: TooLong, param: str) -> ApiError:
    return ApiError(400, too_long.message(), param=param, code="context_length_exceeded")


def _releasing(response: Response, body_bytes: int) -> Response:
    """After a large body, hand the heap memory its parsing freed back to the system once the reply is sent."""
    if body_bytes >= RELEASE_AFTER_BYTES and response.background is None:
        response.background = BackgroundTask(release_freed_memory)
    return response


def _as_api_error(item: BaseException | End) -> ApiError:
    if isinstance(item, ApiError):
        return item
    if isinstance(item, ContextOverflowError):
        return ApiError(400, str(item), param="messages", code="context_length_exceeded")
    if isinstance(item, HearthError):
        return ApiError(400, str(item))
    if isinstance(item, End):
        return ApiError(500, "The model ended the reply without an answer.", code="server_error")
    log.error("server: generation failed: %s: %s", type(item).__name__, printable(str(item), 400))
    return ApiError(500, f"The model failed: {type(item).__name__}: {item}", code="server_error")


async def _watch_disconnect(request: Request, cancel: threading.Event, gone: threading.Event) -> None:
    """Set cancel when the client goes away (uvicorn delivers http.disconnect to receive())."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            gone.set()
            cancel.set()
            return


@dataclass
class _Exchange:
    app: ServerApp
    request: Request
    parsed: ParsedRequest
    reply: Reply
    request_id: str
    received: float
    queued_s: Callable[[], float]
    gone: threading.Event  # the client disconnected

    @property
    def endpoint(self) -> str:
        return self.parsed.endpoint

    def _base(self) -> dict[str, Any]:
        kind = "chat.completion" if self.endpoint == "chat" else "text_completion"
        return {"id": self.request_id, "object": kind, "created": int(time.time()), "model": self.app.model_id,
                "system_fingerprint": "hearth"}  # fmt: skip

    async def _events(self, first: Item, items: Items) -> AsyncIterator[str]:
        text, item = first
        while not isinstance(item, End):
            if text:
                yield text
            text, item = await items.get()

    async def collect(self, first: Item, items: Items, watcher: asyncio.Task[None]) -> Response:
        try:
            async for _ in self._events(first, items):
                pass
        finally:
            watcher.cancel()
        reply = self.reply
        if reply.error is not None or (reply.done is not None and reply.done.finish_reason == "error"):
            detail = reply.done.error if reply.done is not None and reply.done.error else ""
            error = _as_api_error(reply.error) if reply.error is not None else ApiError(500, detail or "failed")
            self.app.reply_finished(self.endpoint, reply, error.status)
            self.app._log(self.request, error.status, reply=reply, started=self.received, error=error.message)
            return error_response(error)
        incomplete = reply.incomplete_tool_call()
        if incomplete is not None:
            self.app.reply_finished(self.endpoint, reply, incomplete.status)
            self.app._log(self.request, incomplete.status, reply=reply, started=self.received, error=incomplete.message)
            return error_response(incomplete)
        body = self._base()
        if self.endpoint == "chat":
            said: dict[str, Any] = {"role": "assistant", "content": reply.content}
            if reply.tool_calls:
                said["content"] = reply.content or None
                said["tool_calls"] = _tool_call_objects(reply.tool_calls, self.request_id)
            choice = {"index": 0, "message": said, "finish_reason": reply.finish_reason, "logprobs": None}
        else:
            choice = {"index": 0, "text": reply.content, "finish_reason": reply.finish_reason, "logprobs": None}
        body["choices"] = [choice]
        body["usage"] = usage_block(reply.reply_stats)
        body["timings"] = timings_block(reply.reply_stats, self.queued_s())
        self.app.reply_finished(self.endpoint, reply, 200)
        self.app._log(self.request, 200, reply=reply, started=self.received, queued_s=self.queued_s())
        return JSONResponse(body)

    def _chunk(self, delta: dict[str, Any] | None, text: str | None = None, finish: str | None = None) -> str:
        body = self._base()
        body["object"] = "chat.completion.chunk" if self.endpoint == "chat" else "text_completion"
        if self.endpoint == "chat":
            body["choices"] = [{"index": 0, "delta": delta or {}, "finish_reason": finish, "logprobs": None}]
        else:
            body["choices"] = [{"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}]
        if self.parsed.include_usage:
            body["usage"] = None
        return _sse(body)

    async def stream(self, first: Item, items: Items, watcher: asyncio.Task[None]) -> AsyncIterator[str]:
        reply = self.reply
        finished = False
        try:
            if self.endpoint == "chat":
                yield self._chunk({"role": "assistant", "content": ""})
            async for text in self._events(first, items):
                if self.gone.is_set():
                    return
                yield self._chunk({"content": text}, text)
            if self.gone.is_set():
                return
            failed = reply.error is not None or (reply.done is not None and reply.done.finish_reason == "error")
            incomplete = reply.incomplete_tool_call()
            if failed or incomplete is not None:
                detail = str(reply.error) if reply.error is not None else (reply.done.error if reply.done else "")
                error = incomplete or ApiError(500, f"The model failed mid-reply: {detail}", code="server_error")
                self.app.reply_finished(self.endpoint, reply, error.status)
                self.app._log(self.request, error.status, reply=reply, stream=True, started=self.received,
                              error=error.message)  # fmt: skip
                yield _sse(error.body())
                yield "data: [DONE]\n\n"
                finished = True
                return
            if reply.tool_calls:
                for index, call in enumerate(_tool_call_objects(reply.tool_calls, self.request_id)):
                    # The openai client joins fragments by index: the name first, then the arguments in pieces.
                    head = {"index": index, "id": call["id"], "type": "function",
                            "function": {"name": call["function"]["name"], "arguments": ""}}  # fmt: skip
                    yield self._chunk({"tool_calls": [head]})
                    arguments = call["function"]["arguments"]
                    for start in range(0, len(arguments), 16):
                        part = {"index": index, "function": {"arguments": arguments[start : start + 16]}}
                        yield self._chunk({"tool_calls": [part]})
            last = self._base()
            last_chunk = json.loads(self._chunk({}, "", reply.finish_reason)[len("data: ") :])
            last_chunk["timings"] = timings_block(reply.reply_stats, self.queued_s())
            yield _sse(last_chunk)
            if self.parsed.include_usage:
                last["object"] = "chat.completion.chunk" if self.endpoint == "chat" else "text_completion"
                last["choices"] = []
                last["usage"] = usage_block(reply.reply_stats)
                yield _sse(last)
            yield "data: [DONE]\n\n"
            finished = True
            self.app.reply_finished(self.endpoint, reply, 200)
            self.app._log(self.request, 200, reply=reply, stream=True, started=self.received,
                          queued_s=self.queued_s())  # fmt: skip
        finally:
            watcher.cancel()
            if not finished:  # the client went away mid-stream: stop the model, count it
                reply.cancel.set()
                with contextlib.suppress(Exception):
                    await _drain(items)
                self.app.reply_finished(self.endpoint, reply, 499)
                self.app._log(self.request, 499, reply=reply, stream=True, started=self.received,
                              queued_s=self.queued_s(), error="client disconnected")  # fmt: skip


async def _drain(items: Items) -> None:
    """Wait (briefly) for the cancelled reply's last events, so its stats reach the log and metrics."""
    async with asyncio.timeout(5.0):
        while not isinstance((await items.get())[1], End):
            pass


class EventStream(Response):
    """Server-sent events from an async iterator. Unlike StreamingResponse, the iterator is always closed when
    the client goes away (its `finally` cancels the model at once, not whenever it is garbage-collected)."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[str], *, release: bool = False) -> None:
        # No Response.__init__: it would render an empty body and send Content-Length: 0.
        self.status_code = 200
        self.background = None
        self.init_headers({"cache-control": "no-cache", "x-accel-buffering": "no"})
        self.events = events
        self.release = release  # a large request: give freed heap memory back at the end

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            async for chunk in self.events:
                await send({"type": "http.response.body", "body": chunk.encode(), "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # uvicorn: the client disconnected
            pass
        finally:
            await self.events.aclose()  # type: ignore[attr-defined]
            if self.release:
                release_freed_memory()


def _sse(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False, separators=(',', ':'))}\n\n"


Handler = Callable[[Request], Awaitable[Response]]
__all__ = ["END", "Policy", "RequestLog", "RequestRecord", "ServerApp"]
