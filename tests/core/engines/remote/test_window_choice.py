"""What the window's model picker hands the worker for a remote model (a LoadRequest naming a RemoteModel, opened by
open_backend as a RemoteBackend), and the sums the window shows: the history's costs per conversation."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from app.core.chat.events import ChatMessage, DoneEvent, ReplyStats, StatsEvent
from app.core.engines.backend import LoadRequest, RemoteModel, ReplyRequest, ScriptedBackend
from app.core.engines.remote import engines as registry
from app.core.engines.remote.backend import RemoteBackend
from app.core.engines.remote.pricing import TokenUsage, compare_local_reply, conversation_costs, price_reply
from app.core.engines.remote.session import open_remote_backend
from app.core.errors import HearthError, InvalidSettingError
from app.core.settings import Settings
from app.core.storage.history import HistoryStore
from tests.helpers import memory_keyring
from tests.helpers.replay_server import ReplayServer

IN, CACHED, OUT = 0.15e-6, 0.075e-6, 0.60e-6  # gpt-4o-mini per token: input, cached input, output


@pytest.fixture
def keys() -> Iterator[memory_keyring.MemoryKeyring]:
    with memory_keyring.installed(memory_keyring.MemoryKeyring()) as backend:
        yield backend  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("llama3 @ my-vllm", RemoteModel("my-vllm", "llama3")),
        (
            "  meta-llama/Llama-3.1-8B-Instruct @ gpu.box_2 ",
            RemoteModel("gpu.box_2", "meta-llama/Llama-3.1-8B-Instruct"),
        ),
        ("a @ b @ c", RemoteModel("c", "a @ b")),
        ("SmolLM2-135M-Instruct (built in)", None),
        ("/models/my model@home.gguf", None),
        (" @ box", None),
        ("model @ not an engine", None),
    ],
)
def test_remote_model_labels_parse_back(text: str, expected: RemoteModel | None) -> None:
    assert RemoteModel.parse(text) == expected
    if expected is not None:
        assert RemoteModel.parse(expected.label) == expected


def test_open_backend_opens_a_remote_model_with_its_key_and_no_connection(
    keys: memory_keyring.MemoryKeyring, replay: ReplayServer
) -> None:
    from app.core.engines.opening import open_backend

    registry.save_key(registry.key_name_for("box"), "sk-choice-test-1234567")
    registry.add_engine(registry.EngineConfig("box", base_url=replay.base_url, key_name=registry.key_name_for("box")))
    request = LoadRequest.from_settings(Settings(), remote=RemoteModel("box", "llama3"), context_length=8192)
    backend = open_backend(request, lambda message, fraction: None, threading.Event())
    assert isinstance(backend, RemoteBackend) and not replay.requests  # loading opens no connection
    assert backend.info.name == "llama3 @ box" and backend.info.context_window == 8192
    assert backend.response_cache is None  # the engine did not allow it
    replay.queue_file("vllm_stream.sse")
    events = list(backend.generate(ReplyRequest([ChatMessage("user", "Hi")]), threading.Event()))
    assert isinstance(events[-1], DoneEvent) and events[-1].text == "Paris is the capital."
    assert replay.requests[-1].headers["authorization"] == "Bearer sk-choice-test-1234567"
    assert replay.requests[-1].body is not None and replay.requests[-1].body["model"] == "llama3"
    backend.close()


def test_a_default_model_spelled_model_at_engine_is_a_remote_choice() -> None:
    request = LoadRequest.from_settings(Settings(model="llama3 @ box", context_length=4096))
    assert request.model is None and request.remote == RemoteModel("box", "llama3") and request.context_length == 4096
    assert LoadRequest.from_settings(Settings(model="/models/x")).remote is None


def test_open_remote_backend_errors_are_one_sentence(keys: memory_keyring.MemoryKeyring) -> None:
    with pytest.raises(HearthError, match=r"There is no engine named 'nowhere' \(known: none yet\)"):
        open_remote_backend(LoadRequest(None, remote=RemoteModel("nowhere", "m")))
    registry.add_engine(registry.EngineConfig("locked", key_name=registry.key_name_for("locked")))
    with pytest.raises(HearthError, match="needs an API key, but the system keyring has none for it"):
        open_remote_backend(LoadRequest(None, remote=RemoteModel("locked", "m")))


def test_the_response_cache_needs_both_the_engine_and_the_settings(keys: memory_keyring.MemoryKeyring) -> None:
    registry.add_engine(registry.EngineConfig("local", response_cache=True))
    on = open_remote_backend(LoadRequest(None, remote=RemoteModel("local", "m"), response_cache=True))
    off = open_remote_backend(LoadRequest(None, remote=RemoteModel("local", "m"), response_cache=False))
    assert on.response_cache is not None and off.response_cache is None


def test_conversation_costs_sum_every_reply_in_the_history_on_every_branch() -> None:
    store = HistoryStore(in_memory=True)
    conversation = store.create_conversation("c")
    user = store.add_message(conversation.id, "user", "Hi", None)
    first = price_reply(TokenUsage(1_000, 0, 100, 0), "gpt-4o-mini", "openai").to_dict()
    again = price_reply(TokenUsage(1_000, 800, 100, 0), "gpt-4o-mini", "openai").to_dict()
    store.add_message(conversation.id, "assistant", "A", user.id, stats={"cost": first}, finish_reason="stop")
    store.add_message(conversation.id, "assistant", "B", user.id, stats={"cost": again}, finish_reason="stop")
    store.add_message(conversation.id, "assistant", "C", user.id, stats={"generated_tokens": 3}, finish_reason="stop")
    replies = store.reply_stats(conversation.id)
    assert len(replies) == 3 and len(store.active_branch(conversation.id)) == 2  # a regenerated reply counts too
    spent, compared = conversation_costs(replies)
    assert spent.replies == 2 and compared.replies == 0
    assert spent.total_usd == pytest.approx(1_000 * IN + 200 * IN + 800 * CACHED + 200 * OUT)
    assert spent.cache_saved_usd == pytest.approx(800 * (IN - CACHED))
    exported = store.export_markdown(conversation.id)  # the active branch: the last reply, not priced
    assert "cost ~$" not in exported
    store.switch_to(store.siblings(user.id + 1)[0].id)
    # reply A: 1,000 x 0.15 + 100 x 0.60 = $210 / 1e6
    assert "cost ~$0.0002 on openai/gpt-4o-mini (estimate)" in store.export_markdown(conversation.id)
    store.close()


def test_a_local_reply_is_priced_only_when_asked() -> None:
    stats = ReplyStats(0.1, 1_000, 400, 1.0, 1.0, 50, 0.1, 1.0, 0, "cpu")
    assert compare_local_reply(stats, None) is stats
    priced = compare_local_reply(stats, "openai/gpt-4o-mini", history_tokens=700)
    assert priced.cost is not None and priced.cost["hypothetical"] is True
    assert priced.cost["total_usd"] == pytest.approx(600 * IN + 400 * CACHED + 50 * OUT)
    assert compare_local_reply(priced, "anthropic/claude-haiku-4-5") is priced  # a reply that has a cost keeps it
    remote = ReplyStats(0.1, 10, 0, 1.0, 1.0, 5, 0.1, 1.0, 0, "remote")
    assert compare_local_reply(remote, "openai/gpt-4o-mini") is remote
    assert compare_local_reply(stats, "openai/no-such-model").cost is None  # unknown to the price list


def test_the_scripted_model_streams_stats_the_worker_can_price() -> None:
    events = list(ScriptedBackend().generate(ReplyRequest([ChatMessage("user", "Hi")]), threading.Event()))
    stats = next(e.stats for e in events if isinstance(e, StatsEvent))
    assert compare_local_reply(stats, "openai/gpt-4o-mini").cost is not None


def test_the_compare_setting_is_provider_slash_model() -> None:
    assert Settings.from_dict({"compare_cost_with": "openai/gpt-4o-mini"}).compare_cost_with == "openai/gpt-4o-mini"
    assert Settings().compare_cost_with is None  # off by default
    with pytest.raises(InvalidSettingError, match="compare_cost_with must be provider/model"):
        Settings.from_dict({"compare_cost_with": "gpt-4o-mini"})


def test_a_bundle_without_the_price_lists_metadata_still_prices(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib.metadata import PackageNotFoundError

    def missing(name: str) -> str:
        raise PackageNotFoundError(name)

    monkeypatch.setattr("app.core.engines.remote.pricing.version", missing)
    cost = price_reply(TokenUsage(1_000, 0, 100, 0), "gpt-4o-mini", "openai")
    assert cost.source == "genai-prices bundled price list" and cost.total_usd == pytest.approx(1_000 * IN + 100 * OUT)
