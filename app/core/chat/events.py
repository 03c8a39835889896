"""Typed events the engine yields: the one stream every front end consumes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

FinishReason = Literal["stop", "length", "cancelled", "error"]


@dataclass(frozen=True)
class ContextUsage:
    """How the context window is spent, in tokens."""

    system: int
    history: int
    current: int
    reply: int
    window: int

    @property
    def used(self) -> int:
        return self.system + self.history + self.current + self.reply

    def with_reply(self, reply: int) -> ContextUsage:
        return ContextUsage(self.system, self.history, self.current, reply, self.window)


@dataclass(frozen=True)
class PromptEvent:
    """The prompt as the model will see it, before the first token: how it fills the context window."""

    usage: ContextUsage
    dropped_turns: int = 0
    type: Literal["prompt"] = "prompt"


@dataclass(frozen=True)
class TokenEvent:
    """A decoded piece of text; never splits a multi-byte character."""

    text: str
    token_count: int = 1
    type: Literal["token"] = "token"


@dataclass(frozen=True)
class ReplyStats:
    ttft_s: float
    prompt_tokens: int
    cached_tokens: int  # prompt tokens whose KV was reused, not prefilled again
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    generated_tokens: int
    prefill_s: float
    decode_s: float
    peak_memory_bytes: int
    memory_device: str
    from_response_cache: bool = False
    dropped_turns: int = 0
    decode_path: str = "eager"
    decode_path_note: str = ""
    context_window: int = 0
    # What the reply cost, an estimate (app.core.engines.remote.pricing.ReplyCost.to_dict); None = not priced.
    cost: dict[str, Any] | None = None
    # of cached_tokens, those read back from the prompt cache on disk (a document asked about again after a restart)
    restored_tokens: int = 0
    restore_s: float = 0.0
    # Prompt-lookup decoding (app.core.engines.lookup): "on", "off (why)", or "" where the engine has none; the
    # forwards that checked guesses, the guesses checked and those the model's own picks matched.
    lookup: str = ""
    lookup_checks: int = 0
    lookup_proposed: int = 0
    lookup_accepted: int = 0

    @property
    def new_prompt_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReplyStats:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


@dataclass(frozen=True)
class StatsEvent:
    stats: ReplyStats
    type: Literal["stats"] = "stats"


@dataclass(frozen=True)
class DoneEvent:
    finish_reason: FinishReason
    text: str  # the whole reply, also when cancelled (the partial reply is kept)
    error: str | None = None
    notices: tuple[str, ...] = ()  # e.g. a damaged cache entry dropped while answering: shown, never fatal
    type: Literal["done"] = "done"


Event = PromptEvent | TokenEvent | StatsEvent | DoneEvent


def event_to_json(event: Event) -> dict[str, Any] | None:
    """The public `--json` schema (documented in the README); None for events it leaves out (the prompt's
    context split, which the window's context bar shows)."""
    if isinstance(event, PromptEvent):
        return None
    if isinstance(event, TokenEvent):
        return {"type": "token", "text": event.text}
    if isinstance(event, StatsEvent):
        return {"type": "stats", **event.stats.to_dict()}
    data: dict[str, Any] = {"type": "done", "finish_reason": event.finish_reason}
    if event.error:
        data["error"] = event.error
    if event.notices:
        data["notices"] = list(event.notices)
    return data


@dataclass
class ChatMessage:
    role: Literal["system", "user", "assistant", "tool"]  # "tool": a tool's result, for the API server
    content: str
    extra: dict[str, Any] = field(default_factory=dict)

    def as_template_dict(self) -> dict[str, Any]:
        """Role and content, plus what tool-capable templates read: an assistant's tool_calls, a tool result's id."""
        data: dict[str, Any] = {"role": self.role, "content": self.content}
        for key in TEMPLATE_EXTRAS:
            if key in self.extra:
                data[key] = self.extra[key]
        return data


TEMPLATE_EXTRAS = ("tool_calls", "tool_call_id", "name")
