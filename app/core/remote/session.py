"""A conversation with a remote engine for the command line: the same surface `hearth chat` uses on ChatSession
(ask, reset, messages, system_prompt, params), driving a RemoteBackend through ReplyRequest."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from app.core.backend import ReplyRequest
from app.core.events import ChatMessage, DoneEvent, Event, StatsEvent
from app.core.remote.backend import RemoteBackend
from app.core.sampling import SamplingParams


@dataclass(frozen=True)
class _Loaded:
    display_name: str


@dataclass(frozen=True)
class _EngineView:
    """What `hearth chat` reads from `session.engine` (the local Engine's `loaded.display_name`)."""

    loaded: _Loaded
    backend: RemoteBackend


@dataclass
class RemoteChatSession:
    backend: RemoteBackend
    system_prompt: str | None = None
    params: SamplingParams = field(default_factory=SamplingParams)
    context_policy: str = "error"
    use_response_cache: bool = True
    conversation_id: int = 1
    messages: list[ChatMessage] = field(default_factory=list)
    last_stats: StatsEvent | None = None
    engine: Any = field(init=False)

    def __post_init__(self) -> None:
        self.engine = _EngineView(_Loaded(self.backend.info.name), self.backend)

    def ask(self, text: str, cancel: threading.Event | None = None) -> Iterator[Event]:
        system = [ChatMessage("system", self.system_prompt)] if self.system_prompt else []
        request = ReplyRequest(
            tuple([*system, *self.messages, ChatMessage("user", text)]),
            params=self.params,
            conversation_id=self.conversation_id,
            context_policy=self.context_policy,
            use_response_cache=self.use_response_cache,
        )
        events = self.backend.generate(request, cancel or threading.Event())  # HearthError: the turn did not happen
        self.messages.append(ChatMessage("user", text))
        done: DoneEvent | None = None
        for event in events:
            if isinstance(event, StatsEvent):
                self.last_stats = event
            if isinstance(event, DoneEvent):
                done = event
            yield event
        # As ChatSession: a cancelled reply is kept as it stands; a failed one with no text is not.
        if done is not None and (done.finish_reason != "error" or done.text):
            self.messages.append(ChatMessage("assistant", done.text))

    def reset(self) -> None:
        self.messages.clear()
        self.backend.forget(self.conversation_id)
        self.conversation_id += 1


def open_remote_session(settings: Any, args: Any, params: SamplingParams) -> RemoteChatSession:
    """`hearth chat --engine NAME [--model ID]`: the engine from the registry, its key from the keyring."""
    from app.core.errors import HearthError
    from app.core.remote import engines as registry

    engine = registry.get_engine(args.engine)
    if getattr(args, "attach", None):
        raise HearthError("--attach works with local models only; paste the text into the prompt for a remote engine.")
    model = args.model or engine.default_model
    if not model:
        raise HearthError(
            f"Choose a model for engine {engine.name!r} with --model "
            f"(`hearth engines test {engine.name}` lists them), or set one with `hearth engines add --model`."
        )
    cache = None
    if engine.response_cache and settings.response_cache and not getattr(args, "no_response_cache", False):
        from app.core.response_cache import ResponseCache

        cache = ResponseCache()
    backend = RemoteBackend(engine, model, api_key=registry.key_for(engine), response_cache=cache)
    return RemoteChatSession(
        backend,
        system_prompt=args.system if args.system is not None else settings.system_prompt,
        params=params,
        context_policy=args.context_policy or settings.context_policy,
        use_response_cache=not getattr(args, "no_response_cache", False),
    )
