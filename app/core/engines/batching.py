"""Batched decode: several replies' next tokens in one forward, every weight block read once for all of them.

A reply asked for batched (ReplyEngine.reply_steps) computes none of its model steps itself: it yields its prompt as
a PrefillStep and each decode step as a DecodeStep, and waits. Whoever drives the replies (app.core.server.queue)
collects the pending step of each running reply, has the engine run them together (decode_batch), and resumes each
reply with its logits. So a new request's prompt runs in the same forward as the running replies' next tokens (a
chunk of it per step while others decode, so their streams never stall behind a long prompt), finished ones leave,
and each reply keeps its own KV cache, sampler, stop strings and cancel check (within one token). Torch-free.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from app.core.chat.events import Event
from app.core.engines.backend import ModelInfo, ReplyRequest

# Prompt tokens one batched step runs beside other replies' decode tokens: their next token waits for the whole
# forward, so a long prompt is cut in chunks of this many (the running replies' streams slow, never stall); a step of
# prompts alone takes PREFILL_CHUNK tokens, as a reply alone does.
PROMPT_TOKENS_BESIDE_DECODE = 32


@dataclass(eq=False)
class DecodeStep:
    """One reply's next decode step: run `token` on top of `kv`; the driver sets `logits` before resuming it.
    `lookup`: the reply's prompt-lookup decoder (app.core.engines.lookup), where the engine has one: a reply
    running alone checks its guesses as in a chat, and in a batch a guess its last check confirmed needs no row."""

    token: int
    kv: Any
    logits: Any = None
    lookup: Any = None

    def result(self) -> Any:
        if self.logits is None:
            raise RuntimeError("a batched reply was resumed before its decode step ran")
        return self.logits


@dataclass(eq=False)
class PrefillStep:
    """A batched reply's prompt tokens not yet run, on top of `kv`: the driver runs the first `ran` of them with the
    other replies' steps, and the reply yields the rest again. `logits`: after the last token, once all have run."""

    tokens: list[int]
    kv: Any
    ran: int = 0
    logits: Any = None


BatchStep = DecodeStep | PrefillStep
ReplyItem = Event | DecodeStep | PrefillStep


def prompt_takes(steps: Sequence[BatchStep], alone: int) -> list[int]:
    """How many prompt tokens each PrefillStep among `steps` runs in this step (0 for a DecodeStep): in the order
    given, PROMPT_TOKENS_BESIDE_DECODE in all where decode tokens run too, `alone` (the engine's prefill chunk) where
    only prompts do; the first prompt always runs at least one token."""
    budget = PROMPT_TOKENS_BESIDE_DECODE if any(isinstance(step, DecodeStep) for step in steps) else alone
    takes = []
    for step in steps:
        take = min(len(step.tokens), budget) if isinstance(step, PrefillStep) else 0
        budget -= take
        takes.append(take)
    return takes


class NoRoomYet(Exception):
    """Raised by a batched model before a reply's first item: the KV memory the running replies have reserved leaves
    no room for this one's; the queue starts it once one of them has ended (alone, a reply always starts)."""


@runtime_checkable
class BatchedModel(Protocol):
    """A served model whose replies can be decoded together: `max_batch` of them at most (its KV caches' memory)."""

    info: ModelInfo
    max_batch: int

    def reply_steps(self, request: ReplyRequest, cancel: Any) -> Iterator[ReplyItem]: ...

    def decode_batch(self, steps: Sequence[BatchStep]) -> None: ...
