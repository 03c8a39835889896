"""Hearth as the remote engine of another Hearth: `hearth serve`'s server (ServerHandle over the real default model)
driven by RemoteBackend, the way a second machine's window or `hearth chat --engine` would."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from app.core.chat.events import ChatMessage, DoneEvent, PromptEvent, StatsEvent, TokenEvent
from app.core.chat.sampling import SamplingParams
from app.core.engines.backend import ReplyRequest
from app.core.engines.local import EngineBackend
from app.core.engines.remote.backend import RemoteBackend
from app.core.engines.remote.engines import EngineConfig
from app.core.engines.session import ChatSession
from app.core.server import ServerConfig, ServerHandle

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)


@pytest.fixture
def other_hearth(default_loaded: Any) -> Iterator[RemoteBackend]:
    handle = ServerHandle(ServerConfig(port=0))
    address = handle.start(EngineBackend(default_loaded))
    try:
        yield RemoteBackend(EngineConfig("other-hearth", base_url=address), "hearth")
    finally:
        handle.stop()


def test_a_conversation_with_another_hearth_reuses_its_cache(other_hearth: RemoteBackend) -> None:
    session = ChatSession(other_hearth, system_prompt="You are concise.", params=GREEDY)
    first = list(session.ask("What is the capital of France?"))
    assert isinstance(first[0], PromptEvent) and isinstance(first[-1], DoneEvent)
    assert "Paris" in first[-1].text
    list(session.ask("And of Italy?"))
    stats = session.last_stats
    assert stats is not None
    # The serving Hearth kept the first turn's KV cache and says so in usage.prompt_tokens_details.cached_tokens.
    assert 0 < stats.stats.cached_tokens < stats.stats.prompt_tokens
    assert stats.stats.generated_tokens > 0 and stats.stats.decode_path == "remote"
    assert "server: decode" in stats.stats.decode_path_note  # llama-server-style `timings`, read back


def test_stop_ends_the_reply_on_both_sides(other_hearth: RemoteBackend) -> None:
    cancel = threading.Event()
    request = ReplyRequest(
        (ChatMessage("user", "Count from 1 to 200, one number per line."),),
        SamplingParams(temperature=0.0, max_new_tokens=300),
    )
    events = other_hearth.generate(request, cancel)
    assert isinstance(next(events), PromptEvent)
    assert isinstance(next(events), TokenEvent)
    cancel.set()
    rest = list(events)
    done = rest[-1]
    assert isinstance(done, DoneEvent) and done.finish_reason == "cancelled"
    stats = next(e.stats for e in rest if isinstance(e, StatsEvent))
    assert stats.generated_tokens < 300
