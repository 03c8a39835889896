"""Fast decode paths against the plain path: agreement, prefill untouched, fallbacks, and the engine's behaviour.

Agreement bound (int8 weight-only changes precision, so exact equality is not the bar): teacher-forced on the plain
path's greedy tokens, the fast path's argmax matches on >= 90 % of steps on the default model, and its decode-step
logits stay within 5 % (max abs difference / max abs logit) on tiny random models.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from app.core.chat.events import ChatMessage, DoneEvent, StatsEvent, TokenEvent
from app.core.chat.sampling import SamplingParams
from app.core.engines.backend import ReplyRequest
from app.core.engines.engine import PREFILL_GRID, Engine, KVState
from app.core.engines.local import EngineBackend
from app.core.engines.session import ChatSession
from app.core.fastpath import int8, kernel, prefill
from app.core.fastpath import select as fastpath
from tests.core.prefix_reuse_probe import LONG_SYSTEM_PROMPT

GREEDY = SamplingParams(temperature=0, max_new_tokens=12)
AGREEMENT_BOUND = 0.90
LOGIT_ERROR_BOUND = 0.05


def run(events: Any) -> tuple[str, Any, DoneEvent]:
    collected = list(events)
    text = "".join(e.text for e in collected if isinstance(e, TokenEvent))
    stats = next(e.stats for e in collected if isinstance(e, StatsEvent))
    done = collected[-1]
    assert isinstance(done, DoneEvent)
    return text, stats, done


def greedy_reference(engine: Engine, ids: list[int], steps: int) -> list[int]:
    kv = KVState()
    tokens: list[int] = []
    with torch.inference_mode():
        logits = engine._forward(ids, kv)
        for _ in range(steps):
            tokens.append(int(torch.argmax(logits, dim=-1)))
            logits = engine._forward([tokens[-1]], kv, decode_step=True)
    return tokens


def teacher_forced(engine: Engine, ids: list[int], tokens: list[int]) -> tuple[list[int], list[torch.Tensor]]:
    """Feed `tokens` one by one through the engine's decode path; return its argmax and logits at each step."""
    kv = KVState()
    picks: list[int] = []
    all_logits: list[torch.Tensor] = []
    with torch.inference_mode():
        logits = engine._forward(ids, kv)
        for token in tokens:
            picks.append(int(torch.argmax(logits, dim=-1)))
            all_logits.append(logits)
            with engine.path.step():
                logits = engine._forward([token], kv, decode_step=True)
    return picks, all_logits


@pytest.fixture(scope="module")
def plain(default_loaded: Any) -> Engine:
    return Engine(default_loaded, decode_path="eager")


@pytest.fixture(scope="module")
def fast(default_loaded: Any) -> Engine:
    return Engine(default_loaded, decode_path="int8-decode")


@pytest.fixture
def no_fused_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a machine without a C compiler: the fused step is unavailable, the next best path runs."""
    monkeypatch.setattr(kernel, "load_library", lambda: "no C compiler found (test)")


def test_auto_without_the_fused_step_keeps_bf16_on_the_plain_path_and_says_why(
    default_loaded: Any, no_fused_step: None
) -> None:
    engine = Engine(default_loaded)
    assert engine.decode_path == "eager"
    text, stats, done = run(
        engine.generate(ReplyRequest([ChatMessage("user", "What is the capital of France?")], GREEDY))
    )
    assert "Paris" in text and done.finish_reason in ("stop", "length")
    assert stats.decode_path == "eager" and "fused decode unavailable: no C compiler found" in stats.decode_path_note


def test_auto_without_the_fused_step_picks_int8_decode_for_nf4_on_the_cpu(
    tiny_model_dir: Any, no_fused_step: None
) -> None:
    from app.core.engines.loader import load_model

    engine = Engine(load_model(str(tiny_model_dir("llama-untied")), quantization="nf4", device="cpu"))
    assert engine.decode_path == "int8-decode"
    _, stats, done = run(
        engine.generate(ReplyRequest([ChatMessage("user", "hi")], SamplingParams(temperature=0, max_new_tokens=4)))
    )
    assert done.finish_reason in ("stop", "length")
    assert stats.decode_path == "int8-decode" and "int8" in stats.decode_path_note
    assert "fused decode unavailable" in stats.decode_path_note


def test_int8_decode_agrees_with_the_plain_path_on_the_default_model(plain: Engine, fast: Engine) -> None:
    ids = plain.prepare_prompt([ChatMessage("user", "Tell me about the history of bread.")]).ids
    reference = greedy_reference(plain, ids, 16)
    picks, _ = teacher_forced(fast, ids, reference)
    agreement = sum(a == b for a, b in zip(picks, reference, strict=True)) / len(reference)
    assert agreement >= AGREEMENT_BOUND
    assert picks[0] == reference[0]  # the first token comes from prefill, which the fast path never touches


@contextmanager
def without_decode_patch(model: torch.nn.Module) -> Iterator[int]:
    """The model exactly as loaded: the int8 patch's instance forwards set aside for the block."""
    saved = {m: m.__dict__.pop("forward") for m in model.modules() if hasattr(m, int8.PATCH_ATTR)}
    try:
        yield len(saved)
    finally:
        for module, forward in saved.items():
            module.forward = forward


def test_prefill_and_calls_outside_decode_steps_use_the_original_weights(default_loaded: Any, fast: Engine) -> None:
    ids = torch.tensor([[1, 504, 3458, 282, 4649, 30]])
    with torch.inference_mode():
        before = default_loaded.model(input_ids=ids).logits
        with fast.path.step():
            prefill = default_loaded.model(input_ids=ids).logits  # six rows: the plain weights
        single_outside = default_loaded.model(input_ids=ids[:, :1]).logits
        with fast.path.step():
            single_inside = default_loaded.model(input_ids=ids[:, :1]).logits
        with without_decode_patch(default_loaded.model) as patched:
            single_unpatched = default_loaded.model(input_ids=ids[:, :1]).logits
    assert patched > 0
    assert torch.equal(before, prefill)
    assert torch.equal(single_unpatched, single_outside)  # the patch is inert outside the engine's decode steps
    assert not torch.equal(single_outside, single_inside)  # ...and really on inside them


@pytest.mark.parametrize("route", ["this-cpu", "native", "no-onednn"])
def test_a_prefill_row_matches_a_one_token_forward_as_this_cpus_bf16_gemm_rounds(
    default_loaded: Any, route: str
) -> None:
    """Without oneDNN (AVX2 CPUs; forced here by turning it off) torch's bf16 kernel rounds each row alike: the first
    row of a 6-token prefill is the 1-token forward, bit for bit. oneDNN's native bf16 GEMM (AVX-512/BF16/AMX) picks
    kernels by shape, so the rows agree only to bf16 rounding."""
    if route == "native" and not prefill.native_bf16_gemm():
        pytest.skip("no native bf16 GEMM on this CPU")
    ids = torch.tensor([[1, 504, 3458, 282, 4649, 30]])
    with torch.backends.mkldnn.flags(enabled=route != "no-onednn"), torch.inference_mode():
        native = prefill.native_bf16_gemm()
        six = default_loaded.model(input_ids=ids).logits[:, :1]
        one = default_loaded.model(input_ids=ids[:, :1]).logits
    assert native == (route == "native" or (route == "this-cpu" and prefill.native_bf16_gemm()))
    if native:
        assert float((six - one).abs().max()) <= 0.02 * float(one.abs().max())
    else:
        assert torch.equal(six, one)


@pytest.mark.parametrize("native", [True, False])
def test_bf16_prefill_upcasts_only_without_a_native_bf16_gemm(
    tiny_model_dir: Any, monkeypatch: pytest.MonkeyPatch, native: bool
) -> None:
    from app.core.engines.loader import load_model

    monkeypatch.setattr(prefill, "native_bf16_gemm", lambda: native)  # either kind of CPU, on any CPU
    loaded = load_model(str(tiny_model_dir("qwen2")), quantization="bf16", device="cpu")
    linears = [m for m in loaded.model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all((type(m) is prefill.UpcastLinear) == (not native) for m in linears)
    assert prefill.uses_upcast(loaded.model) == (not native)
    note = Engine(loaded).decode_path_note  # the stats line says which route prefill takes
    assert ("prefill in bf16 weights, fp32 GEMMs" in note) == (not native) and "prefill in bf16" in note
    layer = next(m for m in linears if m.bias is not None)  # qwen2's q_proj: the bias takes the same route
    rows = torch.randn(prefill.MIN_ROWS, layer.in_features, generator=torch.Generator().manual_seed(0)).bfloat16()
    with torch.inference_mode():
        many, few = layer(rows), layer(rows[:1])
    plain = torch.nn.functional.linear
    if native:
        assert torch.equal(many, plain(rows, layer.weight, layer.bias))
    else:  # one fp32 product, rounded once to bf16; a single row keeps the plain bf16 kernel
        assert torch.equal(many, plain(rows.float(), layer.weight.float(), layer.bias.float()).bfloat16())
    assert torch.equal(few, plain(rows[:1], layer.weight, layer.bias))


@pytest.mark.parametrize("arch", ["llama-untied", "qwen2", "gemma2", "phi3"])
def test_int8_decode_logits_stay_within_the_bound_on_tiny_models(arch: str, tiny_model_dir: Any) -> None:
    from app.core.engines.loader import load_model

    loaded = load_model(str(tiny_model_dir(arch)), quantization="bf16", device="cpu")
    plain_engine = Engine(loaded, decode_path="eager")
    fast_engine = Engine(loaded, decode_path="int8-decode")
    assert fast_engine.decode_path == "int8-decode" and fast_engine.path.patched_layers > 0
    ids = plain_engine.prepare_prompt([ChatMessage("user", "hello there")]).ids
    reference = greedy_reference(plain_engine, ids, 8)
    _, plain_logits = teacher_forced(plain_engine, ids, reference)
    _, fast_logits = teacher_forced(fast_engine, ids, reference)
    for want, got in zip(plain_logits[1:], fast_logits[1:], strict=True):
        error = float((got - want).abs().max() / want.abs().max())
        assert error < LOGIT_ERROR_BOUND
    assert torch.equal(plain_logits[0], fast_logits[0])  # prefill: identical


def test_nf4_on_the_cpu_decodes_through_int8_and_agrees(tiny_model_dir: Any) -> None:
    from app.core.engines.loader import load_model

    loaded = load_model(str(tiny_model_dir("llama")), quantization="nf4", device="cpu")
    plain_engine = Engine(loaded, decode_path="eager")
    fast_engine = Engine(loaded, decode_path="int8-decode")
    assert fast_engine.decode_path == "int8-decode"
    ids = plain_engine.prepare_prompt([ChatMessage("user", "hi")]).ids
    reference = greedy_reference(plain_engine, ids, 8)
    _, plain_logits = teacher_forced(plain_engine, ids, reference)
    _, fast_logits = teacher_forced(fast_engine, ids, reference)
    for want, got in zip(plain_logits[1:], fast_logits[1:], strict=True):
        assert float((got - want).abs().max() / want.abs().max()) < LOGIT_ERROR_BOUND
    _, stats, done = run(
        fast_engine.generate(ReplyRequest([ChatMessage("user", "hi")], SamplingParams(max_new_tokens=5, seed=1)))
    )
    assert stats.decode_path == "int8-decode" and done.finish_reason in ("stop", "length")


def test_regenerate_and_edit_with_the_fast_path_give_identical_replies(fast: Engine) -> None:
    """bf16 on any CPU (issue 28: an AMX Xeon's edited turn answered differently): the reused prefix is whole prefill
    calls, and the rest is prefilled by the same calls as in a fresh run (tests/core/test_prefix_reuse.py)."""
    session = ChatSession(
        EngineBackend.wrap(fast), system_prompt=LONG_SYSTEM_PROMPT, params=GREEDY, use_response_cache=False
    )
    first, first_stats, _ = run(session.ask("What is 2 + 2?"))
    assert first_stats.prompt_tokens > 4 * PREFILL_GRID
    last_call_start = (first_stats.prompt_tokens - 1) // PREFILL_GRID * PREFILL_GRID
    again, again_stats, _ = run(session.regenerate())
    assert again == first
    assert again_stats.cached_tokens == last_call_start  # the prompt's last prefill call runs again
    edited, edited_stats, _ = run(session.edit(0, "What is 3 + 3?"))
    assert edited_stats.cached_tokens == last_call_start < edited_stats.prompt_tokens
    messages = [ChatMessage("system", LONG_SYSTEM_PROMPT), ChatMessage("user", "What is 3 + 3?")]
    fresh, _, _ = run(fast.generate(ReplyRequest(messages, GREEDY)))
    assert edited == fresh  # the reused prefix came from prefill, which the fast path leaves exact


def test_next_turn_reuses_the_cache_with_the_fast_path(fast: Engine) -> None:
    session = ChatSession(
        EngineBackend.wrap(fast), system_prompt="You are concise.", params=GREEDY, use_response_cache=False
    )
    run(session.ask("Name a fruit."))
    text, stats, done = run(session.ask("Name a colour."))
    assert stats.cached_tokens > 10 and stats.decode_path == "int8-decode"
    assert text and done.finish_reason in ("stop", "length")


def cancel_after_first_token(engine: Engine) -> tuple[str, int]:
    """Set cancel at the first token; return the finish reason and how many tokens still came after it."""
    cancel = threading.Event()
    tokens_after_cancel = 0
    events = engine.generate(
        ReplyRequest([ChatMessage("user", "Count from 1 to 100.")], SamplingParams(temperature=0, max_new_tokens=200)),
        cancel=cancel,
    )
    finish = ""
    for event in events:
        if isinstance(event, TokenEvent):
            if cancel.is_set():
                tokens_after_cancel += 1
            cancel.set()
        elif isinstance(event, DoneEvent):
            finish = event.finish_reason
    return finish, tokens_after_cancel


def test_cancel_stops_within_one_token_on_the_fast_path(fast: Engine) -> None:
    finish, tokens_after_cancel = cancel_after_first_token(fast)
    assert finish == "cancelled" and tokens_after_cancel <= 1


def test_missing_kernel_falls_back_to_the_plain_path_with_the_reason(
    default_loaded: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(int8, "KERNEL_NAME", "_weight_int8pack_mm_from_the_future")
    engine = Engine(default_loaded, decode_path="int8-decode")
    assert engine.decode_path == "eager"
    _, stats, done = run(
        engine.generate(ReplyRequest([ChatMessage("user", "Hi")], SamplingParams(temperature=0, max_new_tokens=4)))
    )
    assert (
        stats.decode_path == "eager" and "has no _weight_int8pack_mm_from_the_future kernel" in stats.decode_path_note
    )
    assert done.finish_reason in ("stop", "length")


def test_a_kernel_that_disagrees_on_the_probe_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(int8.PackedInt8, "matmul", lambda self, x: torch.zeros(1, self.qweight.shape[0]) + 5)
    assert "disagrees" in int8.int8_kernel_available()


def test_a_repacking_failure_falls_back_and_leaves_the_model_unpatched(
    tiny_model_dir: Any, monkeypatch: pytest.MonkeyPatch, isolated_cache: Path
) -> None:
    from app.core.engines.loader import load_model

    loaded = load_model(str(tiny_model_dir("qwen2")), quantization="bf16", device="cpu")

    real_dense_weight = int8.dense_weight
    calls: list[int] = []

    def second_layer_fails(module: torch.nn.Module) -> torch.Tensor | None:
        weight = real_dense_weight(module)
        if weight is not None:
            calls.append(1)
            if len(calls) == 2:  # after one layer was patched: the cleanup must undo it
                raise RuntimeError("out of memory")
        return weight

    monkeypatch.setattr(int8, "dense_weight", second_layer_fails)
    engine = Engine(loaded, decode_path="int8-decode")
    assert engine.decode_path == "eager" and "repacking failed" in engine.decode_path_note
    assert not any(hasattr(m, int8.PATCH_ATTR) for m in loaded.model.modules())
    _, stats, done = run(
        engine.generate(ReplyRequest([ChatMessage("user", "Hi")], SamplingParams(temperature=0, max_new_tokens=3)))
    )
    assert done.finish_reason in ("stop", "length") and "repacking failed" in stats.decode_path_note


def test_int8_copies_are_cached_on_disk_and_reused_by_the_next_load(tiny_model_dir: Any, isolated_cache: Path) -> None:
    from app.core.engines.loader import load_model

    folder = tiny_model_dir("llama", hidden_size=96)
    first = Engine(load_model(str(folder), quantization="bf16", device="cpu"), decode_path="int8-decode")
    assert "packed in" in first.decode_path_note
    cached = list((isolated_cache / "decode-int8").glob("*.safetensors"))
    assert len(cached) == 1 and not list((isolated_cache / "decode-int8").glob("*.partial"))

    second = Engine(load_model(str(folder), quantization="bf16", device="cpu"), decode_path="int8-decode")
    assert second.decode_path == "int8-decode" and "loaded from the cache" in second.decode_path_note
    ids = first.prepare_prompt([ChatMessage("user", "hello")]).ids
    reference = greedy_reference(first, ids, 4)
    assert teacher_forced(first, ids, reference)[0] == teacher_forced(second, ids, reference)[0]

    cached[0].write_bytes(b"not a safetensors file")  # damaged: repacked, never trusted
    third = Engine(load_model(str(folder), quantization="bf16", device="cpu"), decode_path="int8-decode")
    assert third.decode_path == "int8-decode" and "packed in" in third.decode_path_note


def test_path_choice_for_other_devices_weights_and_names(default_loaded: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    model = default_loaded.model
    assert fastpath.apply_decode_path(model, "cuda:0", "nf4").name == "eager"
    exact = fastpath.apply_decode_path(model, "cpu", "fp32")
    assert exact.name == "eager" and "fp32" in exact.note
    unknown = fastpath.apply_decode_path(model, "cpu", "bf16", "warp-drive")
    assert unknown.name == "eager" and "warp-drive" in unknown.note
    monkeypatch.setenv("HEARTH_DECODE_PATH", "eager")
    assert Engine(default_loaded).decode_path == "eager"
