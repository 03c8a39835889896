"""A conversation driven turn by turn over any ChatBackend: what the command line, benchmarks and tests use.

The backend keeps the conversation's KV cache (local) or the server does (remote); each turn is one ReplyRequest.
The GUI keeps its own message tree (branches) in the history store and builds the same requests in its controller.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from app.core.chat.events import ChatMessage, DoneEvent, Event, StatsEvent
from app.core.chat.sampling import SamplingParams
from app.core.engines.backend import ChatBackend, ReplyRequest


@dataclass
class ChatSession:
    backend: ChatBackend
    system_prompt: str | None = None
    params: SamplingParams = field(default_factory=SamplingParams)
    context_policy: str = "error"
    use_response_cache: bool = True
    conversation_id: int = 1
    messages: list[ChatMessage] = field(default_factory=list)
    last_stats: StatsEvent | None = None

    def _request(self, *, assistant_prefix: str = "", cache: bool = True) -> ReplyRequest:
        system = [ChatMessage("system", self.system_prompt)] if self.system_prompt else []
        return ReplyRequest(
            (*system, *self.messages),
            params=self.params,
            conversation_id=self.conversation_id,
            assistant_prefix=assistant_prefix,
            context_policy=self.context_policy,
            use_response_cache=cache and self.use_response_cache,
        )

    def _stream(
        self, *, assistant_prefix: str = "", cache: bool = True, cancel: threading.Event | None
    ) -> Iterator[Event]:
        request = self._request(assistant_prefix=assistant_prefix, cache=cache)
        done: DoneEvent | None = None
        for event in self.backend.generate(request, cancel or threading.Event()):
            if isinstance(event, StatsEvent):
                self.last_stats = event
            if isinstance(event, DoneEvent):
                done = event
            yield event
        # A cancelled reply is kept as it stands; a failed one with no text is not.
        if done is not None and (done.finish_reason != "error" or done.text):
            self.messages.append(ChatMessage("assistant", assistant_prefix + done.text))

    def ask(self, text: str, cancel: threading.Event | None = None) -> Iterator[Event]:
        self.messages.append(ChatMessage("user", text))
        try:
            yield from self._stream(cancel=cancel)
        except BaseException:
            if self.messages and self.messages[-1].role == "user" and self.messages[-1].content == text:
                self.messages.pop()  # the turn did not happen; the caller still has the text
            raise

    def regenerate(self, cancel: threading.Event | None = None) -> Iterator[Event]:
        """Replace the last reply with a fresh one (never from the response cache)."""
        if self.messages and self.messages[-1].role == "assistant":
            self.messages.pop()
        if not self.messages or self.messages[-1].role != "user":
            raise ValueError("nothing to regenerate: the conversation has no user message")
        yield from self._stream(cache=False, cancel=cancel)

    def edit(self, index: int, text: str, cancel: threading.Event | None = None) -> Iterator[Event]:
        """Replace user message `index`, drop everything after it and answer again."""
        if not 0 <= index < len(self.messages) or self.messages[index].role != "user":
            raise ValueError(f"message {index} is not a user message")
        self.messages[index:] = [ChatMessage("user", text)]
        yield from self._stream(cancel=cancel)

    def continue_reply(self, cancel: threading.Event | None = None) -> Iterator[Event]:
        """Extend the last reply (after it stopped at the length limit)."""
        if not self.messages or self.messages[-1].role != "assistant":
            raise ValueError("there is no reply to continue")
        partial = self.messages.pop().content
        yield from self._stream(assistant_prefix=partial, cancel=cancel)

    def reset(self) -> None:
        """Start over: the old conversation's cache is dropped and the next turn starts a new one."""
        self.messages.clear()
        self.backend.forget(self.conversation_id)
        self.conversation_id += 1
