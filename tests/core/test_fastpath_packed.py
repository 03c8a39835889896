"""`--quant q4`: the decoder matrices held once, as the fused step's Q4_1 copy, and prefill from them
(app/core/fastpath/packed.py).

Bounds: the q4 model's plain path (prefill through dequantized Q4_1 weights, torch's decode step) is the reference
for the fused step on the same weights, so only the int8 activations differ (the fused-int8 bound, 5 %); against the
bf16 model the weights themselves change (the fused-q4 bound, 15 %, and >= 90 % greedy agreement on the default
model).
"""

from __future__ import annotations

import gc
import mmap
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from app.core.chat.events import ChatMessage
from app.core.engines.backend import ReplyRequest
from app.core.engines.engine import Engine, KVState
from app.core.engines.loader import load_model, stored_dtype
from app.core.engines.local import EngineBackend
from app.core.engines.session import ChatSession
from app.core.errors import QuantizationError
from app.core.fastpath import cpu, int8, kernel, native, packed, rows, select
from app.core.memory.accounting import measured_weights_by_device
from app.core.memory.planner import plan_memory
from app.core.models.quant import resolve_quantization
from tests.core.test_fastpath import (
    AGREEMENT_BOUND,
    GREEDY,
    LOGIT_ERROR_BOUND,
    cancel_after_first_token,
    greedy_reference,
    run,
    teacher_forced,
)

KERNEL = kernel.load_library()
needs_kernel = pytest.mark.skipif(isinstance(KERNEL, str), reason=f"no fused decode kernel here: {KERNEL}")
Q4_BOUND = 0.15  # the fused-q4 bound of tests/core/test_fastpath_native.py: 4-bit weights against 16-bit ones


@pytest.fixture(scope="module")
def default_q4() -> Any:
    return load_model(None, quantization="q4", device="cpu")


def test_q4_is_for_the_cpu_and_says_what_to_use_elsewhere() -> None:
    with pytest.raises(QuantizationError, match="q4 holds the weights for the CPU's fused decode step"):
        resolve_quantization("q4", "cuda:0")


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_c_dequantizer_matches_torchs_reference_on_group_ranges(dtype: torch.dtype) -> None:
    assert not isinstance(KERNEL, str)
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 128, generator=generator)
    records = packed.interleave_q4(*native.quantize_q4_blocks(weight))
    scratch = packed.Scratch()
    for groups in (slice(0, 6), slice(0, 3), slice(3, 6), slice(2, 4)):  # q/k/v and gate/up are group ranges
        with_c = packed.Q4Linear(records[groups], None, scratch, KERNEL, dtype).dense().clone()
        reference = packed.dequantize_q4(records[groups], 128, dtype)
        assert with_c.dtype == dtype and torch.equal(with_c, reference)
        without_c = packed.Q4Linear(records[groups], None, scratch, None, dtype).dense()
        assert torch.equal(without_c, reference)
    # The rows come back in order and within a Q4_1 step of the weights they were quantized from.
    dense = packed.dequantize_q4(records, 128)
    step = (weight.reshape(96, 4, 32).amax(-1) - weight.reshape(96, 4, 32).amin(-1)) / 15
    assert ((dense - weight).abs().reshape(96, 4, 32) <= step[..., None] * 0.51 + 1e-3).all()


ON_RECORDS = not isinstance(KERNEL, str) and KERNEL.lib.hearth_q4_kernel() in packed.RECORD_PREFILL_ROWS
needs_records_kernel = pytest.mark.skipif(not ON_RECORDS, reason="no x86 SIMD kernel that prefills from the records")


@needs_records_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_short_inputs_multiply_straight_from_the_records_closer_to_fp32_than_the_gemm(dtype: torch.dtype) -> None:
    assert not isinstance(KERNEL, str)
    generator = torch.Generator().manual_seed(5)
    records = packed.interleave_q4(*native.quantize_q4_blocks(torch.randn(48, 96, generator=generator)))
    bias = torch.randn(48, generator=generator)
    scratch = packed.Scratch()
    layer = packed.Q4Linear(records, bias, scratch, KERNEL, dtype)
    assert layer.record_rows > 0
    x = torch.randn(1, 49, 96, generator=generator)
    x[..., 7] = 40.0  # an outlier in every row's first block: int8 steps of it would lose the rest of the block
    x = x.to(dtype)
    out = layer(x)
    assert out.dtype == dtype and out.shape == (1, 49, 48) and scratch.peak == 0  # nothing dequantized
    exact = x[0].double() @ packed.dequantize_q4(records, 96).double().t() + bias.double()

    def error(y: torch.Tensor) -> float:
        return float((y[0].double() - exact).abs().max() / exact.abs().max())

    assert error(out) < (1e-4 if dtype == torch.float32 else 1e-2)  # 15-bit activations; bf16's output rounding
    for row in (0, 9, 48):  # a row's outputs do not depend on the other rows or on its place in a tile
        assert torch.equal(layer(x[:, row : row + 1]), out[:, row : row + 1])
    assert layer.record_rows == packed.RECORD_PREFILL_ROWS[KERNEL.lib.hearth_q4_kernel()]
    if dtype == torch.bfloat16:  # the bf16 GEMM rounds the activations to 8 bits: the records' path is closer
        gemm = packed.Q4Linear(records, bias, packed.Scratch(), KERNEL, dtype)
        gemm.record_rows = 0
        assert error(out) <= error(gemm(x))
    assert layer(torch.empty(0, 96, dtype=dtype)).shape == (0, 48)  # nothing to multiply: no kernel call to refuse
    longer = torch.randn(layer.record_rows + 1, 96, generator=generator).to(dtype)
    layer(longer)
    assert scratch.peak > 0  # past the kernel's RECORD_PREFILL_ROWS the GEMM path takes over


@needs_kernel
def test_the_planner_names_the_kernel_a_build_here_reports() -> None:
    assert not isinstance(KERNEL, str)
    if not KERNEL.origin.startswith("compiled"):
        pytest.skip(f"a prebuilt kernel ({KERNEL.origin}) may target less than this CPU")
    assert cpu.expected_q4_kernel() == KERNEL.lib.hearth_q4_kernel()


@needs_kernel
def test_the_record_kernel_refuses_shapes_it_cannot_multiply_and_says_so() -> None:
    assert not isinstance(KERNEL, str)
    records = packed.interleave_q4(*native.quantize_q4_blocks(torch.randn(16, 64)))
    x, y = torch.randn(2, 64), torch.empty(2, 16)
    q4_prefill = KERNEL.lib.hearth_q4_prefill
    assert q4_prefill(records.data_ptr(), 16, 64, x.data_ptr(), 0, 2, y.data_ptr(), 0, 1) == 0
    assert q4_prefill(records.data_ptr(), 16, 48, x.data_ptr(), 0, 2, y.data_ptr(), 0, 1) == -1  # not whole blocks
    assert q4_prefill(records.data_ptr(), 24, 64, x.data_ptr(), 0, 2, y.data_ptr(), 0, 1) == -1  # not whole groups
    assert q4_prefill(records.data_ptr(), 16, 64, x.data_ptr(), 0, 0, y.data_ptr(), 0, 1) == -1  # no rows

    class Refusing:  # a library whose kernel answers with the codes hearth_q4_prefill can return
        def __init__(self, code: int) -> None:
            self.lib = self
            self.code = code

        def hearth_q4_kernel(self) -> int:
            return 4  # AVX-512 VNNI's, which prefills from the records

        def hearth_q4_prefill(self, *args: Any) -> int:
            return self.code

    layer = packed.Q4Linear(records, None, packed.Scratch(), Refusing(-1), torch.float32)
    with pytest.raises(RuntimeError, match="the Q4_1 kernel refused a 9-row input"):
        layer(torch.randn(9, 64))
    layer = packed.Q4Linear(records, None, packed.Scratch(), Refusing(-3), torch.float32)
    with pytest.raises(MemoryError, match="could not allocate its buffers for a 3-row input"):
        layer(torch.randn(3, 64))


def test_the_x16_layout_round_trips_and_puts_each_rows_bytes_where_the_kernel_reads_them() -> None:
    generator = torch.Generator().manual_seed(1)
    nibbles, pairs = native.quantize_q4_blocks(torch.randn(32, 64, generator=generator))
    records = packed.interleave_q4(nibbles, pairs)
    assert records.shape == (2, 2 * 320) and records.dtype == torch.uint8
    back = packed.deinterleave_q4(records, 64)
    assert torch.equal(back[0], nibbles) and torch.equal(back[1], pairs)
    # Group 1, block 1, row 5: chunk k holds its bytes 4k..4k+3 at 4 * 5; then d and m of the 16 rows.
    record = records[1, 320:]
    row = 16 + 5
    for k in range(4):
        assert record[64 * k + 20 : 64 * k + 24].tolist() == nibbles[row, 16 + 4 * k : 16 + 4 * k + 4].tolist()
    d, m = record[256:288].view(torch.float16), record[288:320].view(torch.float16)
    assert d[5] == pairs[row, 2] and m[5] == pairs[row, 3]


@needs_kernel
@pytest.mark.parametrize(
    ("arch", "overrides"),
    [("llama", {}), ("llama-untied", {}), ("qwen2", {}), ("llama", {"attention_bias": True, "mlp_bias": True})],
)
def test_q4_holds_each_matrix_once_and_the_planner_counts_it_to_the_byte(
    arch: str, overrides: dict[str, Any], tiny_model_dir: Any
) -> None:
    folder = str(tiny_model_dir(arch, **overrides))
    loaded = load_model(folder, quantization="q4", device="cpu")
    assert loaded.quantization == "q4" and not loaded.notices
    model = loaded.model
    decoder_linears = [m for layer in model.model.layers for m in layer.modules() if isinstance(m, nn.Linear)]
    assert decoder_linears == []  # no 16-bit matrix left in any decoder layer
    engine = Engine(loaded)
    assert engine.decode_path == "fused-q4" and "held once" in engine.decode_path_note
    # The layers' buffers are views of the very tensors the C step reads: one copy.
    read_by_step = {t.untyped_storage().data_ptr() for t in engine.path.fused._keep}  # type: ignore[union-attr]
    held = [m for m in model.modules() if isinstance(m, packed.Q4Linear)]
    assert held and all(m.records.untyped_storage().data_ptr() in read_by_step for m in held)
    plan = plan_memory(folder, quantization="q4", device="cpu", context=256)
    assert measured_weights_by_device(model) == {"cpu": plan.weights_bytes}
    assert plan.overhead["decode_copies"] == engine.path.added_bytes
    assert plan.overhead["load_staging"] == 0
    bf16 = plan_memory(folder, quantization="bf16", device="cpu", context=256)
    one_copy = plan.weights_bytes + plan.overhead["decode_copies"]
    assert one_copy < bf16.weights_bytes + bf16.overhead["decode_copies"]  # bf16 holds its weights and the copies


@needs_kernel
@pytest.mark.parametrize("arch", ["llama", "llama-untied", "qwen2"])
def test_q4_prefill_is_close_to_bf16_and_the_fused_step_agrees_with_its_plain_path(
    arch: str, tiny_model_dir: Any
) -> None:
    folder = str(tiny_model_dir(arch))
    q4 = load_model(folder, quantization="q4", device="cpu")
    bf16 = load_model(folder, quantization="bf16", device="cpu")
    plain_bf16 = Engine(bf16, decode_path="eager")
    plain_q4, fused_q4 = Engine(q4, decode_path="eager"), Engine(q4)
    assert fused_q4.decode_path == "fused-q4"
    ids = plain_q4.prepare_prompt([ChatMessage("user", "hello there, how are you today?")]).ids
    reference = greedy_reference(plain_q4, ids, 10)
    _, q4_logits = teacher_forced(plain_q4, ids, reference)
    _, fused_logits = teacher_forced(fused_q4, ids, reference)
    _, bf16_logits = teacher_forced(plain_bf16, ids, reference)
    assert torch.equal(q4_logits[0], fused_logits[0])  # prefill: the same layers either way
    for want, got in zip(q4_logits[1:], fused_logits[1:], strict=True):
        assert float((got - want).abs().max() / want.abs().max()) < LOGIT_ERROR_BOUND
    for want, got in zip(bf16_logits, q4_logits, strict=True):
        assert float((got - want).abs().max() / want.abs().max()) < Q4_BOUND


@needs_kernel
def test_q4_on_the_default_model_agrees_with_bf16_and_keeps_the_chat_features(
    default_q4: Any, default_loaded: Any
) -> None:
    fused = Engine(default_q4)
    assert fused.decode_path == "fused-q4"
    text, stats, _ = run(fused.generate(ReplyRequest([ChatMessage("user", "What is the capital of France?")], GREEDY)))
    assert "Paris" in text and "Q4_1 weights held once" in stats.decode_path_note
    assert ("tokens a call multiplied straight from the records" in stats.decode_path_note) == ON_RECORDS
    plain = Engine(default_loaded, decode_path="eager")
    ids = plain.prepare_prompt([ChatMessage("user", "Tell me about the history of bread.")]).ids
    reference = greedy_reference(plain, ids, 24)
    picks, _ = teacher_forced(fused, ids, reference)
    assert sum(p == r for p, r in zip(picks, reference, strict=True)) >= AGREEMENT_BOUND * len(reference)
    # Prefix reuse across turns, regenerate and cancel run as on the other paths.
    session = ChatSession(EngineBackend.wrap(fused), params=GREEDY, use_response_cache=False)
    _, first_stats, _ = run(session.ask("Name a fruit."))
    _, second_stats, _ = run(session.ask("Name a colour."))
    assert second_stats.cached_tokens >= first_stats.prompt_tokens + first_stats.generated_tokens - 2
    _, again_stats, _ = run(session.regenerate())
    assert again_stats.cached_tokens == second_stats.cached_tokens  # the second turn's prefill call runs again
    finish, after_cancel = cancel_after_first_token(fused)
    assert finish == "cancelled" and after_cancel <= 1
    assert KVState().cache is None  # a fresh state shares nothing with the session's


@needs_kernel
def test_the_fused_step_reads_its_embedding_row_from_the_file_as_from_the_map(tiny_model_dir: Any) -> None:
    folder = str(tiny_model_dir("llama-untied"))
    by_row = Engine(load_model(folder, quantization="q4", device="cpu"))
    mapped_load = load_model(folder, quantization="q4", device="cpu")
    mapped_load.model.get_input_embeddings().rows = None  # what a platform without the file's offset does
    mapped = Engine(mapped_load)
    assert by_row.path.fused._rows is not None and mapped.path.fused._rows is None  # type: ignore[union-attr]
    ids = mapped.prepare_prompt([ChatMessage("user", "hello there")]).ids
    reference = greedy_reference(mapped, ids, 8)
    _, want = teacher_forced(mapped, ids, reference)
    _, got = teacher_forced(by_row, ids, reference)
    assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))
    # A token outside the table is refused as the kernel refuses it, before any read.
    kv = KVState()
    list(by_row.generate_from_ids(ids, GREEDY, kv=kv, use_response_cache=False))
    with pytest.raises(RuntimeError, match="refused token 1000000 at position"):
        by_row.path.fused.step(1_000_000, kv.cache)  # type: ignore[union-attr,arg-type]


@needs_kernel
def test_a_second_q4_load_maps_the_cached_copy(tiny_model_dir: Any, isolated_cache: Any) -> None:
    folder = str(tiny_model_dir("llama-untied"))
    first = Engine(load_model(folder, quantization="q4", device="cpu"))
    second = Engine(load_model(folder, quantization="q4", device="cpu"))
    assert "held once (packed" in first.decode_path_note
    assert "held once (loaded from the cache" in second.decode_path_note
    assert first.path.weights_digest == second.path.weights_digest != ""


def test_q4_where_the_fused_step_cannot_run_loads_bf16_and_says_why(tiny_model_dir: Any) -> None:
    loaded = load_model(str(tiny_model_dir("gemma2")), quantization="q4", device="cpu")
    assert loaded.quantization == "bf16"
    assert any(n.startswith("Loaded as bf16: q4 needs the fused decode step") for n in loaded.notices)
    assert not packed.is_held_once(loaded.model)


def test_auto_plans_q4_on_the_cpu_and_bf16_where_the_fused_step_cannot_run(tiny_model_dir: Any) -> None:
    assert plan_memory(None, quantization="auto", device="cpu", context=256).quantization == "q4"
    plan = plan_memory(str(tiny_model_dir("gemma2")), quantization="q4", device="cpu", context=256)
    assert plan.quantization == "bf16"
    assert any(note.startswith("Planned as bf16: q4 needs the fused decode step") for note in plan.notes)


def test_the_heads_x16_rows_round_trip_with_the_padding_and_prefill_reads_them_in_order() -> None:
    generator = torch.Generator().manual_seed(2)
    weight = torch.randn(37, 64, generator=generator)  # 37 rows: the last group holds 5 rows and 11 of padding
    q, scale = native.quantize_head(weight)
    rows, row_scale = int8.quantize_rows(weight)
    assert q.shape == (3, 2 * 512) and torch.equal(scale, row_scale)
    back = packed.deinterleave_rows(q, 64)
    assert torch.equal(back[:37], rows) and not back[37:].any()
    assert q.numel() + 4 * scale.numel() == native.head_bytes(37, 64)
    head = packed.Int8RowsLinear(q, scale)
    assert (head.out_features, head.in_features) == (37, 64)
    x = torch.randn(3, 64, generator=generator)
    expected = x @ (rows.float() * row_scale[:, None]).t()
    assert torch.allclose(head(x), expected, atol=1e-5)


@needs_kernel
def test_prefills_lm_head_runs_the_steps_int8_path_within_its_bound_of_torchs() -> None:
    generator = torch.Generator().manual_seed(4)
    weight = torch.randn(37, 64, generator=generator)  # the last group padded, as above
    q, scale = native.quantize_head(weight)
    in_torch, in_c = packed.Int8RowsLinear(q, scale), packed.Int8RowsLinear(q, scale, KERNEL)
    x = torch.randn(2, 3, 64, generator=generator).bfloat16()
    want, got = in_torch(x), in_c(x)
    assert got.shape == want.shape == (2, 3, 37) and got.dtype == torch.bfloat16
    # Only the activations' int8 rounding differs (the fused step's own, on every decode token).
    assert float((got.float() - want.float()).abs().max() / want.float().abs().max()) < LOGIT_ERROR_BOUND
    assert torch.equal(in_c(x[1:, 2:]), got[1:, 2:])  # a row's logits do not depend on the others


def _mapped_file_of(address: int) -> str:
    """The file whose mapping holds `address` in this process (Linux /proc/self/maps), or ""."""
    with open("/proc/self/maps", encoding="utf-8") as maps:
        for line in maps:
            fields = line.split()
            start, end = (int(part, 16) for part in fields[0].split("-"))
            if start <= address < end:
                return fields[5] if len(fields) > 5 else ""
    return ""


def _resident_kib(path: Path) -> int:
    """KiB of `path`'s mappings resident in this process (Linux /proc/self/smaps)."""
    total, current = 0, ""
    with open("/proc/self/smaps", encoding="utf-8") as smaps:
        for line in smaps:
            fields = line.split()
            if fields and "-" in fields[0] and not fields[0].endswith(":"):
                current = fields[5] if len(fields) > 5 else ""
            elif fields[:1] == ["Rss:"] and current == str(path):
                total += int(fields[1])
    return total


@needs_kernel
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_q4_reads_embedding_rows_from_the_file_and_prefills_a_tied_head_from_the_int8_rows(
    tiny_model_dir: Any,
) -> None:
    folder = tiny_model_dir("llama")  # tied lm_head, saved as fp32
    assert stored_dtype(folder) == torch.float32
    loaded = load_model(str(folder), quantization="q4", device="cpu")
    model = loaded.model
    embedding = model.get_input_embeddings()
    # A view of the weight file, in the file's dtype: never copied (only the pages read become resident).
    assert isinstance(embedding, packed.MappedEmbedding) and embedding.weight.dtype == torch.float32
    assert _mapped_file_of(embedding.weight.data_ptr()).endswith("model.safetensors")
    assert "weight" not in dict(embedding.named_parameters())
    # Everything else is a copy at the compute dtype, which the KV cache and attention keep (stated, not derived).
    assert native.kv_dtype(model) == torch.bfloat16 == model.dtype
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert all(not _mapped_file_of(p.data_ptr()).endswith(".safetensors") or p.numel() == 0 for p in model.parameters())
    assert embedding(torch.tensor([[1, 2]])).dtype == torch.bfloat16
    # Rows are read from the file by position: looking up every row maps none of the table's pages.
    assert embedding.rows is not None and embedding.rows.path == folder / "model.safetensors"
    before = _resident_kib(folder / "model.safetensors")
    looked_up = embedding(torch.arange(embedding.num_embeddings))
    assert _resident_kib(folder / "model.safetensors") == before
    assert torch.equal(looked_up, embedding.weight.to(torch.bfloat16))
    # The tied head is the int8 rows the fused step reads: prefill's logits never read the whole embedding.
    head = model.get_output_embeddings()
    engine = Engine(loaded)
    assert isinstance(head, packed.Int8RowsLinear)
    read_by_step = {t.untyped_storage().data_ptr() for t in engine.path.fused._keep}  # type: ignore[union-attr]
    assert head.q.untyped_storage().data_ptr() in read_by_step
    kv = KVState()
    _, stats, _ = run(engine.generate(ReplyRequest([ChatMessage("user", "hello")], GREEDY), kv=kv))
    assert stats.generated_tokens > 0 and kv.cache is not None
    assert all(layer.keys.dtype == torch.bfloat16 for layer in kv.cache.layers)  # the KV cache stays bf16
    plan = plan_memory(str(folder), quantization="q4", device="cpu", context=256)
    # The table is read by row: the plan counts one prefill chunk's rows (fp32 read and gathered, then bf16).
    rows_read = min(embedding.num_embeddings, 512)
    assert plan.overhead["embedding_rows"] == rows_read * embedding.embedding_dim * (4 + 4 + 2)
    assert "embedding_mapped" not in plan.overhead
    assert measured_weights_by_device(model) == {"cpu": plan.weights_bytes}


def test_the_prefill_scratch_never_holds_more_than_its_bound() -> None:
    generator = torch.Generator().manual_seed(1)
    rows, cols = 3 * 1024, 1024  # 12 MiB dense in fp32: three times the bound
    records = packed.interleave_q4(*native.quantize_q4_blocks(torch.randn(rows, cols, generator=generator)))
    scratch = packed.Scratch()
    library = None if isinstance(KERNEL, str) else KERNEL
    bias = torch.randn(rows, generator=generator)
    layer = packed.Q4Linear(records, bias, scratch, library, torch.float32)
    layer.record_rows = 0  # the dequantize + GEMM path (ARM's, or without the kernel)
    x = torch.randn(2, 10, cols, generator=generator)
    out = layer(x)
    assert 0 < scratch.peak <= packed.SCRATCH_BYTES < rows * cols * 4
    want = torch.nn.functional.linear(x, packed.dequantize_q4(records, cols), bias)
    assert out.shape == (2, 10, rows)
    assert torch.allclose(out, want, rtol=1e-4, atol=1e-4)
    # A matrix narrower than the bound is dequantized whole, once.
    small = packed.Scratch()
    narrow = packed.Q4Linear(records[:4], None, small, library, torch.float32)
    narrow.record_rows = 0
    narrow(x)
    assert small.peak == 64 * cols * 4


def test_q4_falls_back_to_a_bf16_copy_of_a_file_stored_in_fp32(tiny_model_dir: Any) -> None:
    loaded = load_model(str(tiny_model_dir("gemma2")), quantization="q4", device="cpu")
    assert loaded.quantization == "bf16" and loaded.model.dtype == torch.bfloat16
    assert all(p.dtype == torch.bfloat16 for p in loaded.model.parameters())


@needs_kernel
def test_q4_says_why_a_head_size_outside_its_16_row_groups_loads_as_bf16(tiny_model_dir: Any) -> None:
    folder = tiny_model_dir("llama-untied", head_dim=8)  # 4 heads of 8: the Q4_1 records hold whole groups of 16
    loaded = load_model(str(folder), quantization="q4", device="cpu")
    assert loaded.quantization == "bf16"
    assert any(
        "q4 needs the fused decode step (the fused kernel's Q4_1 layout needs head sizes in multiples of 16 "
        "(this model's: 8))" in notice
        for notice in loaded.notices
    ), loaded.notices
    assert not packed.is_held_once(loaded.model)


@needs_kernel
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps; MADV_PAGEOUT is Linux's")
def test_a_first_q4_load_gives_back_the_weight_files_pages_once_they_are_packed(
    tiny_model_dir: Any, isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tiny_model_dir("llama")  # tied: the int8 head is packed from the 12 MiB fp32 embedding
    weights = folder / "model.safetensors"
    with weights.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY) as view:
        probe = torch.frombuffer(view, dtype=torch.uint8, count=1 << 16)
        taken = rows.release_file_pages(probe)
        del probe
    if not taken:
        pytest.skip("this kernel refuses MADV_PAGEOUT (Linux 5.4+): the pages stay, as before")

    def resident_after_a_first_load() -> int:
        shutil.rmtree(isolated_cache / "decode-fused-q4", ignore_errors=True)  # no packed copy yet: pack from the file
        loaded = load_model(str(folder), quantization="q4", device="cpu")
        assert loaded.quantization == "q4" and getattr(loaded.model, select.HELD_ATTR).how.startswith("packed")
        resident = _resident_kib(weights)
        del loaded
        gc.collect()
        return resident

    given_back = resident_after_a_first_load()
    monkeypatch.setattr(select, "release_file_pages", lambda tensor: False)  # the same load with the pages kept
    kept = resident_after_a_first_load()
    assert kept * 1024 > weights.stat().st_size / 2  # packing read the file
    assert given_back < kept / 4


def test_only_a_file_mappings_pages_are_given_back() -> None:
    values = torch.randn(1 << 18)  # 1 MiB of anonymous memory: paging it out could only cost, never help
    before = values.clone()
    assert not rows.release_file_pages(values)
    assert torch.equal(values, before)


def test_the_head_and_the_matrices_quantize_a_chunk_of_rows_at_a_time_as_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    generator = torch.Generator().manual_seed(3)
    head = torch.randn(100, 64, generator=generator)  # not a multiple of the chunk: the last group is padded
    whole_q, whole_scale = native.quantize_rows(head)
    monkeypatch.setattr(native, "HEAD_QUANTIZE_ROWS", 32)
    q, scale = native.quantize_head(head)
    assert torch.equal(q, packed.interleave_rows(whole_q)) and torch.equal(scale, whole_scale)
    matrix = torch.randn(96, 64, generator=generator)
    model = nn.Module()
    model.model = nn.Module()
    layer = nn.Module()
    layer.self_attn = nn.Module()
    layer.mlp = nn.Module()
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        setattr(layer.self_attn, name, nn.Linear(64, 96 if name != "o_proj" else 64, bias=False))
    for name in ("gate_proj", "up_proj", "down_proj"):
        setattr(layer.mlp, name, nn.Linear(64, 64, bias=False))
    layer.self_attn.q_proj.weight.data = matrix
    model.model.layers = nn.ModuleList([layer])
    model.get_output_embeddings = lambda: packed.Int8RowsLinear(q, scale)
    monkeypatch.setattr(native, "PACK_ROWS", 32)  # q_proj's 96 rows in three chunks
    tensors = native.pack_model(model, lambda module: module.weight, "q4")
    merged = torch.cat([layer.self_attn.q_proj.weight, layer.self_attn.k_proj.weight, layer.self_attn.v_proj.weight])
    assert torch.equal(tensors["0.qkv.q"], native.quantize_q4(merged.detach())[0])
