"""The fused C decode step (app/core/fastpath/native.py) against the plain path, its shared KV cache, and fallbacks.

Agreement bound (int8 or Q4_1 weights and Q8 activations change precision): teacher-forced on the plain path's greedy
tokens, the fused step's argmax matches on >= 90 % of steps on the default model with either weight format, and its
logits stay within 5 % (int8) / 15 % (Q4_1) of the plain path's (max abs difference / max abs logit) on tiny random
models of every architecture it runs. Random tiny models are harder on 4 bits than trained ones: their weights have
no outliers for the block range to adapt to, so the bound is looser there; the default model is the real measure.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from app.core.chat.events import ChatMessage, DoneEvent
from app.core.chat.sampling import SamplingParams
from app.core.engines.backend import ReplyRequest
from app.core.engines.engine import Engine, KVState, kv_cache_bytes
from app.core.engines.local import EngineBackend
from app.core.engines.session import ChatSession
from app.core.fastpath import cpu, kernel, native, packed
from app.core.fastpath import select as fastpath
from app.core.fastpath.team import TeamChooser
from tests.core.test_fastpath import (
    AGREEMENT_BOUND,
    GREEDY,
    LOGIT_ERROR_BOUND,
    cancel_after_first_token,
    greedy_reference,
    run,
    teacher_forced,
)

LOGIT_ERROR_BOUNDS = {"fused-int8": LOGIT_ERROR_BOUND, "fused-q4": 0.15}
KERNEL = kernel.load_library()
# Where this machine can't build the kernel (no C compiler, no AVX2), these tests say so and skip; the fallback
# itself is tested in tests/core/test_fastpath.py with the kernel made unavailable.
pytestmark = pytest.mark.skipif(isinstance(KERNEL, str), reason=f"no fused decode kernel here: {KERNEL}")


@pytest.fixture(scope="module")
def plain(default_loaded: Any) -> Engine:
    return Engine(default_loaded, decode_path="eager")


@pytest.fixture(scope="module")
def fused(default_loaded: Any) -> Engine:
    engine = Engine(default_loaded)
    assert engine.decode_path == "fused-q4", engine.decode_path_note  # the fastest measured CPU path is the default
    return engine


@pytest.fixture
def fresh_library(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Forget the process's library for one test (and again after it, so later tests rebuild cleanly); compile from
    source, as a source install without prebuilt kernels does (tests/core/test_native_integrity.py tests those)."""
    monkeypatch.setenv(kernel.KERNEL_ENV, "compile")
    # what these tests check is the build, its cache and its fallbacks: -O1 compiles in a third of -O3's time, and
    # the same floats (the order is fixed by -ffp-contract=off and the intrinsics; tests/core/test_native_arm.py)
    monkeypatch.setattr(kernel, "EXTRA_FLAGS", ("-O1",))
    kernel.reset_library_for_tests()
    yield native
    kernel.reset_library_for_tests()


def test_auto_runs_bf16_on_the_cpu_through_the_fused_step_and_says_so(fused: Engine) -> None:
    text, stats, done = run(
        fused.generate(ReplyRequest([ChatMessage("user", "What is the capital of France?")], GREEDY))
    )
    assert "Paris" in text and done.finish_reason in ("stop", "length")
    assert stats.decode_path == "fused-q4" and "prefill in bf16" in stats.decode_path_note
    assert fused.path.fused is not None
    team = TeamChooser(fused.path.fused.threads).description()  # the torch runtime's team adapts too
    assert team in stats.decode_path_note
    # The note names the Q4_1 kernel this build runs (which one depends on the CPU: any of them is right here).
    assert not isinstance(KERNEL, str)
    q4_kernel = kernel.q4_kernel_name(KERNEL.lib)
    assert f"fused Q4_1 x16, {q4_kernel} (lm_head int8) decode step" in stats.decode_path_note
    # Q4_1 decoder matrices (~106M weights at 5 bits) and an int8 lm_head (~28M): what the path adds, as planned.
    assert 85 * 2**20 < fused.path.added_bytes < 100 * 2**20


@pytest.mark.parametrize("path", ["fused-int8", "fused-q4"])
def test_fused_step_agrees_with_the_plain_path_on_the_default_model(
    plain: Engine, default_loaded: Any, path: str
) -> None:
    fused = Engine(default_loaded, decode_path=path)
    assert fused.decode_path == path
    ids = plain.prepare_prompt([ChatMessage("user", "Tell me about the history of bread.")]).ids
    reference = greedy_reference(plain, ids, 24)
    picks, _ = teacher_forced(fused, ids, reference)
    agreement = sum(a == b for a, b in zip(picks, reference, strict=True)) / len(reference)
    assert agreement >= AGREEMENT_BOUND
    assert picks[0] == reference[0]  # the first token comes from prefill, which stays on the model's own kernels


@pytest.mark.parametrize(
    ("arch", "overrides"),
    [
        ("llama", {}),
        ("llama-untied", {}),
        ("llama", {"attention_bias": True, "mlp_bias": True}),
        ("qwen2", {}),
        ("mistral", {"sliding_window": None}),
        ("llama", {"num_key_value_heads": 4}),  # no grouped-query attention
    ],
)
@pytest.mark.parametrize("quantization", ["bf16", "fp32", "nf4"])
@pytest.mark.parametrize("path", ["fused-int8", "fused-q4"])
def test_fused_logits_stay_within_the_bound_on_tiny_models(
    arch: str, overrides: dict[str, Any], quantization: str, path: str, tiny_model_dir: Any
) -> None:
    from app.core.engines.loader import load_model

    loaded = load_model(str(tiny_model_dir(arch, **overrides)), quantization=quantization, device="cpu")
    plain_engine = Engine(loaded, decode_path="eager")
    fused_engine = Engine(loaded, decode_path=path)
    assert fused_engine.decode_path == path, fused_engine.decode_path_note
    ids = plain_engine.prepare_prompt([ChatMessage("user", "hello there, how are you today?")]).ids
    reference = greedy_reference(plain_engine, ids, 12)
    _, plain_logits = teacher_forced(plain_engine, ids, reference)
    _, fused_logits = teacher_forced(fused_engine, ids, reference)
    assert torch.equal(plain_logits[0], fused_logits[0])  # prefill: the same kernels, the same logits
    for want, got in zip(plain_logits[1:], fused_logits[1:], strict=True):
        error = float((got - want).abs().max() / want.abs().max())
        assert error < LOGIT_ERROR_BOUNDS[path]


def test_the_fused_step_and_torch_share_one_kv_cache(default_loaded: Any, fused: Engine, plain: Engine) -> None:
    """Positions the C step writes are what torch attends to next, and the other way round."""
    ids = plain.prepare_prompt([ChatMessage("user", "Name three rivers.")]).ids
    kv = KVState()
    with torch.inference_mode():
        fused._forward(ids, kv)
        for token in (504, 3458, 282):
            fused._forward([token], kv, decode_step=True)  # C steps append in place
        assert native.is_slab_cache(kv.cache) and len(kv.ids) == kv.cache.get_seq_length() == len(ids) + 3
        after_fused = fused._forward([30, 1], kv)  # torch prefill on top of the C-written positions
        reference = KVState()
        reference_logits = plain._forward([*ids, 504, 3458, 282, 30, 1], reference)
        without_context = plain._forward([30, 1], KVState())
    for mine, theirs in zip(kv.cache.layers, reference.cache.layers, strict=True):
        assert mine.keys.shape == theirs.keys.shape
        # The C step's positions hold int8-weight K/V, prefill's hold the plain ones: close, not identical.
        assert torch.allclose(mine.keys.float(), theirs.keys.float(), atol=0.6, rtol=0.1)
    assert kv_cache_bytes(kv.cache) == kv_cache_bytes(reference.cache)  # the valid part, as the planner counts
    # torch attends to what the C step wrote: its logits are the plain run's, within the fused step's bound, and far
    # from the same two tokens without that context.
    error = float((after_fused - reference_logits).abs().max() / reference_logits.abs().max())
    assert error < LOGIT_ERROR_BOUNDS["fused-q4"]  # measured 0.023
    assert float((without_context - reference_logits).abs().max() / reference_logits.abs().max()) > 0.3  # 0.52


def test_slab_layers_grow_keep_their_contents_and_crop() -> None:
    arena = native.SlabArena(limit=2000)
    layer = native.SlabLayer(arena, kv_heads=2, head_dim=4, dtype=torch.float32)
    first = torch.randn(1, 2, 300, 4)
    layer.update(first, first * 2)
    assert layer.capacity >= 300 and arena.version == 1
    second = torch.randn(1, 2, 400, 4)
    keys, values = layer.update(second, second * 2)  # past the capacity: reallocated, contents copied
    assert arena.version == 2 and layer.capacity >= 700
    assert torch.equal(keys, torch.cat([first, second], dim=2)) and torch.equal(values, keys * 2)
    layer.crop(-650)
    assert layer.get_seq_length() == 50 and torch.equal(layer.keys, first[:, :, :50])
    layer.reserve(5000)
    assert layer.capacity == 5000  # never less than needed, even past the model's window
    with pytest.raises(TypeError):
        layer.keys = torch.zeros(1)
    with pytest.raises(ValueError, match="negative"):
        layer.crop(3)


@pytest.mark.parametrize("path", ["fused-int8", "fused-q4"])
def test_regenerate_and_edit_with_the_fused_step_give_identical_replies(default_loaded_fp32: Any, path: str) -> None:
    # fp32 prefill, as the engine's other equality tests (tests/conftest.py says why bf16 can flip a near-tie).
    fused = Engine(default_loaded_fp32, decode_path=path)
    assert fused.decode_path == path
    session = ChatSession(EngineBackend.wrap(fused), params=GREEDY, use_response_cache=False)
    first, _, _ = run(session.ask("What is 2 + 2?"))
    again, again_stats, _ = run(session.regenerate())
    assert again == first and again_stats.decode_path == fused.decode_path
    assert again_stats.cached_tokens == 0  # the prompt was one prefill call: it runs again whole (as a fresh run's)
    edited, edited_stats, _ = run(session.edit(0, "What is 3 + 3?"))
    assert edited_stats.cached_tokens == 0  # (a reused prefix: tests/core/test_prefix_reuse.py, for every variant)
    fresh, _, _ = run(fused.generate(ReplyRequest([ChatMessage("user", "What is 3 + 3?")], GREEDY)))
    assert edited == fresh


def test_next_turn_reuses_the_cache_the_fused_step_wrote(fused: Engine) -> None:
    session = ChatSession(
        EngineBackend.wrap(fused), system_prompt="You are concise.", params=GREEDY, use_response_cache=False
    )
    _, first_stats, _ = run(session.ask("Name a fruit."))
    text, stats, done = run(session.ask("Name a colour."))
    # The whole first exchange, the reply's decode-written positions included, is reused.
    assert stats.cached_tokens >= first_stats.prompt_tokens + first_stats.generated_tokens - 2
    assert text and done.finish_reason in ("stop", "length") and stats.decode_path == fused.decode_path


def test_cancel_stops_within_one_token_on_the_fused_step(fused: Engine) -> None:
    finish, tokens_after_cancel = cancel_after_first_token(fused)
    assert finish == "cancelled" and tokens_after_cancel <= 1


def test_sampling_runs_on_the_fused_logits_and_is_reproducible(fused: Engine) -> None:
    params = SamplingParams(temperature=0.8, top_p=0.9, top_k=40, repetition_penalty=1.1, max_new_tokens=16, seed=7)
    first, stats, _ = run(fused.generate(ReplyRequest([ChatMessage("user", "Write a haiku about bread.")], params)))
    second, _, _ = run(fused.generate(ReplyRequest([ChatMessage("user", "Write a haiku about bread.")], params)))
    assert first == second and first and stats.decode_path == fused.decode_path


def test_architectures_the_kernel_lacks_fall_back_with_the_reason(tiny_model_dir: Any) -> None:
    from app.core.engines.loader import load_model

    for arch, overrides, reason in (
        ("gemma2", {}, "not gemma2"),
        ("phi3", {}, "not phi3"),
        ("mistral", {}, "sliding-window"),
        ("llama", {"hidden_act": "gelu"}, "activation gelu"),
    ):
        loaded = load_model(str(tiny_model_dir(arch, **overrides)), quantization="bf16", device="cpu")
        engine = Engine(loaded)
        assert engine.decode_path == "eager" and reason in engine.decode_path_note
        _, stats, done = run(
            engine.generate(ReplyRequest([ChatMessage("user", "Hi")], SamplingParams(temperature=0, max_new_tokens=3)))
        )
        assert done.finish_reason in ("stop", "length") and reason in stats.decode_path_note


def test_no_compiler_falls_back_to_the_plain_path_with_the_reason(
    default_loaded: Any, fresh_library: Any, monkeypatch: pytest.MonkeyPatch, isolated_cache: Path
) -> None:
    monkeypatch.setenv("CC", "")
    monkeypatch.setenv("PATH", str(isolated_cache))  # nothing to find there
    engine = Engine(default_loaded)
    assert engine.decode_path == "eager"
    _, stats, done = run(
        engine.generate(ReplyRequest([ChatMessage("user", "Hi")], SamplingParams(temperature=0, max_new_tokens=3)))
    )
    assert done.finish_reason in ("stop", "length")
    assert "fused decode unavailable: no C compiler found" in stats.decode_path_note


def test_a_failing_compile_falls_back_with_the_compilers_error(
    default_loaded: Any, fresh_library: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, isolated_cache: Path
) -> None:
    broken = tmp_path / "hearth_decode.c"
    broken.write_text("int hearth_abi(void) { return }\n")
    monkeypatch.setattr(kernel, "SOURCE", broken)
    choice = fastpath.apply_decode_path(default_loaded.model, "cpu", "bf16")
    assert choice.name == "eager" and "compiling the fused decode kernel failed" in choice.note
    assert "error" in choice.note
    assert not list((isolated_cache / "native").glob("*.partial"))


def test_a_cpu_without_avx2_falls_back_with_the_reason(
    default_loaded: Any, fresh_library: Any, monkeypatch: pytest.MonkeyPatch, isolated_cache: Path
) -> None:
    monkeypatch.setenv(kernel.TARGET_ENV, "scalar")  # builds the plain C kernel, as on such CPUs
    choice = fastpath.apply_decode_path(default_loaded.model, "cpu", "bf16")
    assert choice.name == "eager" and "lacks AVX2+FMA" in choice.note


def test_a_kernel_target_that_is_not_one_of_this_cpus_says_which_are(
    fresh_library: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(kernel.TARGET_ENV, "avx9")
    choices = ", ".join(kernel.TARGETS.get(cpu.machine_arch(), ())) or "nothing on this CPU"
    assert kernel.load_library() == f"HEARTH_KERNEL_TARGET=avx9 is not one of {choices}"


def test_the_kernel_and_the_packed_weights_are_cached_across_loads(
    tiny_model_dir: Any, isolated_cache: Path, first_compile_by_copy: list[list[str]]
) -> None:
    from app.core.engines.loader import load_model

    folder = tiny_model_dir("qwen2", hidden_size=96)
    first = Engine(load_model(str(folder), quantization="bf16", device="cpu"))
    assert first.decode_path == "fused-q4" and "packed in" in first.decode_path_note
    assert "kernel compiled in" in first.decode_path_note
    assert len(list((isolated_cache / "native").glob("hearth_decode-*.so"))) == 1
    assert len(list((isolated_cache / "decode-fused-q4").glob("*.safetensors"))) == 1

    kernel.reset_library_for_tests()  # as in a new process: the library file is reused, not rebuilt
    second = Engine(load_model(str(folder), quantization="bf16", device="cpu"))
    assert "loaded from the cache" in second.decode_path_note and "kernel compiled in" not in second.decode_path_note
    assert len(first_compile_by_copy) == 1
    ids = first.prepare_prompt([ChatMessage("user", "hello")]).ids
    reference = greedy_reference(first, ids, 4)
    assert teacher_forced(first, ids, reference)[0] == teacher_forced(second, ids, reference)[0]

    cached = next((isolated_cache / "decode-fused-q4").glob("*.safetensors"))
    cached.write_bytes(b"not a safetensors file")  # damaged: repacked, never trusted
    third = Engine(load_model(str(folder), quantization="bf16", device="cpu"))
    assert third.decode_path == "fused-q4" and "packed in" in third.decode_path_note


def test_a_refused_step_ends_the_reply_with_an_error_and_the_engine_recovers(
    fused: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    decoder = fused.path.fused
    assert decoder is not None
    real_step = decoder.step
    monkeypatch.setattr(decoder, "step", lambda token, cache: real_step(10**9, cache))  # out of the vocabulary
    events = list(
        fused.generate(ReplyRequest([ChatMessage("user", "Hi")], SamplingParams(temperature=0, max_new_tokens=4)))
    )
    done = events[-1]
    assert isinstance(done, DoneEvent) and done.finish_reason == "error"
    assert "refused token 1000000000" in (done.error or "")
    monkeypatch.undo()
    text, _, done = run(fused.generate(ReplyRequest([ChatMessage("user", "What is the capital of France?")], GREEDY)))
    assert done.finish_reason in ("stop", "length") and "Paris" in text


def test_forcing_the_fused_step_on_weights_it_does_not_take_says_so(default_loaded: Any) -> None:
    choice = fastpath.apply_decode_path(default_loaded.model, "cpu", "int8", "fused-int8")
    assert choice.name == "eager" and "does not take int8 weights" in choice.note


def test_steps_across_a_slab_reallocation_match_steps_in_room_made_beforehand(fused: Engine) -> None:
    """The step skips its per-layer reserve while the bound capacity has room; crossing it must still reallocate
    every layer and re-point the kernel."""
    ids = [(i * 37) % 40000 + 100 for i in range(500)]
    grown, roomy = KVState(), KVState()
    with torch.inference_mode():
        fused._forward(ids, grown)
        fused._forward(ids, roomy)
        assert grown.cache is not None and roomy.cache is not None
        assert grown.cache.layers[0].capacity == 512  # type: ignore[attr-defined]
        for layer in roomy.cache.layers:
            layer.reserve(1024)  # type: ignore[attr-defined]
        for token in range(1000, 1030):  # positions 500..529: the grown cache reallocates at 512
            want = fused._forward([token], roomy, decode_step=True)
            got = fused._forward([token], grown, decode_step=True)
            assert torch.equal(got, want)
        assert grown.cache.layers[0].capacity > 512  # type: ignore[attr-defined]
        grown.cache.layers[3].reserve(4096)  # type: ignore[attr-defined]
        with pytest.raises(RuntimeError, match="the KV cache's layers have different capacities"):
            fused._forward([5], grown, decode_step=True)


def test_a_new_conversation_never_writes_into_a_freed_cache(fused: Engine) -> None:
    """Each new KVState gets fresh slabs; the step must point at them, not at a collected cache's (heap corruption)."""
    texts = set()
    for _ in range(6):  # new caches, the old ones garbage: their arenas' ids get reused
        text, _, _ = run(
            fused.generate(ReplyRequest([ChatMessage("user", "What is the capital of France?")], GREEDY), kv=KVState())
        )
        texts.add(text)
    assert len(texts) == 1 and "Paris" in texts.pop()


@pytest.mark.parametrize("arch", ["default", "qwen2"])
def test_the_planner_counts_exactly_what_the_fused_path_adds(
    arch: str, default_loaded: Any, tiny_model_dir: Any
) -> None:
    from app.core.engines.loader import load_model
    from app.core.memory.planner import plan_memory

    if arch == "default":
        loaded, source = default_loaded, None
    else:
        folder = tiny_model_dir(arch)
        loaded, source = load_model(str(folder), quantization="bf16", device="cpu"), str(folder)
    engine = Engine(loaded)
    plan = plan_memory(source, quantization="bf16", device="cpu", context=1024)
    assert engine.decode_path == "fused-q4"
    assert plan.overhead["decode_copies"] == engine.path.added_bytes
    assert "decode_copies" not in plan_memory(source, quantization="fp32", device="cpu", context=1024).overhead


@pytest.mark.parametrize("path", ["fused-int8", "fused-q4"])
def test_long_contexts_take_the_chunked_attention_and_stay_within_the_bound(path: str, tiny_model_dir: Any) -> None:
    """Past SHORT_CONTEXT (512, hearth_decode.c) positions attention runs in (kv head, chunk) units, then a merge."""
    from app.core.engines.loader import load_model

    loaded = load_model(str(tiny_model_dir("llama", max_position_embeddings=2048)), quantization="fp32", device="cpu")
    with torch.no_grad():  # peaked attention (random weights give near-uniform scores, which hide merge errors)
        for layer in loaded.model.model.layers:
            layer.self_attn.q_proj.weight.mul_(8)
            layer.self_attn.k_proj.weight.mul_(8)
    plain_engine, fused_engine = Engine(loaded, decode_path="eager"), Engine(loaded, decode_path=path)
    assert fused_engine.decode_path == path
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(100, 40000, (700,), generator=generator).tolist()  # past 512: the chunked pass
    reference = greedy_reference(plain_engine, ids, 6)
    _, plain_logits = teacher_forced(plain_engine, ids, reference)
    _, fused_logits = teacher_forced(fused_engine, ids, reference)
    for want, got in zip(plain_logits[1:], fused_logits[1:], strict=True):
        assert float((got - want).abs().max() / want.abs().max()) < LOGIT_ERROR_BOUNDS[path]


@pytest.mark.skipif(not {"amx_tile", "amx_int8"} <= cpu.cpu_flags(), reason="this CPU has no AMX tiles")
def test_amx_prefill_is_on_by_default_and_the_avx512_cap_turns_it_off(
    fresh_library: Any, monkeypatch: pytest.MonkeyPatch, isolated_cache: Path
) -> None:
    """Where the CPU has AMX the library's prefill uses the tiles; HEARTH_KERNEL_TARGET=avx512 (the switch a user has
    for a kernel that misbehaves) keeps the same build on its VNNI loops."""
    library = kernel.load_library()
    assert not isinstance(library, str), library
    assert library.lib.hearth_amx(-1) == 1
    kernel.reset_library_for_tests()
    monkeypatch.setenv(kernel.TARGET_ENV, "avx512")
    library = kernel.load_library()
    assert not isinstance(library, str), library
    assert library.lib.hearth_q4_kernel() == 4 and library.lib.hearth_amx(-1) == 0


@pytest.mark.skipif(cpu.machine_arch() != "x86_64", reason="the AMX code is x86-64's")
def test_an_assembler_without_the_amx_instructions_still_builds_the_kernel(
    fresh_library: Any, monkeypatch: pytest.MonkeyPatch, isolated_cache: Path
) -> None:
    """binutils before 2.36 does not know tileloadd: that compile fails, and the kernel is built again without its
    AMX code (the rest of it unchanged), and says so."""
    compile_source = kernel._compile
    commands: list[list[str]] = []

    def old_assembler(compiler: str, flags: list[str], target: Path) -> str:
        commands.append(flags)
        if kernel.NO_AMX_FLAG not in flags:
            return "the C compiler failed: Error: no such instruction: `tileloadd (%rax,%rdx,1),%tmm3'"
        return compile_source(compiler, flags, target)

    monkeypatch.setattr(kernel, "_compile", old_assembler)
    library = kernel.load_library()
    assert not isinstance(library, str), library
    assert [kernel.NO_AMX_FLAG in flags for flags in commands] == [False, True]
    assert "without AMX" in library.origin and library.lib.hearth_amx(1) == 0


@pytest.mark.skipif(not {"avx2", "fma", "f16c"} <= cpu.cpu_flags(), reason="this CPU can't run the AVX2 kernel")
def test_the_avx2_build_prefills_from_the_records_and_prefills_head_like_the_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The AVX2 branches of hearth_q4_prefill and hearth_lm_head, built and run here even on an AVX-512 CPU, through
    the switch a user has (HEARTH_KERNEL_TARGET=avx2). Compiled as a source install compiles it, into the run's
    shared cache, where `make test` compiled it beside lint (a private cache and -O1 took 11 s here)."""
    monkeypatch.setenv(kernel.KERNEL_ENV, "compile")
    monkeypatch.setenv(kernel.TARGET_ENV, "avx2")
    kernel.reset_library_for_tests()  # the run's library comes back after the test (conftest's run_kernel_library)
    library = kernel.load_library()
    if isinstance(library, str):
        pytest.skip(library)
    assert library.lib.hearth_q4_kernel() == 3  # the AVX2 kernel
    assert "-mno-avx512f" in library.origin
    assert library.lib.hearth_avx_vnni() == 0  # AVX2 itself, also where -march=native would bring AVX-VNNI
    generator = torch.Generator().manual_seed(6)
    weight = torch.randn(48, 96, generator=generator)
    records = packed.interleave_q4(*native.quantize_q4_blocks(weight))
    layer = packed.Q4Linear(records, None, packed.Scratch(), library, torch.float32)
    assert layer.record_rows > 0
    x = torch.randn(10, 96, generator=generator)
    reference = x.double() @ packed.dequantize_q4(records, 96).double().t()
    assert float((layer(x).double() - reference).abs().max() / reference.abs().max()) < 1e-4  # 15-bit activations
    assert torch.equal(layer(x[3:4]), layer(x)[3:4])
    q, scale = native.quantize_head(weight[:37])
    head, in_torch = packed.Int8RowsLinear(q, scale, library), packed.Int8RowsLinear(q, scale)
    want = in_torch(x[:2])
    assert float((head(x[:2]) - want).abs().max() / want.abs().max()) < LOGIT_ERROR_BOUND


def test_the_step_s_team_follows_the_chooser_and_any_size_gives_the_same_logits(fused: Engine) -> None:
    """The torch runtime's step runs on the team its chooser picks, as the torch-free runtime's does (a fixed team
    collapsed beside another program's busy process); the chooser may switch between any two steps, short contexts and
    long."""
    decoder = fused.path.fused
    assert decoder is not None and decoder.decode_team.largest == decoder.threads
    if decoder.threads < 2:
        pytest.skip("one thread here: no other team size to switch to")
    # past SHORT_CONTEXT (512) positions the step's attention runs in chunks, which once followed the team's size
    prompts = [[(i * 37) % 40000 + 100 for i in range(length)] for length in (40, 600)]
    chosen = decoder.decode_team
    logits: dict[int, list[torch.Tensor]] = {}
    try:
        for size in (decoder.threads, 1):
            decoder.decode_team = TeamChooser(size, explore_every=0)
            logits[size] = []
            for ids in prompts:
                kv = KVState()
                with torch.inference_mode():
                    fused._forward(ids, kv)
                    logits[size] += [fused._forward([token], kv, decode_step=True) for token in (7, 8, 9)]
            assert set(decoder.decode_team.average) == {size}  # each step was timed on that team
    finally:
        decoder.decode_team = chosen
    assert all(torch.equal(a, b) for a, b in zip(logits[decoder.threads], logits[1], strict=True))


def test_fix_threads_holds_the_torch_runtime_s_fused_step_to_one_team(default_loaded: Any) -> None:
    """What bench/peer.py uses to give Hearth llama.cpp's thread count: capped at the team the engine started with."""
    engine = Engine(default_loaded)
    fused = engine.path.fused
    assert fused is not None
    engine.fix_threads(64)
    assert fused.decode_team.largest == fused.threads and fused.decode_team.explore_every == 0
    engine.fix_threads(1)
    assert fused.decode_team.candidates() == [1]


def test_the_step_s_scratch_is_sized_for_its_largest_team_whichever_ran_last(fused: Engine) -> None:
    """A cache bound after a step on a smaller team once got a scratch for that team, and the next step on the
    largest wrote past its end (a heap corruption glibc caught in the prefix-reuse probe)."""
    decoder = fused.path.fused
    assert decoder is not None
    arguments = decoder.arguments
    if arguments.most_threads < 2:
        pytest.skip("one thread here: no smaller team")
    threads_at = kernel.CFG_FIELDS.index("threads")
    capacity = 4096
    arguments.cfg[threads_at] = arguments.most_threads
    needed = int(arguments.lib.hearth_scratch_floats(ctypes.addressof(arguments.cfg), capacity))
    kept = arguments.scratch, arguments.capacity, decoder._bound
    try:
        arguments.set_threads(1)
        arguments.scratch = np.empty(0, dtype=np.float32)
        stride = len(kernel.LAYER_FIELDS)
        keys = [arguments.layer_args[i * stride + stride - 2] for i in range(decoder.layers)]
        values = [arguments.layer_args[i * stride + stride - 1] for i in range(decoder.layers)]
        arguments.bind_kv(keys, values, capacity)
        assert arguments.scratch.size >= needed
        assert arguments.cfg[threads_at] == 1  # the next step still runs on the team chosen for it
        arguments.set_threads(64)
        assert arguments.cfg[threads_at] == arguments.most_threads  # never a team the scratch has no room for
    finally:
        arguments.scratch, arguments.capacity, decoder._bound = kept
        arguments.set_threads(arguments.most_threads)
        decoder._bound = None  # the next step binds its cache afresh
