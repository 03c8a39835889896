"""The GUI's real backend over a tiny model: the default factory loads, streams, accounts memory, forgets, closes."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from app.core.chat.events import ChatMessage, DoneEvent, StatsEvent, TokenEvent
from app.core.chat.sampling import SamplingParams
from app.core.engines.backend import LoadRequest, ReplyRequest
from app.core.engines.local import EngineBackend
from app.core.engines.local import open_engine_backend as open_backend
from app.core.errors import ContextOverflowError, ModelNotFoundError

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=6)


def test_factory_loads_streams_and_accounts_memory(tiny_model_dir: Any) -> None:
    progress: list[str] = []
    backend = open_backend(
        LoadRequest(str(tiny_model_dir("llama")), quantization="fp32", device="cpu"),
        lambda message, fraction: progress.append(message),
        threading.Event(),
    )
    assert isinstance(backend, EngineBackend) and progress
    assert backend.info.device == "cpu" and backend.info.quantization == "fp32" and backend.info.context_window == 512
    messages = [ChatMessage("user", "Hello there")]
    events = list(
        backend.generate(ReplyRequest(messages, GREEDY, conversation_id=7, use_response_cache=False), threading.Event())
    )
    assert isinstance(events[-1], DoneEvent) and events[-1].finish_reason in ("stop", "length")
    assert any(isinstance(e, TokenEvent) for e in events) and any(isinstance(e, StatsEvent) for e in events)
    reading = backend.memory()
    assert reading.devices[0].device == "cpu" and reading.devices[0].weights_bytes > 0
    assert reading.devices[0].kv_bytes > 0 and reading.kv_bytes_per_token > 0
    # the conversation's KV cache is reused on the next turn, and dropped by forget()
    # (a fixed reply: the random model's own, re-tokenized, may merge with the prompt's last token)
    second = [*messages, ChatMessage("assistant", "Hi."), ChatMessage("user", "More")]
    stats = next(
        e
        for e in backend.generate(
            ReplyRequest(second, GREEDY, conversation_id=7, use_response_cache=False), threading.Event()
        )
        if isinstance(e, StatsEvent)
    )
    assert stats.stats.cached_tokens > 0
    backend.forget(7)
    assert backend.memory().devices[0].kv_bytes == 0
    assert backend.count_tokens("") == 0 and backend.count_tokens("hello world") >= 2
    backend.close()
    assert not hasattr(backend, "engine")  # references dropped so the weights can be freed


def test_user_errors_raise_before_the_first_event(tiny_model_dir: Any) -> None:
    backend = open_backend(
        LoadRequest(str(tiny_model_dir("llama")), quantization="fp32", device="cpu", context_length=32),
        lambda message, fraction: None,
        threading.Event(),
    )
    with pytest.raises(ContextOverflowError):
        backend.generate(
            ReplyRequest([ChatMessage("user", "word " * 200)], GREEDY, conversation_id=1), threading.Event()
        )
    backend.close()


def test_missing_model_is_a_clear_error(tmp_path: Any) -> None:
    with pytest.raises(ModelNotFoundError):
        open_backend(LoadRequest(str(tmp_path / "nope")), lambda m, f: None, threading.Event())


def test_the_memory_reading_counts_every_cache_held(tiny_model_dir: Any) -> None:
    """The window's conversation and the API clients' pooled caches all count: none is hidden from the panel."""
    backend = open_backend(LoadRequest(str(tiny_model_dir("llama")), quantization="fp32", device="cpu"))

    def ask(text: str, conversation_id: int | None) -> None:
        request = ReplyRequest([ChatMessage("user", text)], GREEDY, conversation_id=conversation_id)
        list(backend.generate(request, threading.Event()))

    ask("The window's own conversation", 1)
    one = backend.memory().devices[0].kv_bytes
    ask("An API client's question", None)
    ask("Another client, another prompt entirely", None)
    held = [*backend._caches.values(), *backend._pool.states()]
    assert len(held) == 3 and all(kv.nbytes() > 0 for kv in held)
    assert backend.memory().devices[0].kv_bytes == sum(kv.nbytes() for kv in held) > one
    backend.close()
