"""Batched decode: several replies' next tokens in one forward, every weight block read once for all of them.

A reply asked for batched (ReplyEngine.reply_steps) runs as usual up to its first token, then, instead of computing
each decode step itself, yields a DecodeStep and waits. Whoever drives the replies (app.core.server.queue) collects
the pending step of each running reply, has the engine run them together (decode_batch), and resumes each reply with
its row of logits. So new requests join after their prefill, finished ones leave, and each reply keeps its own KV
cache, sampler, stop strings and cancel check (within one token). Torch-free.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from app.core.chat.events import Event
from app.core.engines.backend import ModelInfo, ReplyRequest

DEFAULT_PARALLEL = 4  # replies a server decodes together where the model can (llama-server's --parallel)
MAX_PARALLEL = 16  # the most `hearth serve --parallel` and `hearth plan --parallel` take


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


ReplyItem = Event | DecodeStep


class NoRoomYet(Exception):
    """Raised by a batched model before a reply's first item: the KV memory the running replies have reserved leaves
    no room for this one's; the queue starts it once one of them has ended (alone, a reply always starts)."""


@runtime_checkable
class BatchedModel(Protocol):
    """A served model whose replies can be decoded together: `max_batch` of them at most (its KV caches' memory)."""

    info: ModelInfo
    max_batch: int

    def reply_steps(self, request: ReplyRequest, cancel: Any) -> Iterator[ReplyItem]: ...

    def decode_batch(self, steps: Sequence[DecodeStep]) -> None: ...
