"""What the GUI's worker thread drives: a chat backend that streams typed events, plus the plain data it reports.

Torch-free on purpose: the window imports this module before any model library is loaded. The real backend
(app.core.engines.local) imports torch and is only reached from inside the worker thread; the scripted one
here streams canned replies for tests, benchmarks and screenshots through exactly the same events.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

from app.core.chat.events import (
    ChatMessage,
    ContextUsage,
    DoneEvent,
    Event,
    FinishReason,
    PromptEvent,
    ReplyStats,
    StatsEvent,
    TokenEvent,
)
from app.core.chat.sampling import SamplingParams
from app.core.memory.types import DeviceMemory
from app.core.models.quant import Quantization

if TYPE_CHECKING:
    from app.core.settings import Settings

ProgressCallback = Callable[[str, float | None], None]


CPU_NOTICE = "Running on the CPU: {reason}. Replies will be much slower than on a GPU."  # `--device auto`, no GPU
_ENGINE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")  # app.core.engines.remote.engines' rule for names


@dataclass(frozen=True)
class RemoteModel:
    """A model served by a registered remote engine: the model bar lists it as "MODEL @ ENGINE", and the remote
    backend's ModelInfo.name (what each reply is stored under) is the same label."""

    engine: str  # a name in the engines registry (app.core.engines.remote.engines)
    model: str  # the server's model id

    SEPARATOR: ClassVar[str] = " @ "

    @property
    def label(self) -> str:
        return f"{self.model}{self.SEPARATOR}{self.engine}"

    @classmethod
    def parse(cls, text: str) -> RemoteModel | None:
        """ "llama3 @ my-vllm" -> RemoteModel("my-vllm", "llama3"); None for anything else (a local model spec)."""
        model, separator, engine = text.strip().rpartition(cls.SEPARATOR)
        if not separator or not model.strip() or not _ENGINE_NAME.match(engine.strip()):
            return None
        return cls(engine.strip(), model.strip())


@dataclass(frozen=True)
class LoadRequest:
    """Every option of one model load: the window's worker and the command line both hand one to
    app.core.engines.opening.open_backend. The worker never re-reads the settings file behind the window's back."""

    model: str | None  # None = the embedded default
    quantization: Quantization = "auto"
    device: str = "auto"
    context_length: int | None = None
    allow_pickle: bool = False
    trust_remote_code: bool = False
    ignore_fit: bool = False  # load even when the memory planner says it will not fit (a per-load choice)
    response_cache: bool = True
    prompt_cache_gib: float = 4.0  # prompts' KV blocks on disk, at most this much (0: off)
    prompt_lookup: bool = True  # prompt-lookup decoding where it measures faster (app.core.engines.lookup)
    # A remote engine's model instead of a local one (then `model`, quantization and device are not used, and
    # context_length, when set, is the window the context gauge shows: remote servers do not report theirs).
    remote: RemoteModel | None = None

    @classmethod
    def from_settings(cls, settings: Settings, **choices: Any) -> LoadRequest:
        """The settings' load options (every field named alike), then `choices` (a flag, the model bar's picks).
        A default model spelled "MODEL @ ENGINE" is that engine's model."""
        saved = {item.name: getattr(settings, item.name) for item in fields(cls) if hasattr(settings, item.name)}
        remote = RemoteModel.parse(settings.model) if settings.model else None
        if remote is not None:
            saved |= {"model": None, "remote": remote}
        return cls(**(saved | choices))


@dataclass(frozen=True)
class ModelInfo:
    name: str
    quantization: str
    device: str
    context_window: int
    load_seconds: float = 0.0
    notices: tuple[str, ...] = ()
    recovered: tuple[str, ...] = ()  # damaged derived files moved aside and rebuilt at load: the banner shows them
    tokenizer_file: str | None = None  # tokenizer.json, for torch-free token counts in the GUI
    # Served replies: how many the runtime decodes together (1: one at a time), and the KV cache they may reserve in
    # all (0: no limit of their own) at so many bytes a token. The window's Server tab shows what that allows.
    served_together: int = 1
    served_kv_budget_bytes: int = 0
    kv_bytes_per_token: int = 0


@dataclass(frozen=True)
class MemoryReading:
    devices: tuple[DeviceMemory, ...]
    kv_bytes_per_token: int = 0
    forecast_kv_full_at_tokens: int | None = None  # context length at which the KV cache would fill memory
    remote: str = ""  # a remote engine: what its server reports (e.g. "vLLM KV cache 12% used"), else why not
    prompt_cache_bytes: int | None = None  # the prompt cache on disk (None: this engine keeps none)


@dataclass(frozen=True)
class ResponseFormat:
    """OpenAI's `response_format`: free text, any JSON object, or JSON matching a schema (enforced while decoding)."""

    kind: Literal["text", "json_object", "json_schema"] = "text"
    json_schema: dict[str, Any] | None = None
    name: str = ""


@dataclass(frozen=True)
class ReplyRequest:
    """One reply to generate, spelled once: every front end (window, command line, API server) builds one and every
    backend (local engine, remote engine, scripted) takes one."""

    messages: Sequence[ChatMessage]  # kept as a tuple
    params: SamplingParams = field(default_factory=SamplingParams)
    conversation_id: int | None = None  # the local KV cache slot; None = reuse whichever cached prefix matches
    assistant_prefix: str = ""  # continue this reply
    context_policy: str = "error"  # or "drop-oldest"
    use_response_cache: bool = True
    stop: Sequence[str] = ()  # stop sequences (not included in the reply)
    response_format: ResponseFormat = field(default_factory=ResponseFormat)
    tools: Sequence[dict[str, Any]] = ()  # OpenAI-style tool definitions
    # Tools on a chat template without them: the documented fallback prompt (app.core.engines.tool_prompt) when
    # True, else refused (`hearth serve --strict-tools`).
    tool_prompt_fallback: bool = True
    model: str | None = None  # a remote engine's model id; local backends serve the model they loaded
    raw_prompt: str | None = None  # /v1/completions: this text as the whole prompt, no chat template

    def __post_init__(self) -> None:
        # Callers pass lists; the request stays immutable and hashable-by-identity either way.
        object.__setattr__(self, "messages", tuple(self.messages))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "tools", tuple(self.tools))


def estimate_context(
    messages: Sequence[ChatMessage], assistant_prefix: str, count_tokens: Callable[[str], int], window: int
) -> ContextUsage:
    """The context split from per-message counts, for backends that never tokenize the whole prompt (remote
    engines, the scripted model); the local engine reports the exact split of the prompt it built."""
    system = sum(count_tokens(m.content) for m in messages if m.role == "system")
    last_user = next((m for m in reversed(messages) if m.role == "user"), None)
    current = count_tokens(last_user.content) if last_user else 0
    others = sum(count_tokens(m.content) for m in messages if m.role != "system") - current
    return ContextUsage(system, others, current, count_tokens(assistant_prefix), window)


class ChatBackend(Protocol):
    """A loaded model the worker thread drives; one thread calls it at a time."""

    info: ModelInfo

    def generate(self, request: ReplyRequest, cancel: threading.Event) -> Iterator[Event]:
        """PromptEvent, TokenEvent…, StatsEvent, DoneEvent; raises HearthError at the call (before any event) for
        the user's errors: a prompt that does not fit, an unknown remote model, a bad key."""
        ...

    def count_tokens(self, text: str) -> int: ...

    def memory(self) -> MemoryReading: ...

    def forget(self, conversation_id: int) -> None:
        """Drop the conversation's KV cache (deleted conversation)."""
        ...

    def close(self) -> None: ...


BackendFactory = Callable[[LoadRequest, ProgressCallback, threading.Event], ChatBackend]


@dataclass
class ScriptedBackend:
    """A fake model: replies with scripted text, token by token, checking cancel before each one.

    `replies` are used in turn (the last one repeats); `tokens_per_s` paces the stream (0 = as fast as possible);
    `error_before_first` raises that exception from generate, like the engine's ContextOverflowError;
    `fail_mid_stream` ends the reply with DoneEvent('error') after that many tokens.
    """

    replies: list[str] = field(default_factory=lambda: ["Hello! How can I help?"])
    tokens_per_s: float = 0.0
    context_window: int = 2048
    name: str = "Scripted model"
    error_before_first: Exception | None = None
    fail_mid_stream: int | None = None
    weights_bytes: int = 270 * 2**20
    kv_bytes_per_token: int = 23_040
    calls: list[list[ChatMessage]] = field(default_factory=list)
    requests: list[ReplyRequest] = field(default_factory=list)
    prefixes: list[str] = field(default_factory=list)
    info: ModelInfo = field(init=False)
    _kv_tokens: dict[int, int] = field(default_factory=dict)
    _turn: int = 0

    def __post_init__(self) -> None:
        self.info = ModelInfo(self.name, "bf16", "cpu", self.context_window)

    @staticmethod
    def split_tokens(text: str) -> list[str]:
        """Word-ish pieces that keep the spaces, so joining them gives back the text."""
        pieces: list[str] = []
        current = ""
        for char in text:
            if char in " \n" and current.strip():
                pieces.append(current)
                current = ""
            current += char
        if current:
            pieces.append(current)
        return pieces

    def count_tokens(self, text: str) -> int:
        return len(self.split_tokens(text))

    def generate(self, request: ReplyRequest, cancel: threading.Event) -> Iterator[Event]:
        self.requests.append(request)
        self.calls.append(list(request.messages))
        self.prefixes.append(request.assistant_prefix)
        if self.error_before_first is not None:
            raise self.error_before_first
        reply = self.replies[min(self._turn, len(self.replies) - 1)]
        self._turn += 1
        return self._stream(request, cancel, reply)

    def _stream(self, request: ReplyRequest, cancel: threading.Event, reply: str) -> Iterator[Event]:
        started = time.perf_counter()
        messages, params = request.messages, request.params
        conversation_id = request.conversation_id if request.conversation_id is not None else 0
        yield PromptEvent(estimate_context(messages, request.assistant_prefix, self.count_tokens, self.context_window))
        prompt_tokens = sum(self.count_tokens(m.content) + 4 for m in messages)
        prompt_tokens += self.count_tokens(request.raw_prompt or "")
        cached = min(self._kv_tokens.get(conversation_id, 0), max(prompt_tokens - 1, 0))
        pieces: list[str] = []
        finish: FinishReason = "stop"
        interval = 1.0 / self.tokens_per_s if self.tokens_per_s > 0 else 0.0
        next_at = time.perf_counter()
        first_at: float | None = None
        for index, piece in enumerate(self.split_tokens(reply)):
            if cancel.is_set():
                finish = "cancelled"
                break
            if len(pieces) >= params.max_new_tokens:
                finish = "length"
                break
            if self.fail_mid_stream is not None and index >= self.fail_mid_stream:
                yield DoneEvent("error", "".join(pieces), error="RuntimeError: scripted failure")
                return
            if interval:
                next_at += interval
                delay = next_at - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
            pieces.append(piece)
            first_at = first_at or time.perf_counter()
            yield TokenEvent(piece)
        ended = time.perf_counter()
        first_at = first_at or ended
        decode_s = max(ended - first_at, 1e-6)
        self._kv_tokens[conversation_id] = prompt_tokens + len(pieces)
        yield StatsEvent(
            ReplyStats(
                ttft_s=first_at - started,
                prompt_tokens=prompt_tokens,
                cached_tokens=cached,
                prefill_tokens_per_s=max(prompt_tokens - cached, 1) / max(first_at - started, 1e-6),
                decode_tokens_per_s=max(len(pieces) - 1, 0) / decode_s,
                generated_tokens=len(pieces),
                prefill_s=first_at - started,
                decode_s=decode_s,
                peak_memory_bytes=self.weights_bytes,
                memory_device="cpu",
                context_window=self.context_window,
            )
        )
        yield DoneEvent(finish, "".join(pieces))

    def memory(self) -> MemoryReading:
        kv = sum(self._kv_tokens.values()) * self.kv_bytes_per_token
        free = 2 * 2**30
        return MemoryReading(
            (DeviceMemory("cpu", self.weights_bytes, kv, 180 * 2**20, free),),
            kv_bytes_per_token=self.kv_bytes_per_token,
            forecast_kv_full_at_tokens=(kv + free) // self.kv_bytes_per_token,
        )

    def forget(self, conversation_id: int) -> None:
        self._kv_tokens.pop(conversation_id, None)

    def close(self) -> None:
        self._kv_tokens.clear()


def scripted_factory(backend: ScriptedBackend) -> BackendFactory:
    """A factory that 'loads' the given scripted backend (with progress steps, honouring cancel)."""

    def load(request: LoadRequest, progress: ProgressCallback, cancel: threading.Event) -> ChatBackend:
        from app.core.errors import HearthError

        for step in range(4):
            if cancel.is_set():
                raise HearthError("Loading was cancelled.")
            progress("Loading weights", step / 4)
        return backend

    return load
