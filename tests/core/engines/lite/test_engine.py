"""The torch-free engine (app/core/engines/lite/engine.py): its numpy sampling against transformers' warpers, its
tokenizer against AutoTokenizer's, and a reply's behaviour (stop, cancel, stats, refusals)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import jsonschema
import numpy as np
import pytest
from transformers import AutoTokenizer

from app.core.chat.events import ChatMessage, DoneEvent, StatsEvent, TokenEvent
from app.core.chat.sampling import SamplingParams
from app.core.engines.backend import LoadRequest, ReplyRequest, ResponseFormat
from app.core.engines.constrained import SchemaError
from app.core.engines.lite.backend import LiteBackend, open_lite_backend
from app.core.engines.lite.engine import NumpySampler, load_tokenizer
from app.core.engines.lite.runtime import LiteUnavailable
from app.core.fastpath import kernel
from tests.helpers.warpers import WARPED_PARAMS, distance_from_warped, kept_tokens

KERNEL = kernel.load_library()
needs_kernel = pytest.mark.skipif(isinstance(KERNEL, str), reason=f"no kernel library here: {KERNEL}")
GREEDY = SamplingParams(temperature=0, max_new_tokens=24)


@pytest.fixture(scope="module")
def lite_backend(default_model_folder: Any) -> Iterator[LiteBackend]:
    """The default model (as a folder, until the runtime reads the GGUF itself) on the torch-free runtime, its packed
    copy written by a q4 load through torch first."""
    from app.core.engines.loader import load_model

    load_model(str(default_model_folder), quantization="q4", device="cpu")
    opened = open_lite_backend(LoadRequest(str(default_model_folder), device="cpu", response_cache=False))
    assert isinstance(opened, LiteBackend), opened
    yield opened
    opened.close()


@pytest.mark.parametrize("params", WARPED_PARAMS)
def test_sampling_draws_only_what_transformers_warpers_keep(params: SamplingParams) -> None:
    rng = np.random.default_rng(1)
    logits = (rng.standard_normal(500) * 3).astype(np.float32)
    seen = [3, 7, 7, 11]
    allowed = kept_tokens(params, logits, seen)
    sampler = NumpySampler(SamplingParams(**{**params.to_dict(), "seed": 5}), seen)
    drawn = [sampler.pick(logits) for _ in range(2000)]
    assert set(drawn) <= allowed and len(set(drawn)) > 1
    assert distance_from_warped(drawn, params, logits, seen) < 0.05  # and as often as the warpers say (~0.015)
    again = NumpySampler(SamplingParams(**{**params.to_dict(), "seed": 5}), seen)
    first = NumpySampler(SamplingParams(**{**params.to_dict(), "seed": 5}), seen)
    assert [again.pick(logits) for _ in range(20)] == [first.pick(logits) for _ in range(20)]  # a seed repeats


def test_greedy_is_the_argmax_and_the_repetition_penalty_counts_accepted_tokens() -> None:
    logits = np.array([1.0, 3.0, 2.9, -1.0], dtype=np.float32)
    assert NumpySampler(SamplingParams(temperature=0), []).pick(logits) == 1
    penalized = NumpySampler(SamplingParams(temperature=0, repetition_penalty=1.5), [])
    assert penalized.pick(logits) == 1
    penalized.accept(1)  # 3.0 / 1.5 = 2.0 < 2.9
    assert penalized.pick(logits) == 2


def test_the_tokenizer_is_the_one_auto_tokenizer_loads(default_tokenizer_folder: Any) -> None:
    ours, theirs = load_tokenizer(default_tokenizer_folder), AutoTokenizer.from_pretrained(default_tokenizer_folder)
    assert type(ours) is type(theirs)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Héllo, wörld! 12345"}]
    assert ours.apply_chat_template(messages, add_generation_prompt=True) == theirs.apply_chat_template(
        messages, add_generation_prompt=True
    )


def test_a_tokenizer_class_it_cannot_load_without_torch_is_a_reason(tmp_path: Any) -> None:
    (tmp_path / "tokenizer_config.json").write_text('{"tokenizer_class": "NoSuchTokenizer"}')
    with pytest.raises(LiteUnavailable, match="tokenizer class NoSuchTokenizer is not in this transformers"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(LiteUnavailable, match="names no tokenizer class"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text('{"tokenizer_class": ', encoding="utf-8")  # cut short
    with pytest.raises(LiteUnavailable, match=r"its tokenizer_config\.json could not be read \(Expecting value"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").unlink()
    with pytest.raises(LiteUnavailable, match=r"its tokenizer_config\.json could not be read \(.*No such file"):
        load_tokenizer(tmp_path)


def run(backend: LiteBackend, request: ReplyRequest, cancel: threading.Event | None = None) -> list[Any]:
    return list(backend.generate(request, cancel or threading.Event()))


@needs_kernel
def test_a_reply_streams_and_reports_both_phases(lite_backend: LiteBackend) -> None:
    events = run(lite_backend, ReplyRequest([ChatMessage("user", "What is the capital of France?")], GREEDY, 1))
    done = events[-1]
    stats = next(e for e in events if isinstance(e, StatsEvent)).stats
    assert isinstance(done, DoneEvent) and "Paris" in done.text and done.finish_reason == "stop"
    assert "".join(e.text for e in events if isinstance(e, TokenEvent)) == done.text
    assert stats.decode_path == "lite-q4" and "torch-free runtime" in stats.decode_path_note
    assert stats.prefill_s > 0 and stats.decode_tokens_per_s > 0 and stats.memory_device == "cpu"
    # the next turn reuses the conversation's cache
    follow = ReplyRequest(
        [ChatMessage("user", "What is the capital of France?"), ChatMessage("assistant", done.text),
         ChatMessage("user", "And of Italy?")],
        GREEDY,
        1,
    )  # fmt: skip
    again = next(e for e in run(lite_backend, follow) if isinstance(e, StatsEvent)).stats
    assert again.cached_tokens > 20
    reading = lite_backend.memory()
    (cpu,) = reading.devices
    assert cpu.weights_bytes > 90e6 and cpu.kv_bytes > 0 and reading.kv_bytes_per_token == 30 * 2 * 3 * 64 * 2


@needs_kernel
def test_stop_strings_and_cancel_end_a_reply(lite_backend: LiteBackend) -> None:
    question = [ChatMessage("user", "Count from 1 to 20, separated by commas.")]
    stopped = run(lite_backend, ReplyRequest(question, SamplingParams(temperature=0, max_new_tokens=60), stop=["5"]))
    assert stopped[-1].finish_reason == "stop" and "5" not in stopped[-1].text and stopped[-1].text
    cancel = threading.Event()
    tokens = 0
    for event in lite_backend.generate(
        ReplyRequest(question, SamplingParams(temperature=0, max_new_tokens=60)), cancel
    ):
        if isinstance(event, TokenEvent):
            tokens += 1
            cancel.set()  # within one token
        last = event
    assert isinstance(last, DoneEvent) and last.finish_reason == "cancelled" and tokens == 1


CITY = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "population": {"type": "integer"},
        "area_km2": {"type": "number"},
        "kind": {"enum": ["city", "town", "village"]},
        "mayor": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                  "required": ["name", "age"]},
    },
    "required": ["name", "population", "area_km2", "kind", "mayor"],
}  # fmt: skip


@needs_kernel
def test_a_json_schema_is_enforced_on_its_numpy_logits(lite_backend: LiteBackend) -> None:
    request = ReplyRequest([ChatMessage("user", "Describe Paris as JSON.")],
                           SamplingParams(temperature=0, max_new_tokens=200),
                           response_format=ResponseFormat("json_schema", CITY))  # fmt: skip
    done = run(lite_backend, request)[-1]
    assert done.finish_reason == "stop", done.text
    jsonschema.validate(json.loads(done.text), CITY)
    remote = ResponseFormat("json_schema", {"$ref": "https://example.com/x.json"})
    bad = ReplyRequest([ChatMessage("user", "Hi")], GREEDY, response_format=remote)
    with pytest.raises(SchemaError, match="outside the schema"):  # before any event
        lite_backend.generate(bad, threading.Event())


@needs_kernel
def test_regenerate_and_edit_reuse_the_prefix(lite_backend: LiteBackend) -> None:
    from app.core.engines.session import ChatSession

    def reply(events: Iterator[Any]) -> tuple[str, Any]:
        listed = list(events)
        return listed[-1].text, next(e for e in listed if isinstance(e, StatsEvent)).stats

    session = ChatSession(lite_backend, params=GREEDY, use_response_cache=False, conversation_id=7)
    first, first_stats = reply(session.ask("What is 2 + 2?"))
    again, again_stats = reply(session.regenerate())
    # Greedy, but not bit-identical: the prompt's last token is prefilled alone this time, and its keys round to
    # bf16 from sums taken in another order (as in the torch path's bf16 and q4 loads; only fp32 is exact there).
    assert "4" in first and "4" in again
    assert again_stats.cached_tokens == first_stats.prompt_tokens - 1  # cropped back to the prompt minus one
    edited, edited_stats = reply(session.edit(0, "What is 3 + 3?"))
    assert 0 < edited_stats.cached_tokens < edited_stats.prompt_tokens
    assert "6" in edited


@needs_kernel
def test_requests_without_a_conversation_reuse_a_pooled_prefix(lite_backend: LiteBackend) -> None:
    """An API client resends its whole conversation: the pool's cache holding its turns so far is taken again."""
    first = [ChatMessage("user", "Name three rivers in Europe.")]
    done = run(lite_backend, ReplyRequest(first, GREEDY))[-1]
    follow = [*first, ChatMessage("assistant", done.text), ChatMessage("user", "Which is the longest?")]
    stats = next(e for e in run(lite_backend, ReplyRequest(follow, GREEDY)) if isinstance(e, StatsEvent)).stats
    assert stats.cached_tokens > len(lite_backend.engine.tokenizer(done.text)["input_ids"])
    assert lite_backend.memory().devices[0].kv_bytes > 0
