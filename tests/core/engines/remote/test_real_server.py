"""RemoteBackend against a real OpenAI-compatible server nobody here wrote: `transformers serve`, offline, on
127.0.0.1, serving the default SmolLM2-135M-Instruct."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.core.chat.events import ChatMessage, DoneEvent, PromptEvent, StatsEvent, TokenEvent
from app.core.chat.sampling import SamplingParams
from app.core.engines.backend import ReplyRequest
from app.core.engines.remote.backend import RemoteBackend, probe_engine
from app.core.engines.remote.engines import EngineConfig
from app.core.engines.session import ChatSession
from app.core.errors import HearthError
from tests.helpers.transformers_serve import RunningServer, transformers_serve


@pytest.fixture(scope="module")
def server(default_model_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with transformers_serve(default_model_folder, tmp_path_factory.mktemp("tserve") / "server.log") as running:
        yield running


def backend_for(server: RunningServer, **changes: object) -> RemoteBackend:
    engine = EngineConfig(**({"name": "tserve", "base_url": server.base_url} | changes))  # type: ignore[arg-type]
    return RemoteBackend(engine, server.model)


def greedy(text: str, max_tokens: int) -> ReplyRequest:
    return ReplyRequest((ChatMessage("user", text),), params=SamplingParams(temperature=0.0, max_new_tokens=max_tokens))


def test_lists_the_served_model_and_answers_the_probe(server: RunningServer) -> None:
    backend = backend_for(server)
    assert server.model in backend.list_models()
    models, reply = probe_engine(backend)
    assert server.model in models and reply.strip()


def test_a_streamed_reply_with_usage_and_client_side_timing(server: RunningServer) -> None:
    events = list(backend_for(server).generate(greedy("Count from one to twenty in words.", 6), threading.Event()))
    pieces = [e.text for e in events if isinstance(e, TokenEvent)]
    stats = next(e.stats for e in events if isinstance(e, StatsEvent))
    done = events[-1]
    assert isinstance(done, DoneEvent) and done.finish_reason == "length" and done.text == "".join(pieces)
    assert stats.generated_tokens == 6  # the server's usage.completion_tokens
    assert stats.prompt_tokens > 10 and stats.ttft_s > 0 and stats.decode_tokens_per_s > 0
    assert stats.cost is None  # a local server has no price


def test_same_reply_with_and_without_include_usage(server: RunningServer) -> None:
    with_usage = list(backend_for(server).generate(greedy("Name a colour.", 6), threading.Event()))
    without = list(backend_for(server, include_usage=False).generate(greedy("Name a colour.", 6), threading.Event()))
    assert with_usage[-1] == without[-1]  # greedy: same text, same finish


def test_stop_keeps_the_partial_reply_from_a_real_server(server: RunningServer) -> None:
    cancel = threading.Event()
    stream = backend_for(server).generate(greedy("Write a long story about a dragon.", 400), cancel)
    assert isinstance(next(stream), PromptEvent)  # the context split comes before the first token
    first = next(stream)
    assert isinstance(first, TokenEvent)
    cancel.set()
    rest = list(stream)
    done = rest[-1]
    assert isinstance(done, DoneEvent) and done.finish_reason == "cancelled"
    assert done.text.startswith(first.text)
    stats = next(e.stats for e in rest if isinstance(e, StatsEvent))
    assert stats.generated_tokens < 400


def test_a_multi_turn_session_sends_the_history(server: RunningServer) -> None:
    session = ChatSession(backend_for(server), system_prompt="Be brief.", params=SamplingParams(0.0, max_new_tokens=8))
    first = list(session.ask("My name is Ada."))
    second = list(session.ask("What is my name?"))
    assert isinstance(first[-1], DoneEvent) and isinstance(second[-1], DoneEvent)
    assert [m.role for m in session.messages] == ["user", "assistant", "user", "assistant"]
    s1 = next(e.stats for e in first if isinstance(e, StatsEvent))
    s2 = next(e.stats for e in second if isinstance(e, StatsEvent))
    assert s2.prompt_tokens > s1.prompt_tokens + 5  # turn 2 re-sent turn 1


def test_wrong_base_url_path_is_a_clear_404(server: RunningServer) -> None:
    engine = EngineConfig("tserve", base_url=server.base_url.removesuffix("/v1") + "/nope")
    with pytest.raises(HearthError, match=r"\(404 Not Found"):
        RemoteBackend(engine, server.model).generate(greedy("Hi", 4), threading.Event())
