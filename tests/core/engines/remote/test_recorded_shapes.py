"""RemoteBackend against the recorded contract shapes (tests/fixtures/remote, labelled hand-written), replayed by a
real HTTP server on 127.0.0.1, and against the failures a remote engine really has."""

from __future__ import annotations

import socket
import threading

import pytest

from app.core.chat.events import ChatMessage, DoneEvent, Event, PromptEvent, StatsEvent, TokenEvent
from app.core.chat.sampling import SamplingParams
from app.core.engines.backend import ReplyRequest
from app.core.engines.remote.backend import RemoteBackend, parse_kv_cache_usage
from app.core.engines.remote.engines import EngineConfig
from app.core.errors import HearthError
from tests.helpers.replay_server import ReplayServer, Reply


def engine(server: ReplayServer, **changes: object) -> EngineConfig:
    return EngineConfig(**({"name": "replay", "base_url": server.base_url} | changes))  # type: ignore[arg-type]


def ask(text: str = "Hello?", **kwargs: object) -> ReplyRequest:
    return ReplyRequest((ChatMessage("user", text),), params=SamplingParams(temperature=0.0), **kwargs)  # type: ignore[arg-type]


def run(backend: RemoteBackend, request: ReplyRequest | None = None) -> tuple[list[Event], DoneEvent, StatsEvent]:
    events = list(backend.generate(request or ask(), threading.Event()))
    done = events[-1]
    stats = next(e for e in events if isinstance(e, StatsEvent))
    assert isinstance(done, DoneEvent)
    return events, done, stats


def tokens(events: list[Event]) -> str:
    return "".join(e.text for e in events if isinstance(e, TokenEvent))


def test_vllm_shape_usage_in_an_empty_choices_chunk_and_cached_tokens(replay: ReplayServer) -> None:
    replay.queue_file("vllm_stream.sse")
    events, done, stats = run(RemoteBackend(engine(replay), "meta-llama/Llama-3.1-8B-Instruct"))
    assert tokens(events) == done.text == "Paris is the capital."
    assert done.finish_reason == "stop" and done.error is None
    assert (stats.stats.prompt_tokens, stats.stats.cached_tokens, stats.stats.generated_tokens) == (1200, 1152, 4)
    assert stats.stats.memory_device == "remote" and stats.stats.decode_path == "remote"
    sent = replay.requests[-1].body
    assert sent is not None and sent["stream_options"] == {"include_usage": True} and sent["max_tokens"] == 512


def test_tgi_shape_without_usage_counts_chunks_and_says_so(replay: ReplayServer) -> None:
    replay.queue_file("tgi_stream.sse")
    _, done, stats = run(RemoteBackend(engine(replay, include_usage=False), "tgi"))
    assert done.text == "Bonjour à tous" and done.finish_reason == "length"
    assert stats.stats.generated_tokens == 3 and stats.stats.prompt_tokens == 0
    assert "no token counts" in stats.stats.decode_path_note
    sent = replay.requests[-1].body
    assert sent is not None and "stream_options" not in sent  # the per-engine switch


def test_ollama_shape(replay: ReplayServer) -> None:
    replay.queue_file("ollama_stream.sse")
    _, done, stats = run(RemoteBackend(engine(replay), "llama3.2"))
    assert done.text == "Hi there" and done.finish_reason == "stop"
    assert (stats.stats.prompt_tokens, stats.stats.generated_tokens) == (31, 3)


def test_llama_server_timings_and_keep_alive_comments(replay: ReplayServer) -> None:
    replay.queue_file("llama_server_stream.sse")
    backend = RemoteBackend(engine(replay), "gpt-3.5-turbo")
    _, done, stats = run(backend)
    assert done.text == "Two plus two is four."
    assert stats.stats.cached_tokens == 32 and stats.stats.prompt_tokens == 40
    assert backend.last_timings is not None and backend.last_timings.predicted_per_second == 40.0
    assert "server: decode 40.0 tok/s" in stats.stats.decode_path_note


def test_error_chunk_mid_stream_keeps_the_partial_reply(replay: ReplayServer) -> None:
    replay.queue_file("error_chunk.sse")
    _, done, _ = run(RemoteBackend(engine(replay), "m"))
    assert done.finish_reason == "error" and done.text == "Half a"
    assert done.error is not None and "reported an error mid-reply: The engine ran out of KV cache blocks" in done.error


def test_tool_call_fragments_are_joined_by_index(replay: ReplayServer) -> None:
    replay.queue_file("tool_calls.sse")
    backend = RemoteBackend(engine(replay), "m")
    _, done, _ = run(backend)
    assert backend.last_tool_calls == [{"id": "call_1", "name": "get_weather", "arguments": '{"city": "Oslo"}'}]
    assert done.finish_reason == "stop" and done.notices == ('The model asked to call get_weather({"city": "Oslo"})',)


def test_anthropic_stream_through_the_anthropic_client(replay: ReplayServer) -> None:
    replay.queue_file("anthropic_stream.sse")
    backend = RemoteBackend(
        engine(replay, kind="anthropic", base_url=f"http://127.0.0.1:{replay.port}", price_provider="anthropic"),
        "claude-haiku-4-5",
        api_key="sk-ant-test-key-0001",
    )
    request = ReplyRequest((ChatMessage("system", "Be brief."), ChatMessage("user", "Hi")))
    _, done, stats = run(backend, request)
    assert done.text == "Hello from Claude." and done.finish_reason == "stop"
    # Anthropic's input_tokens exclude cache reads; Hearth's prompt_tokens include them.
    assert (stats.stats.prompt_tokens, stats.stats.cached_tokens, stats.stats.generated_tokens) == (2050, 2000, 5)
    sent = replay.requests[-1]
    assert sent.path == "/v1/messages"
    assert "sk-ant-test-key-0001" in sent.headers.get("x-api-key", sent.headers.get("authorization", ""))
    assert (
        sent.body is not None
        and sent.body["system"] == "Be brief."
        and sent.body["messages"] == [{"role": "user", "content": "Hi"}]
    )
    # claude-haiku-4-5: $1/MTok in, $0.10 cache read, $5 out → 50 + 2000 cached + 5 out
    assert stats.stats.cost is not None
    assert stats.stats.cost["total_usd"] == pytest.approx(50e-6 + 2000 * 0.1e-6 + 5 * 5e-6)


def test_bad_key_is_one_sentence(replay: ReplayServer) -> None:
    replay.queue_file("openai_401.json", status=401)
    with pytest.raises(HearthError, match=r"rejected the API key \(401 Unauthorized\)"):
        RemoteBackend(engine(replay), "m").generate(ask(), threading.Event())


def test_unknown_model_is_named(replay: ReplayServer) -> None:
    replay.queue_file("openai_404.json", status=404)
    with pytest.raises(HearthError, match=r"has no model 'no-such-model' \(404 Not Found: The model `no-such-model`"):
        RemoteBackend(engine(replay), "no-such-model").generate(ask(), threading.Event())


def test_rate_limit_says_how_long_to_wait(replay: ReplayServer) -> None:
    replay.queue_file("openai_429.json", status=429, headers={"Retry-After": "17"})
    with pytest.raises(HearthError, match=r"rate limiting requests \(429 Too Many Requests\): try again in 17 s"):
        RemoteBackend(engine(replay), "m").generate(ask(), threading.Event())
    assert len(replay.requests) == 1  # no silent retries


def test_anthropic_rate_limit(replay: ReplayServer) -> None:
    replay.queue_file("anthropic_429.json", status=429, headers={"retry-after": "30"})
    eng = engine(replay, kind="anthropic", base_url=f"http://127.0.0.1:{replay.port}")
    with pytest.raises(HearthError, match="try again in 30 s"):
        RemoteBackend(eng, "claude-haiku-4-5", api_key="k" * 20).generate(ask(), threading.Event())


def test_a_server_rejecting_stream_options_points_at_the_switch(replay: ReplayServer) -> None:
    body = {"error": {"message": "Unrecognized request argument supplied: stream_options", "type": "invalid"}}
    replay.queue(Reply(status=400, body=body))
    with pytest.raises(HearthError, match=r"rejected `stream_options` .* --no-usage"):
        RemoteBackend(engine(replay), "m").generate(ask(), threading.Event())


def test_connection_refused_is_named() -> None:
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    eng = EngineConfig("gone", base_url=f"http://127.0.0.1:{port}/v1")
    with pytest.raises(HearthError, match=r"Cannot reach Engine 'gone' .*: connection refused\. Is the server running"):
        RemoteBackend(eng, "m").generate(ask(), threading.Event())


def test_timeout_is_named() -> None:
    with socket.socket() as silent:  # accepts the connection (backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        eng = EngineConfig("slow", base_url=f"http://127.0.0.1:{silent.getsockname()[1]}/v1")
        with pytest.raises(HearthError, match=r"did not answer within 0.5 s \(timeout\)"):
            RemoteBackend(eng, "m", timeout_s=0.5).generate(ask(), threading.Event())


def test_a_server_closing_mid_stream_keeps_the_partial_reply(replay: ReplayServer) -> None:
    replay.queue_file("vllm_stream.sse", cut_after=3)  # the comment, the role chunk, "Paris"
    _, done, _ = run(RemoteBackend(engine(replay), "m"))
    assert done.finish_reason == "error" and done.text == "Paris"
    assert done.error is not None and "The connection to Engine 'replay'" in done.error
    assert "closed mid-reply" in done.error and "partial reply was kept" in done.error


def test_a_stream_ending_without_a_finish_reason_is_an_error(replay: ReplayServer) -> None:
    replay.queue(Reply(body='data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m",'
                       '"choices":[{"index":0,"delta":{"content":"cut"},"finish_reason":null}]}\n\n'))  # fmt: skip
    _, done, _ = run(RemoteBackend(engine(replay), "m"))
    assert done.finish_reason == "error" and done.text == "cut"
    assert done.error is not None and "ended the stream before the reply finished" in done.error


def test_stop_closes_the_stream_and_keeps_the_partial_reply(replay: ReplayServer) -> None:
    replay.queue_file("vllm_stream.sse", hang_after=3)  # "Paris", then the server waits forever
    cancel = threading.Event()
    stream = RemoteBackend(engine(replay), "m").generate(ask(), cancel)
    assert isinstance(next(stream), PromptEvent)  # the context split comes before the first token
    first = next(stream)
    assert first == TokenEvent("Paris")
    cancel.set()  # while the client is blocked waiting for the next chunk
    rest = list(stream)
    done = rest[-1]
    assert isinstance(done, DoneEvent) and done.finish_reason == "cancelled" and done.text == "Paris"
    assert replay.client_left.wait(10), "the server never saw the client go away"


def test_memory_reads_vllm_kv_cache_usage(replay: ReplayServer, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = RemoteBackend(engine(replay), "m")
    first = backend.memory()
    assert "does not report its memory" in first.remote
    replay.metrics = (
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.125\n'
    )
    assert backend.memory() is first  # read at most every METRICS_EVERY_S (the window asks 4 times a second)
    monkeypatch.setattr("app.core.engines.remote.backend.METRICS_EVERY_S", 0.0)
    reading = backend.memory()
    assert reading.remote.endswith("KV cache 12% used (server /metrics)") and reading.devices[0].device == "remote"


def test_kv_cache_metric_parsing_old_and_new_names() -> None:
    assert parse_kv_cache_usage('vllm:gpu_cache_usage_perc{model_name="x"} 0.5\n') == 0.5
    assert parse_kv_cache_usage("vllm:kv_cache_usage_perc 2.5e-01\nvllm:kv_cache_usage_perc 0.75\n") == 0.5
    assert parse_kv_cache_usage("process_cpu_seconds_total 3\n") is None


def test_response_cache_replays_only_where_the_engine_allows_it(replay: ReplayServer, isolated_cache) -> None:
    from app.core.chat.response_cache import ResponseCache

    cache = ResponseCache()
    for _ in range(3):  # two hosted replies, one local one (its second answer comes from the cache)
        replay.queue_file("ollama_stream.sse")
    hosted = RemoteBackend(engine(replay), "llama3.2", response_cache=cache)  # response_cache off by default
    run(hosted)
    run(hosted)
    assert len(replay.requests) == 2 and len(cache) == 0
    local = RemoteBackend(engine(replay, response_cache=True), "llama3.2", response_cache=cache)
    run(local)
    _, done, stats = run(local)
    assert len(replay.requests) == 3 and stats.stats.from_response_cache and done.text == "Hi there"
    # keyed by endpoint and model: another model on the same server is asked again
    replay.queue_file("ollama_stream.sse")
    run(RemoteBackend(engine(replay, response_cache=True), "other", response_cache=cache))
    assert len(replay.requests) == 4
