"""RemoteBackend: a ChatBackend that streams from an OpenAI-compatible server (the `openai` client) or from
Anthropic's Messages API (the `anthropic` client), with the same events and stats as a local reply.

Stop closes the HTTP response at once (a watcher closes it even while the client waits for a chunk) and keeps
the partial reply. Failures before the first token raise one HearthError sentence; failures mid-reply end with
DoneEvent("error") and the text so far. Nothing here prints a traceback or a key.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from app.core.chat.events import (
    ChatMessage,
    DoneEvent,
    Event,
    FinishReason,
    PromptEvent,
    ReplyStats,
    StatsEvent,
    TokenEvent,
)
from app.core.engines.backend import MemoryReading, ModelInfo, ReplyRequest, estimate_context
from app.core.engines.remote import pricing
from app.core.engines.remote.engines import EngineConfig
from app.core.errors import HearthError
from app.core.memory.types import DeviceMemory

log = logging.getLogger(__name__)
CONNECT_TIMEOUT_S = 10.0
ANTHROPIC_DEFAULT_MAX_TOKENS = 1024
METRICS_EVERY_S = 2.0  # the server's memory reading is kept this long


@dataclass
class ServerTimings:
    """llama-server's `timings` object (per reply), when the server sends one."""

    cache_n: int | None = None
    prompt_n: int | None = None
    predicted_n: int | None = None
    prompt_per_second: float | None = None
    predicted_per_second: float | None = None


@dataclass
class _Reply:
    """What one streamed reply accumulated."""

    pieces: list[str] = field(default_factory=list)
    finish: str | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    chunks: int = 0  # content chunks: the token count when the server sends no usage
    first_at: float | None = None
    last_at: float | None = None
    timings: ServerTimings | None = None
    tool_calls: dict[int, dict[str, str]] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def add_text(self, text: str) -> None:
        """One content chunk arrived: keep it and time it (TTFT and decode rate are measured on the client)."""
        now = time.perf_counter()
        self.first_at = self.first_at or now
        self.last_at = now
        self.chunks += 1
        self.pieces.append(text)


def explain(exc: BaseException, engine: EngineConfig, model: str, timeout_s: float, *, mid_reply: bool = False) -> str:
    """One sentence for any failure of the openai or anthropic client (both raise the same family of errors)."""
    name = f"Engine {engine.name!r} ({engine.base_url})"
    status = getattr(exc, "status_code", None)
    detail = _server_message(exc)
    kind = type(exc).__name__
    if "Timeout" in kind:
        return f"{name} did not answer within {timeout_s:g} s (timeout); the server may be overloaded or stuck."
    if mid_reply and status is None and kind != "APIError":
        return (
            f"The connection to {name} closed mid-reply ({kind}: {exc.__cause__ or exc}); the partial reply was kept."
        )
    if kind == "APIConnectionError" or isinstance(exc, ConnectionError):
        cause = str(exc.__cause__ or exc).lower()
        why = "connection refused" if "refused" in cause else "network unreachable or the server is down"
        return f"Cannot reach {name}: {why}. Is the server running and the base URL right?"
    if status == 401:
        return f"{name} rejected the API key (401 Unauthorized); set a new one with `hearth engines add --key`."
    if status == 403:
        return f"{name} refused the request (403 Forbidden): the key has no access to model {model!r}."
    if status == 404:
        return (
            f"{name} has no model {model!r} (404 Not Found{': ' + detail if detail else ''}); "
            f"list its models with `hearth engines test {engine.name}`."
        )
    if status == 429:
        wait = retry_after_seconds(exc)
        when = f"try again in {wait:g} s" if wait is not None else "try again later"
        return f"{name} is rate limiting requests (429 Too Many Requests): {when}."
    if status == 400 and "stream_options" in detail:
        return (
            f"{name} rejected `stream_options` (400: {detail}); turn usage reporting off for this engine "
            f"(`hearth engines add {engine.name} --url {engine.base_url} --no-usage --replace`)."
        )
    if status is not None:
        return f"{name} answered {status}: {detail or kind}."
    if kind == "APIError":  # an error object inside the stream
        return f"{name} reported an error mid-reply: {detail or exc}."
    return f"The connection to {name} failed ({kind}: {exc})."


def _server_message(exc: BaseException) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"])[:300]
        if isinstance(inner, str):
            return inner[:300]
    message = getattr(exc, "message", None)
    return str(message)[:300] if isinstance(message, str) else ""


def retry_after_seconds(exc: BaseException) -> float | None:
    """Retry-After (seconds, or the `retry-after-ms` some providers send) from a 429."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    if (ms := headers.get("retry-after-ms")) is not None:
        try:
            return round(float(ms) / 1000, 3)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:  # an HTTP date
        from email.utils import parsedate_to_datetime

        try:
            return max(0.0, round(parsedate_to_datetime(value).timestamp() - time.time()))
        except (TypeError, ValueError):
            return None


class RemoteBackend:
    """A ChatBackend for one model on one remote engine."""

    def __init__(
        self,
        engine: EngineConfig,
        model: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        context_window: int = 0,
        response_cache: Any = None,  # app.core.chat.response_cache.ResponseCache; used only if the engine allows it
        http_client: Any = None,  # an httpx2.Client, for tests that replay recorded streams
    ) -> None:
        if not model:
            raise HearthError(f"Choose a model for engine {engine.name!r} (--model; `hearth engines test` lists them).")
        self.engine = engine
        self.model = model
        self.timeout_s = timeout_s
        self.info = ModelInfo(f"{model} @ {engine.name}", "remote", "remote", context_window)
        self.response_cache: Any = response_cache if engine.response_cache else None
        self.last_timings: ServerTimings | None = None
        self.last_tool_calls: list[dict[str, str]] = []
        self.conversations: dict[int, pricing.ConversationCost] = {}
        self._http_client = http_client
        self._api_key = api_key
        self._client: Any = None
        self._metrics_client: Any = None
        self._memory: MemoryReading | None = None
        self._memory_at = 0.0

    # --- clients ---------------------------------------------------------------------------------------------------

    def _timeout(self) -> Any:
        import httpx2

        return httpx2.Timeout(self.timeout_s, connect=min(CONNECT_TIMEOUT_S, self.timeout_s))

    def client(self) -> Any:
        if self._client is None:
            # max_retries=0: a 429 or a dead server is reported at once, with the wait the server asked for.
            common: dict[str, Any] = {"timeout": self._timeout(), "max_retries": 0}
            if self._http_client is not None:
                common["http_client"] = self._http_client
            if self.engine.kind == "anthropic":
                import anthropic

                self._client = anthropic.Anthropic(
                    api_key=self._api_key or "no-key", base_url=self.engine.base_url, **common
                )
            else:
                import openai

                # The client refuses api_key=None; local servers accept any key.
                self._client = openai.OpenAI(api_key=self._api_key or "no-key", base_url=self.engine.base_url, **common)
        return self._client

    def list_models(self) -> list[str]:
        """GET /v1/models; HearthError with one sentence on failure."""
        try:
            page = self.client().models.list()
            return sorted(str(m.id) for m in page)
        except Exception as exc:
            raise HearthError(explain(exc, self.engine, self.model, self.timeout_s)) from None

    # --- ChatBackend ---------------------------------------------------------------------------------------------

    def count_tokens(self, text: str) -> int:
        # No tokenizer for a remote model: about 4 characters a token, for the context bar only.
        return max(1, (len(text) + 3) // 4) if text else 0

    def generate(self, request: ReplyRequest, cancel: threading.Event) -> Iterator[Event]:
        """Opens the stream now (so a bad key, an unknown model or a dead server raise HearthError before the
        first event); the returned iterator yields PromptEvent, TokenEvent…, StatsEvent, DoneEvent."""
        model = request.model or self.model
        started = time.perf_counter()
        prompt = PromptEvent(
            estimate_context(request.messages, request.assistant_prefix, self.count_tokens, self.info.context_window)
        )
        cached = self._cached_reply(request, model)
        if cached is not None:
            return itertools.chain((prompt,), self._replay(cached, started))
        try:
            stream = self._open(request, model)
        except Exception as exc:
            raise HearthError(explain(exc, self.engine, model, self.timeout_s)) from None
        return itertools.chain((prompt,), self._stream(stream, request, model, cancel, started))

    def _messages(self, request: ReplyRequest) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = [m.as_template_dict() for m in request.messages]
        if request.assistant_prefix:
            messages.append({"role": "assistant", "content": request.assistant_prefix})
        return messages

    def _open(self, request: ReplyRequest, model: str) -> Any:
        params = request.params
        if self.engine.kind == "anthropic":
            system = "\n\n".join(m.content for m in request.messages if m.role == "system")
            kwargs: dict[str, Any] = {
                "model": model,
                "max_tokens": params.max_new_tokens or ANTHROPIC_DEFAULT_MAX_TOKENS,
                "messages": [m for m in self._messages(request) if m["role"] != "system"],
                "stream": True,
            }
            if system:
                kwargs["system"] = system
            if request.stop:
                kwargs["stop_sequences"] = list(request.stop)
            return self.client().messages.create(**kwargs)
        body: dict[str, Any] = {
            "model": model,
            "messages": self._messages(request),
            "stream": True,
            "max_tokens": params.max_new_tokens,  # always bounded: a missing max_tokens lets a reply run away
            "temperature": params.temperature,
            "top_p": params.top_p,
        }
        if params.seed is not None:
            body["seed"] = params.seed
        if request.stop:
            body["stop"] = list(request.stop)
        if request.tools:
            body["tools"] = list(request.tools)
        if request.response_format.kind != "text":
            fmt: dict[str, Any] = {"type": request.response_format.kind}
            if request.response_format.kind == "json_schema":
                fmt["json_schema"] = {
                    "name": request.response_format.name or "reply",
                    "schema": request.response_format.json_schema or {},
                }
            body["response_format"] = fmt
        if self.engine.include_usage:
            body["stream_options"] = {"include_usage": True}
        return self.client().chat.completions.create(**body)

    def _watch(self, stream: Any, cancel: threading.Event, finished: threading.Event) -> None:
        """Close the connection the moment Stop is pressed, even while the client blocks waiting for a chunk:
        closing the response object alone does not wake a blocked read, so the socket is shut down too."""
        while not finished.is_set():
            if cancel.wait(0.05):
                response = getattr(stream, "response", None)
                network = getattr(response, "extensions", {}).get("network_stream")
                sock = network.get_extra_info("socket") if network is not None else None
                if sock is not None:
                    with contextlib.suppress(OSError):  # already closed
                        sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(Exception):  # closing an already-closed response
                    stream.close()
                return

    def _stream(
        self, stream: Any, request: ReplyRequest, model: str, cancel: threading.Event, started: float
    ) -> Iterator[Event]:
        reply = _Reply()
        finished = threading.Event()
        watcher = threading.Thread(target=self._watch, args=(stream, cancel, finished), daemon=True)
        watcher.start()
        error: str | None = None
        read = self._read_anthropic if self.engine.kind == "anthropic" else self._read_openai
        try:
            for piece in read(stream, reply, cancel):
                yield TokenEvent(piece)
        except Exception as exc:
            if not cancel.is_set():
                error = explain(exc, self.engine, model, self.timeout_s, mid_reply=True)
                log.info("remote reply failed: %s", error)
        finally:
            finished.set()
            with contextlib.suppress(Exception):
                stream.close()
        ended = time.perf_counter()
        self.last_timings = reply.timings
        self.last_tool_calls = [reply.tool_calls[i] for i in sorted(reply.tool_calls)]
        finish: FinishReason
        if cancel.is_set():
            finish = "cancelled"
        elif error is not None:
            finish = "error"
        elif reply.finish is None:
            finish, error = (
                "error",
                (
                    f"Engine {self.engine.name!r} ended the stream before the reply finished "
                    "(no finish reason); the partial reply was kept."
                ),
            )
        else:
            finish = "length" if reply.finish in ("length", "max_tokens") else "stop"
        stats = self._stats(request, model, reply, started, ended)
        yield StatsEvent(stats)
        notices = tuple(f"The model asked to call {call['name']}({call['arguments']})" for call in self.last_tool_calls)
        if finish in ("stop", "length"):
            self._store_cached(request, model, reply, finish)
        yield DoneEvent(finish, reply.text, error=error, notices=notices)

    # --- reading the two stream shapes ---------------------------------------------------------------------------

    def _read_openai(self, stream: Any, reply: _Reply, cancel: threading.Event) -> Iterator[str]:
        for chunk in stream:
            if cancel.is_set():
                return
            usage = getattr(chunk, "usage", None)
            if usage is not None:  # the last chunk (choices: []) or, on some servers, the one with finish_reason
                reply.prompt_tokens = getattr(usage, "prompt_tokens", None)
                reply.completion_tokens = getattr(usage, "completion_tokens", None)
                details = getattr(usage, "prompt_tokens_details", None)
                cached = getattr(details, "cached_tokens", None) if details is not None else None
                if cached is not None:
                    reply.cached_tokens = cached
            extra = getattr(chunk, "model_extra", None) or {}
            if isinstance(extra.get("timings"), dict):
                t = extra["timings"]
                reply.timings = ServerTimings(
                    t.get("cache_n"), t.get("prompt_n"), t.get("predicted_n"),
                    t.get("prompt_per_second"), t.get("predicted_per_second"),
                )  # fmt: skip
            for choice in chunk.choices or ():
                delta = choice.delta
                for call in getattr(delta, "tool_calls", None) or ():
                    slot = reply.tool_calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                    slot["id"] += call.id or ""
                    if call.function is not None:
                        slot["name"] += call.function.name or ""
                        slot["arguments"] += call.function.arguments or ""
                text = getattr(delta, "content", None)
                if text:
                    reply.add_text(text)
                    yield text
                if choice.finish_reason:
                    reply.finish = choice.finish_reason

    def _read_anthropic(self, stream: Any, reply: _Reply, cancel: threading.Event) -> Iterator[str]:
        for event in stream:
            if cancel.is_set():
                return
            kind = getattr(event, "type", "")
            if kind == "message_start":
                usage = event.message.usage
                cache_read = getattr(usage, "cache_read_input_tokens", None) or 0
                cache_write = getattr(usage, "cache_creation_input_tokens", None) or 0
                # Anthropic counts input_tokens without the cached ones; Hearth's prompt_tokens include them.
                reply.prompt_tokens = (usage.input_tokens or 0) + cache_read + cache_write
                reply.cached_tokens = cache_read
            elif kind == "content_block_delta":
                text = getattr(event.delta, "text", None)
                if text:
                    reply.add_text(text)
                    yield text
            elif kind == "message_delta":
                reply.finish = getattr(event.delta, "stop_reason", None) or reply.finish
                output = getattr(event.usage, "output_tokens", None)
                if output is not None:
                    reply.completion_tokens = output

    # --- stats, cost, memory -------------------------------------------------------------------------------------

    def _stats(self, request: ReplyRequest, model: str, reply: _Reply, started: float, ended: float) -> ReplyStats:
        first = reply.first_at or ended
        last = reply.last_at or ended
        generated = reply.completion_tokens if reply.completion_tokens is not None else reply.chunks
        timings = reply.timings
        prompt = reply.prompt_tokens
        cached = reply.cached_tokens
        if timings is not None:
            if cached is None and timings.cache_n is not None:
                cached = timings.cache_n
            if prompt is None and timings.prompt_n is not None:
                prompt = timings.prompt_n + (timings.cache_n or 0)
        notes = []
        if reply.prompt_tokens is None and reply.completion_tokens is None:
            notes.append("the server sent no token counts: generated = chunks received")
        if timings is not None and timings.predicted_per_second:
            notes.append(f"server: decode {timings.predicted_per_second:.1f} tok/s")
        ttft = first - started
        decode_s = max(last - first, 1e-9)
        prompt_n = prompt or 0
        cached_n = min(cached or 0, prompt_n)
        stats = ReplyStats(
            ttft_s=ttft,
            prompt_tokens=prompt_n,
            cached_tokens=cached_n,
            prefill_tokens_per_s=(prompt_n - cached_n) / ttft if ttft > 0 else 0.0,  # includes the network
            decode_tokens_per_s=max(generated - 1, 0) / decode_s if generated > 1 else 0.0,
            generated_tokens=generated,
            prefill_s=ttft,
            decode_s=decode_s if generated > 1 else 0.0,
            peak_memory_bytes=0,
            memory_device="remote",
            decode_path="remote",
            decode_path_note="; ".join(notes),
            context_window=self.info.context_window,
        )
        history = self._history_tokens(request, prompt_n)
        cost = pricing.try_price_reply(
            pricing.TokenUsage(prompt_n, cached_n, generated, history), model, self.engine.price_provider
        )
        if cost is None:
            return stats
        ledger = self.conversations.setdefault(request.conversation_id or 0, pricing.ConversationCost())
        ledger.add(cost)
        return replace(stats, cost=replace(cost, conversation_total_usd=ledger.total_usd).to_dict())

    def _history_tokens(self, request: ReplyRequest, prompt_tokens: int) -> int:
        """Prompt tokens that were not the new turn: the whole prompt minus the last user message, estimated in
        proportion to characters (the server's tokenizer is not here)."""
        messages = list(request.messages)
        if not messages or prompt_tokens <= 0:
            return 0
        total = sum(len(m.content) + 16 for m in messages)  # ~4 tokens of role markup per message
        last = len(messages[-1].content) + 16 if messages[-1].role == "user" else 0
        return round(prompt_tokens * (total - last) / total) if total else 0

    def memory(self) -> MemoryReading:
        """What the server says about its memory: vLLM's KV-cache use from /metrics, else that it is remote. The
        window asks a few times a second while a reply streams: /metrics is read at most every METRICS_EVERY_S."""
        now = time.monotonic()
        if self._memory is not None and now - self._memory_at < METRICS_EVERY_S:
            return self._memory
        note = f"remote: {self.engine.name} ({self.engine.base_url}); the server does not report its memory"
        if self.engine.kind == "openai-compatible":
            usage = self._kv_cache_usage()
            if usage is not None:
                note = f"remote: {self.engine.name} KV cache {usage * 100:.0f}% used (server /metrics)"
        self._memory, self._memory_at = MemoryReading((DeviceMemory("remote", 0, 0, 0, 0),), remote=note), now
        return self._memory

    def _kv_cache_usage(self) -> float | None:
        import httpx2

        root = re.sub(r"/v1/?$", "", self.engine.base_url.rstrip("/"))
        try:
            if self._metrics_client is None:
                self._metrics_client = self._http_client or httpx2.Client(timeout=2.0)
            response = self._metrics_client.get(f"{root}/metrics", timeout=2.0)
            if response.status_code != 200:
                return None
            return parse_kv_cache_usage(response.text)
        except Exception:  # /metrics is optional: no reading is not an error
            return None

    def forget(self, conversation_id: int) -> None:
        self.conversations.pop(conversation_id, None)

    def close(self) -> None:
        if self._metrics_client is not None and self._metrics_client is not self._http_client:
            with contextlib.suppress(Exception):
                self._metrics_client.close()
        self._metrics_client = None
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None

    # --- response cache (greedy replies, engines that allow it) ----------------------------------------------------

    def _cache_key(self, request: ReplyRequest, model: str) -> str | None:
        if self.response_cache is None or not request.use_response_cache or not request.params.greedy:
            return None
        from app.core.chat.response_cache import cache_key

        prompt = [ord(c) for c in json.dumps(self._messages(request), sort_keys=True)]
        params = request.params.to_dict() | {"stop": list(request.stop)}
        return cache_key(f"remote:{self.engine.base_url}", model, prompt, params)

    def _cached_reply(self, request: ReplyRequest, model: str) -> Any:
        key = self._cache_key(request, model)
        return self.response_cache.get(key) if key is not None else None

    def _store_cached(self, request: ReplyRequest, model: str, reply: _Reply, finish: str) -> None:
        key = self._cache_key(request, model)
        if key is not None and reply.pieces:
            from app.core.chat.response_cache import CachedReply

            self.response_cache.put(key, CachedReply(list(reply.pieces), finish, len(reply.pieces)))

    def _replay(self, cached: Any, started: float) -> Iterator[Event]:
        for piece in cached.pieces:
            yield TokenEvent(piece)
        elapsed = time.perf_counter() - started
        yield StatsEvent(
            ReplyStats(elapsed, 0, 0, 0.0, 0.0, cached.generated_tokens, 0.0, 0.0, 0, "remote",
                       from_response_cache=True, decode_path="remote",
                       context_window=self.info.context_window)
        )  # fmt: skip
        yield DoneEvent(cached.finish_reason, cached.text)


_KV_METRIC = re.compile(r"^vllm:(?:gpu_cache_usage_perc|kv_cache_usage_perc)(?:\{[^}]*\})?\s+([0-9.eE+-]+)", re.M)


def parse_kv_cache_usage(metrics_text: str) -> float | None:
    """vLLM's KV-cache use (0..1) from Prometheus text; the mean over engines when there are several."""
    values = [float(v) for v in _KV_METRIC.findall(metrics_text)]
    return sum(values) / len(values) if values else None


ProbeCallback = Callable[[str], None]


def probe_engine(backend: RemoteBackend, progress: ProbeCallback | None = None) -> tuple[list[str], str]:
    """`hearth engines test`: GET /v1/models, then a tiny completion; returns (models, the reply's first words)."""
    say = progress or (lambda _line: None)
    if backend.engine.kind == "anthropic":
        models = [backend.model]  # listing needs a beta endpoint on some accounts: the completion proves access
    else:
        models = backend.list_models()
        say(f"GET /v1/models: {len(models)} model{'s' if len(models) != 1 else ''}")
    from app.core.chat.sampling import SamplingParams

    request = ReplyRequest(
        (ChatMessage("user", "Say OK."),), params=SamplingParams(temperature=0.0, max_new_tokens=8),
        use_response_cache=False,
    )  # fmt: skip
    done: DoneEvent | None = None
    for event in backend.generate(request, threading.Event()):
        if isinstance(event, DoneEvent):
            done = event
    if done is None or done.finish_reason == "error":
        raise HearthError(done.error if done is not None and done.error else "The test completion did not finish.")
    return models, done.text
