"""The planner against what transformers + bitsandbytes really allocate, on real (tiny and default) models."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

from app.core.engines.loader import load_model
from app.core.errors import (
    CorruptModelError,
    DeviceUnavailableError,
    ModelNotFoundError,
    ModelTooLargeError,
    UnsupportedModelError,
)
from app.core.memory.accounting import kv_bytes_by_device, measured_weights_by_device
from app.core.memory.fit import check_fit
from app.core.memory.model_config import config_from_gguf
from app.core.memory.planner import kv_layout, plan_memory
from app.core.memory.types import format_bytes
from app.core.models import bnb_cpu
from app.core.models.model_source import default_model_gguf
from tests.core.memory.conftest import CpuKind

ARCHS = ["llama", "llama-untied", "qwen2", "mistral", "gemma2", "gemma3", "phi3"]
QUANTS = ["nf4", "nf4-nodq", "int8", "bf16"]
KV_TOKENS = 100  # past the tiny models' sliding windows (32 and 64), so the caps are exercised


def _fill_cache(model: torch.nn.Module, tokens: int) -> DynamicCache:
    cache = DynamicCache(config=model.config)
    ids = torch.arange(tokens).remainder(1000).unsqueeze(0) + 10
    with torch.inference_mode():
        for start in range(0, tokens, 64):  # chunked, like the engine's prefill
            model(input_ids=ids[:, start : start + 64], cache=cache, use_cache=True, logits_to_keep=1)
    return cache


def _relative_error(estimate: int, measured: int) -> float:
    return abs(estimate - measured) / measured


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("quant", QUANTS)
def test_planner_matches_measured_weights_and_kv_on_tiny_models(tiny_model_dir, arch: str, quant: str) -> None:
    folder = tiny_model_dir(arch)
    plan = plan_memory(folder, quantization=quant, context=KV_TOKENS, device="cpu", free_bytes=2**40)
    loaded = load_model(str(folder), quantization=quant, device="cpu", ignore_fit=True)
    cache = _fill_cache(loaded.model, KV_TOKENS)  # first: bnb settles its 4-bit layout at the first forward
    measured = measured_weights_by_device(loaded.model)
    assert set(measured) == {"cpu"}
    assert plan.weights_bytes == measured["cpu"]
    assert plan.parameters == sum(p.numel() for p in loaded.model.parameters()) or quant in ("nf4", "nf4-nodq")
    assert plan.kv_bytes == kv_bytes_by_device(cache)["cpu"]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # tied; untied with biases
@pytest.mark.parametrize("quant", ["nf4", "nf4-nodq"])
def test_4bit_weights_match_the_plan_before_and_after_first_use_on_each_kind_of_cpu(
    tiny_model_dir, arch: str, quant: str, bnb_cpu_kind: CpuKind
) -> None:
    folder = tiny_model_dir(arch)
    plan = plan_memory(folder, quantization=quant, context=16, device="cpu", free_bytes=2**40)
    assert any("AVX512-BF16" in note for note in plan.notes) == bnb_cpu_kind.repacks
    loaded = load_model(str(folder), quantization=quant, device="cpu", ignore_fit=True)
    layers = [m for m in loaded.model.modules() if getattr(getattr(m, "weight", None), "quant_state", None)]
    assert layers and not any(bnb_cpu.is_repacked(m.weight.quant_state) for m in layers)
    with pytest.MonkeyPatch.context() as before_first_use:  # until then every CPU holds the layout as quantized
        before_first_use.setattr(bnb_cpu, "cpu_repacks_4bit", lambda: False)
        as_quantized = plan_memory(folder, quantization=quant, context=16, device="cpu", free_bytes=2**40)
    assert measured_weights_by_device(loaded.model)["cpu"] == as_quantized.weights_bytes
    bnb_cpu_kind.first_use(loaded.model)
    assert [bnb_cpu.is_repacked(m.weight.quant_state) for m in layers] == [bnb_cpu_kind.repacks] * len(layers)
    assert measured_weights_by_device(loaded.model)["cpu"] == plan.weights_bytes
    # By hand, per layer of b blocks of 64: repacking turns the absmax into bf16 (2b bytes) from fp32 (4b), or with
    # double quant from 8 bits (b) + the nested fp32 absmax per 256 blocks + its 256-entry fp32 code book.
    blocks = [m.in_features * m.out_features // 64 for m in layers]
    dq = quant == "nf4"
    saved = sum((4 * math.ceil(b / 256) + 256 * 4 - b) if dq else 2 * b for b in blocks)
    assert as_quantized.weights_bytes - plan.weights_bytes == (saved if bnb_cpu_kind.repacks else 0)


def test_planner_counts_4bit_quant_state_that_get_memory_footprint_misses(tiny_model_dir) -> None:
    folder = tiny_model_dir("llama-untied")
    loaded = load_model(str(folder), quantization="nf4-nodq", device="cpu", ignore_fit=True)
    plan = plan_memory(folder, quantization="nf4-nodq", context=16, device="cpu", free_bytes=2**40)
    _fill_cache(loaded.model, 4)
    footprint = loaded.model.get_memory_footprint()
    measured = measured_weights_by_device(loaded.model)["cpu"]
    # The absmax (fp32, or bf16 once bnb repacked it on an AVX512-BF16 CPU) and code books are real memory: the
    # footprint undercounts them.
    absmax_bytes = 2 if bnb_cpu.cpu_repacks_4bit() else 4
    layers = sum(1 for m in loaded.model.modules() if getattr(getattr(m, "weight", None), "quant_state", None))
    assert layers == 2 * 7  # q, k, v, o, gate, up, down per decoder layer
    assert measured - footprint == plan.quantized_parameters // 64 * absmax_bytes + layers * 16 * 4  # + code books
    assert plan.weights_bytes == measured


def test_sliding_window_layers_are_capped(tiny_model_dir) -> None:
    folder = tiny_model_dir("gemma3")  # layer 0 slides over 32 tokens, layer 1 is full attention
    short = plan_memory(folder, quantization="bf16", context=16, device="cpu", free_bytes=2**40)
    long = plan_memory(folder, quantization="bf16", context=400, device="cpu", free_bytes=2**40)
    per_layer = 2 * 2 * 16 * 2  # k+v x 2 kv heads x head_dim 16 x bf16
    assert short.kv_bytes == 2 * per_layer * 16
    assert long.kv_bytes == per_layer * 31 + per_layer * 400  # the window keeps window - 1 tokens
    assert long.kv_bytes_per_token == 2 * per_layer and long.kv_bytes_per_token_long == per_layer
    assert long.kv_sliding_layers == 1


def test_gqa_uses_key_value_heads(tiny_model_dir) -> None:
    grouped = plan_memory(tiny_model_dir("llama"), quantization="bf16", context=10, device="cpu", free_bytes=2**40)
    full = plan_memory(
        tiny_model_dir("llama", num_key_value_heads=4), quantization="bf16", context=10, device="cpu", free_bytes=2**40
    )
    assert full.kv_bytes_per_token == 2 * grouped.kv_bytes_per_token == 2 * 2 * 2 * 4 * 16 * 2 // 2


def test_default_model_bf16_plan_matches_measured(default_loaded) -> None:
    plan = plan_memory(None, quantization="bf16", context=300, device="cpu", free_bytes=2**40)
    measured = measured_weights_by_device(default_loaded.model)["cpu"]
    assert _relative_error(plan.weights_bytes, measured) <= 0.03
    assert 130e6 < plan.parameters < 140e6  # SmolLM2-135M, tied embeddings counted once
    cache = _fill_cache(default_loaded.model, 300)
    assert _relative_error(plan.kv_bytes, kv_bytes_by_device(cache)["cpu"]) <= 0.01


def test_default_model_nf4_plan_matches_measured(default_model_folder: Path) -> None:
    plan = plan_memory(default_model_folder, quantization="nf4", context=64, device="cpu", free_bytes=2**40)
    loaded = load_model(str(default_model_folder), quantization="nf4", device="cpu", ignore_fit=True)
    _fill_cache(loaded.model, 4)  # bnb's layout after the first forward, whichever this CPU's is
    measured = measured_weights_by_device(loaded.model)["cpu"]
    assert plan.weights_bytes == measured
    assert plan.weights_bytes < 0.5 * plan.parameters * 2  # well under half of bf16


def test_gguf_header_config_gives_the_same_plan_as_the_converted_folder(default_model_folder: Path) -> None:
    from_header = config_from_gguf(default_model_gguf())
    plan_header = plan_memory(from_header, quantization="nf4", context=512, device="cpu", free_bytes=2**40)
    plan_folder = plan_memory(default_model_folder, quantization="nf4", context=512, device="cpu", free_bytes=2**40)
    assert plan_header.weights_bytes == plan_folder.weights_bytes
    assert plan_header.kv_bytes == plan_folder.kv_bytes
    assert plan_header.parameters == plan_folder.parameters


def test_folder_with_only_config_json_and_config_dict(tiny_model_dir, tmp_path: Path) -> None:
    folder = tiny_model_dir("qwen2")
    only_config = tmp_path / "config-only"
    only_config.mkdir()
    (only_config / "config.json").write_text((folder / "config.json").read_text())
    full = plan_memory(folder, quantization="nf4", context=64, device="cpu", free_bytes=2**40)
    bare = plan_memory(only_config, quantization="nf4", context=64, device="cpu", free_bytes=2**40)
    as_dict = plan_memory(
        json.loads((folder / "config.json").read_text()), quantization="nf4", context=64, device="cpu", free_bytes=2**40
    )
    assert full.weights_bytes == bare.weights_bytes == as_dict.weights_bytes
    assert full.kv_bytes == bare.kv_bytes == as_dict.kv_bytes


def test_verdict_and_max_context_are_consistent(tiny_model_dir) -> None:
    folder = tiny_model_dir("llama")
    roomy = plan_memory(folder, quantization="bf16", context=512, device="cpu", free_bytes=2**40)
    assert roomy.fits == "yes" and roomy.max_context == 512 == roomy.model_max_context
    assert roomy.total_bytes == roomy.weights_bytes + roomy.kv_bytes + roomy.overhead_bytes
    assert roomy.free_after_bytes == 2**40 - roomy.total_bytes
    at_300 = plan_memory(folder, quantization="bf16", context=300, device="cpu", free_bytes=2**40)
    tight = plan_memory(folder, quantization="bf16", context=512, device="cpu", free_bytes=at_300.total_bytes)
    assert tight.fits == "no"
    assert tight.max_context == 300
    assert (
        plan_memory(folder, quantization="bf16", context=300, device="cpu", free_bytes=tight.free_bytes).fits == "yes"
    )
    assert plan_memory(folder, quantization="bf16", context=301, device="cpu", free_bytes=tight.free_bytes).fits == "no"
    none = plan_memory(folder, quantization="bf16", context=512, device="cpu", free_bytes=1024)
    assert none.fits == "no" and none.max_context == 0


def test_cuda_plan_with_stated_free_memory_offloads_layers_to_the_cpu(tiny_model_dir) -> None:
    folder = tiny_model_dir("llama", num_hidden_layers=8, intermediate_size=1024)
    roomy = plan_memory(folder, quantization="nf4", context=64, device="cuda", free_bytes=2**40, cpu_free_bytes=2**40)
    assert roomy.fits == "yes" and roomy.device == "cuda:0" and "cuda_context" in roomy.overhead
    layer = (roomy.weights_bytes - 49152 * 64 * 2 - 64 * 2) // 8  # one decoder layer, roughly
    squeezed = plan_memory(
        folder,
        quantization="nf4",
        context=64,
        device="cuda",
        free_bytes=roomy.total_bytes - 3 * layer,
        cpu_free_bytes=2**40,
    )
    assert squeezed.fits == "offload"
    assert squeezed.weights_by_device["cpu"] > 0
    assert squeezed.weights_by_device["cuda:0"] < roomy.weights_bytes
    no_ram = plan_memory(
        folder,
        quantization="nf4",
        context=64,
        device="cuda",
        free_bytes=roomy.total_bytes - 3 * layer,
        cpu_free_bytes=1024,
    )
    assert no_ram.fits == "no"


def test_model_too_large_is_refused_on_load_with_both_numbers(tiny_model_dir) -> None:
    folder = tiny_model_dir("llama")
    plan = plan_memory(folder, quantization="bf16", context=None, device="cpu", free_bytes=10 * 2**20)
    with pytest.raises(ModelTooLargeError) as caught:
        load_model(str(folder), quantization="bf16", device="cpu", free_bytes=10 * 2**20)
    message = str(caught.value)
    assert format_bytes(plan.total_bytes) in message and format_bytes(10 * 2**20) in message
    assert "--ignore-fit" in message
    assert caught.value.needed_bytes == plan.total_bytes and caught.value.free_bytes == 10 * 2**20
    loaded = load_model(str(folder), quantization="bf16", device="cpu", free_bytes=10 * 2**20, ignore_fit=True)
    assert loaded.model is not None


def test_explicit_context_that_does_not_fit_is_refused_and_names_the_largest_that_does(tiny_model_dir) -> None:
    folder = tiny_model_dir("llama", max_position_embeddings=8192)
    at_3000 = plan_memory(folder, quantization="bf16", context=3000, device="cpu", free_bytes=2**40)
    with pytest.raises(ModelTooLargeError, match=r"--context 3000"):
        load_model(str(folder), quantization="bf16", device="cpu", context_length=8192, free_bytes=at_3000.total_bytes)


def test_without_context_a_shorter_window_that_fits_is_chosen(tiny_model_dir) -> None:
    folder = tiny_model_dir("llama", max_position_embeddings=8192)
    at_3000 = plan_memory(folder, quantization="bf16", context=3000, device="cpu", free_bytes=2**40)
    loaded = load_model(str(folder), quantization="bf16", device="cpu", free_bytes=at_3000.total_bytes)
    assert loaded.context_window == 3000
    assert any("limited to 3,000 tokens" in notice for notice in loaded.notices)


def test_check_fit_passes_a_plan_that_fits(tiny_model_dir) -> None:
    check_fit(plan_memory(tiny_model_dir("llama"), quantization="bf16", device="cpu", free_bytes=2**40))


def test_planner_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        plan_memory(str(tmp_path / "missing"), quantization="bf16", device="cpu")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match=r"no config\.json"):
        plan_memory(tmp_path / "empty", quantization="bf16", device="cpu")
    with pytest.raises(CorruptModelError, match="no model_type"):
        plan_memory({"hidden_size": 64}, quantization="bf16", device="cpu")
    with pytest.raises(UnsupportedModelError, match="not supported"):
        plan_memory({"model_type": "no-such-model"}, quantization="bf16", device="cpu")
    with pytest.raises(DeviceUnavailableError, match="Unknown device"):
        plan_memory({"model_type": "llama"}, quantization="bf16", device="tpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cuda_without_gpu_needs_stated_free_memory() -> None:
    with pytest.raises(DeviceUnavailableError, match="--free"):
        plan_memory({"model_type": "llama", "num_hidden_layers": 1}, quantization="nf4", device="cuda")


def test_kv_layout_of_a_config_without_sliding_window(tiny_model_dir) -> None:
    from transformers import AutoConfig

    layout = kv_layout(AutoConfig.from_pretrained(tiny_model_dir("qwen2")), 2)
    assert [layer.window for layer in layout.layers] == [None, None]
    assert layout.bytes_at(1000) == 1000 * layout.bytes_per_token


def test_planner_prefill_chunk_matches_the_engine() -> None:
    from app.core.engines.generation import PREFILL_CHUNK as ENGINE_CHUNK
    from app.core.memory.weights import PREFILL_CHUNK

    assert PREFILL_CHUNK == ENGINE_CHUNK


def test_cpu_quantization_counts_the_16bit_staging_copies_the_allocator_keeps(default_model_folder: Path) -> None:
    nf4 = plan_memory(default_model_folder, quantization="nf4", context=64, device="cpu", free_bytes=2**40)
    staging = nf4.quantized_parameters * 2  # bf16 copies of every quantized weight
    running = nf4.overhead_bytes - nf4.overhead["runtime"] - nf4.overhead["load_staging"] + nf4.kv_bytes
    assert nf4.overhead["load_staging"] == staging - running > 0
    # Past the point where the cache outgrows the staging memory, it costs nothing extra (it reuses it).
    long = plan_memory(default_model_folder, quantization="nf4", context=8192, device="cpu", free_bytes=2**40)
    assert long.overhead["load_staging"] == 0
    bf16 = plan_memory(default_model_folder, quantization="bf16", context=64, device="cpu", free_bytes=2**40)
    assert bf16.overhead["load_staging"] == 0
    gpu = plan_memory(default_model_folder, quantization="nf4", context=64, device="cuda", free_bytes=2**40)
    assert "load_staging" not in gpu.overhead
