"""The engine with the real default model: answers, streaming, KV reuse, cancel, seeds, context limits."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
import torch

from app.core.chat.events import ChatMessage, DoneEvent, Event, PromptEvent, StatsEvent, TokenEvent
from app.core.chat.response_cache import ResponseCache
from app.core.chat.sampling import SamplingParams
from app.core.engines.backend import ReplyRequest
from app.core.engines.engine import PREFILL_GRID, Engine, KVState, TorchSampler, greedy_pick
from app.core.engines.local import EngineBackend
from app.core.engines.session import ChatSession
from app.core.errors import ContextOverflowError
from tests.core.prefix_reuse_probe import LONG_SYSTEM_PROMPT
from tests.helpers.warpers import WARPED_PARAMS, distance_from_warped, kept_tokens

GREEDY = SamplingParams(temperature=0, max_new_tokens=24)


def run(events: Any) -> tuple[str, StatsEvent, DoneEvent, list[Event]]:
    collected = list(events)
    text = "".join(e.text for e in collected if isinstance(e, TokenEvent))
    stats = next(e for e in collected if isinstance(e, StatsEvent))
    done = collected[-1]
    assert isinstance(done, DoneEvent)
    return text, stats, done, collected


@pytest.fixture
def engine(default_loaded: Any) -> Engine:
    return Engine(default_loaded)


@pytest.fixture
def exact_engine(default_loaded_fp32: Any) -> Engine:
    """fp32: reuse-vs-fresh comparisons must not depend on bf16 rounding (see conftest)."""
    return Engine(default_loaded_fp32)


def test_default_model_answers_the_capital_of_france(engine: Engine) -> None:
    messages = [
        ChatMessage("system", "You are a helpful assistant."),
        ChatMessage("user", "What is the capital of France?"),
    ]
    text, stats, done, events = run(engine.generate(ReplyRequest(messages, GREEDY)))
    assert "Paris" in text
    assert done.text == text
    assert done.finish_reason in ("stop", "length")
    assert sum(isinstance(e, TokenEvent) for e in events) > 3  # streamed, not one blob
    assert stats.stats.prompt_tokens > 10 and stats.stats.cached_tokens == 0
    assert stats.stats.generated_tokens >= 5 and stats.stats.ttft_s > 0 and stats.stats.decode_tokens_per_s > 0


def test_event_order_is_prompt_then_tokens_then_stats_then_done(engine: Engine) -> None:
    messages = [ChatMessage("system", "You are terse."), ChatMessage("user", "Say hello.")]
    events = list(engine.generate(ReplyRequest(messages, SamplingParams(temperature=0, max_new_tokens=5))))
    kinds = [e.type for e in events]
    assert kinds[0] == "prompt" and kinds[-2:] == ["stats", "done"]
    assert set(kinds[1:-2]) == {"token"}
    prompt, stats = events[0], events[-2]
    assert isinstance(prompt, PromptEvent) and isinstance(stats, StatsEvent)
    usage = prompt.usage
    # The exact split of the prompt the engine built: the template's tokens count as history.
    assert usage.system == engine.count_tokens("You are terse.") and usage.current == engine.count_tokens("Say hello.")
    assert usage.system + usage.history + usage.current == stats.stats.prompt_tokens
    assert usage.window == engine.context_window and usage.reply == 0


def test_the_prompt_is_tokenized_once_per_reply(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.core.engines import generation as engine_module

    calls: list[int] = []
    real = engine_module.format_prompt

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(engine_module, "format_prompt", counting)
    backend = EngineBackend.wrap(engine)
    request = ReplyRequest([ChatMessage("user", "Hi")], SamplingParams(temperature=0, max_new_tokens=2))
    list(backend.generate(request, threading.Event()))
    assert len(calls) == 1


def test_length_limit_is_the_finish_reason(engine: Engine) -> None:
    _, stats, done, _ = run(
        engine.generate(
            ReplyRequest([ChatMessage("user", "Count from 1 to 50.")], SamplingParams(temperature=0, max_new_tokens=3))
        )
    )
    assert done.finish_reason == "length"
    assert stats.stats.generated_tokens == 3


def test_next_turn_reuses_the_cache_and_matches_a_fresh_run(exact_engine: Engine) -> None:
    engine = exact_engine
    session = ChatSession(
        EngineBackend.wrap(engine), system_prompt="You are concise.", params=GREEDY, use_response_cache=False
    )
    run(session.ask("Name a fruit."))
    second_text, second_stats, _, _ = run(session.ask("Name a colour."))
    assert second_stats.stats.cached_tokens > 10  # the first turn's prompt + reply were not prefilled again

    fresh = ChatSession(
        EngineBackend.wrap(engine), system_prompt="You are concise.", params=GREEDY, use_response_cache=False
    )
    fresh.messages = list(session.messages[:-1])  # same history, empty cache
    fresh_text, fresh_stats, _, _ = run(fresh._stream(cancel=None))
    assert fresh_stats.stats.cached_tokens == 0
    assert second_text == fresh_text


def test_regenerate_and_edit_reuse_the_prefix_with_identical_output(exact_engine: Engine) -> None:
    engine = exact_engine
    session = ChatSession(
        EngineBackend.wrap(engine), system_prompt=LONG_SYSTEM_PROMPT, params=GREEDY, use_response_cache=False
    )
    first, first_stats, _, _ = run(session.ask("What is 2 + 2?"))
    again, again_stats, _, _ = run(session.regenerate())
    assert again == first  # greedy: same prompt, same reply
    # The cache held prompt + reply, the prompt prefilled in calls cut on a PREFILL_GRID grid; regenerate crops it
    # back to the start of the call that wrote the prompt's last token, and runs that call again.
    prompt_tokens = first_stats.stats.prompt_tokens
    assert prompt_tokens > 4 * PREFILL_GRID
    last_call_start = (prompt_tokens - 1) // PREFILL_GRID * PREFILL_GRID
    assert again_stats.stats.cached_tokens == last_call_start

    edited, edited_stats, _, _ = run(session.edit(0, "What is 3 + 3?"))  # the edit is in that same last call
    assert edited_stats.stats.cached_tokens == last_call_start < edited_stats.stats.prompt_tokens
    messages = [ChatMessage("system", LONG_SYSTEM_PROMPT), ChatMessage("user", "What is 3 + 3?")]
    fresh, _, _, _ = run(engine.generate(ReplyRequest(messages, GREEDY)))
    assert edited == fresh


def test_stale_cache_as_long_as_the_prompt_is_cropped_not_trusted(exact_engine: Engine) -> None:
    engine = exact_engine
    """The trap: a cache covering the whole new prompt would feed nothing and silently give wrong output."""
    messages = [ChatMessage("user", "Tell me about cats.")]
    kv = KVState()
    fresh, _, _, _ = run(engine.generate(ReplyRequest(messages, GREEDY), kv=KVState()))
    run(engine.generate(ReplyRequest(messages, GREEDY), kv=kv))
    replay, stats, _, _ = run(engine.generate(ReplyRequest(messages, GREEDY), kv=kv))
    assert replay == fresh
    assert stats.stats.cached_tokens == 0  # the prompt was one prefill call: it runs again whole
    assert kv.nbytes() > 0 and kv.cache is not None and kv.cache.get_seq_length() == len(kv.ids)


def test_cancel_from_another_thread_stops_within_one_token_and_keeps_the_partial_reply(engine: Engine) -> None:
    cancel = threading.Event()
    kv = KVState()
    tokens_after_cancel = 0
    text = ""
    done: DoneEvent | None = None
    for event in engine.generate(
        ReplyRequest(
            [ChatMessage("user", "Write a long story about a dragon.")],
            SamplingParams(temperature=0, max_new_tokens=200),
        ),
        kv=kv,
        cancel=cancel,
    ):
        if isinstance(event, TokenEvent):
            text += event.text
            if cancel.is_set():
                tokens_after_cancel += 1
            if len(text) > 20 and not cancel.is_set():
                threading.Thread(target=cancel.set).start()
                threading.Event().wait(0.05)  # let the other thread set it
        if isinstance(event, DoneEvent):
            done = event
    assert done is not None and done.finish_reason == "cancelled"
    assert done.text == text and len(text) > 20
    assert tokens_after_cancel <= 1
    assert kv.cache is not None and kv.cache.get_seq_length() == len(kv.ids)  # consistent: reusable next turn
    after, _, after_done, _ = run(engine.generate(ReplyRequest([ChatMessage("user", "Say hi.")], GREEDY), kv=kv))
    assert after_done.finish_reason in ("stop", "length") and after


def test_same_seed_same_reply_and_different_seed_differs(engine: Engine) -> None:
    messages = [ChatMessage("user", "Write a short poem about the sea.")]
    params = SamplingParams(temperature=1.2, top_p=0.95, top_k=0, max_new_tokens=20, seed=1234)
    a, _, _, _ = run(engine.generate(ReplyRequest(messages, params)))
    b, _, _, _ = run(engine.generate(ReplyRequest(messages, params)))
    c, _, _, _ = run(
        engine.generate(
            ReplyRequest(messages, SamplingParams(temperature=1.2, top_p=0.95, top_k=0, max_new_tokens=20, seed=99))
        )
    )
    assert a == b
    assert a != c


@pytest.mark.parametrize("params", WARPED_PARAMS)
def test_the_torch_sampler_draws_as_transformers_warpers_say(params: SamplingParams) -> None:
    rng = np.random.default_rng(1)
    logits = (rng.standard_normal(500) * 3).astype(np.float32)
    seen = [3, 7, 7, 11]
    sampler = TorchSampler(SamplingParams(**{**params.to_dict(), "seed": 5}), seen, torch.device("cpu"))
    drawn = [sampler.pick(torch.from_numpy(logits.copy())[None]) for _ in range(2000)]
    assert set(drawn) <= kept_tokens(params, logits, seen) and len(set(drawn)) > 1
    assert distance_from_warped(drawn, params, logits, seen) < 0.05  # and as often as the warpers say (~0.015)


def test_the_engine_samples_through_its_filters(engine: Engine) -> None:
    # top-k 1 leaves only the best token, whatever the temperature: the reply must be the greedy one. Without the
    # filters, a temperature of 1.5 over SmolLM2's 49k tokens leaves the greedy path within a few tokens.
    request = [ChatMessage("user", "Name three colours.")]
    greedy, _, _, _ = run(engine.generate(ReplyRequest(request, GREEDY, use_response_cache=False)))
    top_one = SamplingParams(temperature=1.5, top_k=1, max_new_tokens=24, seed=7)
    sampled, _, _, _ = run(engine.generate(ReplyRequest(request, top_one, use_response_cache=False)))
    assert sampled == greedy
    loose = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, max_new_tokens=24, seed=7)
    unfiltered, _, _, _ = run(engine.generate(ReplyRequest(request, loose, use_response_cache=False)))
    assert unfiltered != greedy  # the check above can fail: sampling without the cut-off does leave the path


def test_context_overflow_raises_a_specific_error(default_loaded: Any) -> None:
    engine = Engine(default_loaded)
    engine.context_window = 64
    with pytest.raises(ContextOverflowError) as info:
        list(engine.generate(ReplyRequest([ChatMessage("user", "word " * 200)], GREEDY)))
    assert info.value.context_window == 64 and info.value.prompt_tokens > 200
    assert "Nothing was truncated" in str(info.value) and "64" in str(info.value)


def test_drop_oldest_policy_drops_whole_turns_and_reports_it(default_loaded: Any) -> None:
    engine = Engine(default_loaded)
    engine.context_window = 120
    history = [
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "First question " + "blah " * 30),
        ChatMessage("assistant", "First answer " + "blah " * 30),
        ChatMessage("user", "What is 1 + 1?"),
    ]
    with pytest.raises(ContextOverflowError):
        engine.prepare_prompt(history)
    prepared = engine.prepare_prompt(history, context_policy="drop-oldest")
    assert prepared.dropped_turns == 2
    _, stats, done, _ = run(engine.generate(ReplyRequest(history, GREEDY, context_policy="drop-oldest")))
    assert stats.stats.dropped_turns == 2 and done.finish_reason in ("stop", "length")


def test_reply_is_capped_by_the_room_left_in_the_context(default_loaded: Any) -> None:
    engine = Engine(default_loaded)
    prompt_tokens = len(engine.prepare_prompt([ChatMessage("user", "Count to ten.")]).ids)
    engine.context_window = prompt_tokens + 3
    _, stats, done, _ = run(
        engine.generate(
            ReplyRequest([ChatMessage("user", "Count to ten.")], SamplingParams(temperature=0, max_new_tokens=50))
        )
    )
    assert stats.stats.generated_tokens <= 3 and done.finish_reason in ("length", "stop")


def test_greedy_reply_is_replayed_from_the_response_cache(default_loaded: Any, tmp_path: Any) -> None:
    cache = ResponseCache(tmp_path / "responses.sqlite", max_entries=2)
    engine = Engine(default_loaded, response_cache=cache)
    messages = [ChatMessage("user", "What is the capital of Italy?")]
    first, first_stats, _, _ = run(engine.generate(ReplyRequest(messages, GREEDY)))
    second, second_stats, done, _ = run(engine.generate(ReplyRequest(messages, GREEDY)))
    assert second == first and done.text == first
    assert not first_stats.stats.from_response_cache and second_stats.stats.from_response_cache
    regenerated, regen_stats, _, _ = run(engine.generate(ReplyRequest(messages, GREEDY, use_response_cache=False)))
    assert not regen_stats.stats.from_response_cache and regenerated == first
    # Sampled replies are never cached; the cache stays bounded.
    run(engine.generate(ReplyRequest(messages, SamplingParams(temperature=1.0, max_new_tokens=4, seed=1))))
    for question in ("Say A.", "Say B.", "Say C."):
        run(
            engine.generate(
                ReplyRequest([ChatMessage("user", question)], SamplingParams(temperature=0, max_new_tokens=2))
            )
        )
    assert len(cache) == 2
    reopened = ResponseCache(tmp_path / "responses.sqlite")
    assert len(reopened) == 2  # on disk


def test_a_failure_mid_generation_ends_with_an_error_event_and_the_engine_stays_usable(default_loaded: Any) -> None:
    engine = Engine(default_loaded)
    real_forward = engine._forward
    calls = {"n": 0}

    def flaky(ids: list[int], kv: KVState, logits_to_keep: int = 1, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("simulated out of memory")
        return real_forward(ids, kv, logits_to_keep, **kwargs)

    engine._forward = flaky  # type: ignore[method-assign]
    kv = KVState()
    _, done_events = None, list(engine.generate(ReplyRequest([ChatMessage("user", "Hello there!")], GREEDY), kv=kv))
    done = done_events[-1]
    assert (
        isinstance(done, DoneEvent)
        and done.finish_reason == "error"
        and "simulated out of memory" in (done.error or "")
    )
    assert kv.cache is None  # dropped, not left half-written
    engine._forward = real_forward  # type: ignore[method-assign]
    text, _, ok, _ = run(
        engine.generate(ReplyRequest([ChatMessage("user", "What is the capital of France?")], GREEDY), kv=kv)
    )
    assert ok.finish_reason in ("stop", "length") and "Paris" in text


def test_continue_extends_a_reply_cut_at_the_length_limit(engine: Engine) -> None:
    session = ChatSession(
        EngineBackend.wrap(engine), params=SamplingParams(temperature=0, max_new_tokens=4), use_response_cache=False
    )
    _, _, done, _ = run(session.ask("List three animals."))
    assert done.finish_reason == "length"
    cut = session.messages[-1].content
    _, stats, _, _ = run(session.continue_reply())
    assert session.messages[-1].content.startswith(cut) and len(session.messages[-1].content) > len(cut)
    assert stats.stats.cached_tokens > 0


def test_greedy_pick_is_torchs_argmax_first_of_equals_included() -> None:
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(1, 49152, generator=generator)
    assert greedy_pick(logits) == int(torch.argmax(logits, dim=-1))
    logits[0, 7] = logits[0, 40000] = logits.max() + 1  # a tie: the first index, as torch.argmax
    assert greedy_pick(logits) == 7 == int(torch.argmax(logits, dim=-1))
    assert greedy_pick(logits[:, ::2]) == int(torch.argmax(logits[:, ::2], dim=-1))  # a strided view
    assert greedy_pick(logits.bfloat16()) == 7  # other dtypes go through torch
