"""The torch-free runtime (app/core/engines/lite/runtime.py) against the torch path it replaces on the CPU: the same
packed weights, prefill and decode logits that agree, prefix reuse and chunking that change nothing, and every reason
it declines a model."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from app.core.engines.lite import runtime
from app.core.engines.lite.packed_model import open_model
from app.core.engines.lite.runtime import LiteUnavailable, from_bf16, rope_inv_freq, to_bf16
from app.core.engines.loader import load_model
from app.core.fastpath import kernel
from app.core.fastpath.native import new_slab_cache
from app.core.fastpath.packed_cache import packed_cache_file

KERNEL = kernel.load_library()
pytestmark = pytest.mark.skipif(isinstance(KERNEL, str), reason=f"no kernel library here: {KERNEL}")
# A prefix computed in another call rounds its keys to bf16 from sums taken in another order (numpy's products pick
# their kernel by shape): a last-bit difference that crosses a rounding boundary moves a key by 2^-8, so a chunked or
# reused prefill is close to a whole one, not equal (measured: 0.4 % of the largest logit on nonsense ids).
CHUNKING_BOUND = 0.02
PROMPT = "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is"


@pytest.fixture(scope="module")
def q4_default(default_model_folder: Path) -> Any:
    """The default model (as a folder, until the runtime reads the GGUF itself) loaded as q4 through torch: it writes
    the packed copy the runtime maps."""
    from app.core.engines.engine import Engine

    loaded = load_model(str(default_model_folder), quantization="q4", device="cpu")
    return Engine(loaded)


@pytest.fixture(scope="module")
def lite_default(q4_default: Any) -> Any:
    model = open_model(q4_default.loaded.folder)
    yield model
    model.close()


def torch_logits(engine: Any, ids: list[int]) -> np.ndarray:
    cache = new_slab_cache(engine.model, engine.context_window)
    with torch.inference_mode():
        out = engine.model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True)
    return np.asarray(out.logits[0, -1].float().numpy())


def relative_error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def test_prefill_agrees_with_the_torch_path_on_the_same_packed_weights(q4_default: Any, lite_default: Any) -> None:
    ids = q4_default.tokenizer(PROMPT)["input_ids"]
    expected = torch_logits(q4_default, ids)
    got = lite_default.prefill(ids, lite_default.new_cache())
    # torch runs bf16 activations where the CPU has them, the runtime fp32: measured 0.02 of the largest logit
    assert relative_error(got, expected) < 0.06
    assert int(got.argmax()) == int(expected.argmax())
    assert q4_default.tokenizer.decode([int(got.argmax())]).strip() == "Rome"


def test_a_decode_step_continues_a_prefill_as_a_longer_prefill_would(lite_default: Any) -> None:
    ids = list(range(100, 140))
    whole = lite_default.prefill(ids, lite_default.new_cache())
    cache = lite_default.new_cache()
    lite_default.prefill(ids[:-1], cache)
    stepped = lite_default.step(ids[-1], cache)  # int8 activations in the step, 15-bit in prefill
    assert relative_error(stepped, whole) < 0.06
    assert cache.length == len(ids) and cache.ids == ids


def test_reusing_a_prefix_gives_the_logits_of_a_fresh_prefill(lite_default: Any) -> None:
    first, second = list(range(200, 260)), list(range(200, 240)) + list(range(300, 330))
    fresh = lite_default.prefill(second, lite_default.new_cache())
    cache = lite_default.new_cache()
    lite_default.prefill(first, cache)
    assert cache.reuse_for(second) == 40  # the shared prefix
    reused = lite_default.prefill(second[40:], cache)
    assert relative_error(reused, fresh) < CHUNKING_BOUND
    assert int(reused.argmax()) == int(fresh.argmax())
    assert cache.ids == second


def test_chunks_and_a_growing_cache_change_nothing(lite_default: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = list(range(400, 470))
    whole = lite_default.prefill(ids, lite_default.new_cache())
    monkeypatch.setattr(runtime, "PREFILL_CHUNK", 16)
    monkeypatch.setattr(kernel, "SLAB_STEP", 16)  # the slabs are reallocated (and copied) several times
    cache = lite_default.new_cache()
    chunked = lite_default.prefill(ids, cache)
    assert relative_error(chunked, whole) < CHUNKING_BOUND
    assert cache.capacity < 2 * len(ids)
    roomy = lite_default.new_cache()
    roomy.reserve(200)
    lite_default.prefill(ids, roomy)
    for token in (5, 6, 7, 8):  # steps across reallocations read the copied positions
        assert np.array_equal(lite_default.step(token, cache), lite_default.step(token, roomy))


def test_a_token_outside_the_vocabulary_is_refused_with_its_id(lite_default: Any) -> None:
    with pytest.raises(ValueError, match="token id 999999 is outside the model's 49152-token vocabulary"):
        lite_default.prefill([1, 999999], lite_default.new_cache())
    with pytest.raises(ValueError, match="exceed the model's context window"):
        lite_default.new_cache().reserve(lite_default.config.context_window + 1)


@pytest.mark.parametrize("arch", ["qwen2", "llama-untied"])
def test_tiny_models_with_biases_and_untied_heads_agree_with_torch(arch: str, tiny_model_dir: Any) -> None:
    from app.core.engines.engine import Engine

    folder = tiny_model_dir(arch)
    engine = Engine(load_model(str(folder), quantization="q4", device="cpu"))
    assert engine.decode_path == "fused-q4"
    model = open_model(folder)
    ids = list(range(10, 60))
    expected, got = torch_logits(engine, ids), model.prefill(ids, model.new_cache())
    assert np.corrcoef(got, expected)[0, 1] > 0.99
    assert relative_error(got, expected) < 0.1  # random weights: near-uniform logits, bf16 activations in torch
    model.close()


def test_rope_frequencies_match_transformers() -> None:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    llama3 = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    for parameters in ({"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}, llama3):
        config = LlamaConfig(hidden_size=512, num_attention_heads=8, rope_parameters=parameters)
        expected, _ = ROPE_INIT_FUNCTIONS[parameters["rope_type"]](config, "cpu")
        got = rope_inv_freq({"rope_parameters": parameters}, 64)
        np.testing.assert_allclose(got, expected.numpy(), rtol=1e-6)
    # older configs: rope_theta at the top level, no rope_parameters
    np.testing.assert_allclose(
        rope_inv_freq({"rope_theta": 10000.0}, 64), 1.0 / 10000.0 ** (np.arange(0, 64, 2) / 64), rtol=1e-6
    )
    with pytest.raises(LiteUnavailable, match="RoPE type yarn is not in the kernel"):
        rope_inv_freq({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}}, 64)


def test_the_bf16_cache_rounds_as_torch_does() -> None:
    values = np.random.default_rng(0).standard_normal(10_000).astype(np.float32) * 50
    expected = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(to_bf16(values), expected)
    assert np.array_equal(from_bf16(expected), torch.from_numpy(expected.view(np.int16)).view(torch.bfloat16).float())


def test_without_a_packed_copy_the_runtime_says_so(isolated_cache: Path, default_model_folder: Path) -> None:
    with pytest.raises(LiteUnavailable, match="no packed Q4_1 copy yet"):
        open_model(default_model_folder)


def test_a_damaged_packed_copy_is_moved_aside_and_explained(isolated_cache: Path, tiny_model_dir: Any) -> None:
    folder = tiny_model_dir("llama")
    load_model(str(folder), quantization="q4", device="cpu")  # packs, and caches the copy in the isolated cache
    packed = packed_cache_file(folder, "bf16", kind="decode-fused-q4")
    assert packed is not None and packed.exists() and isolated_cache in packed.parents
    open_model(folder).close()  # intact: opens
    with packed.open("r+b") as handle:  # one byte changed after its hash was written
        handle.seek(-1, 2)
        last = handle.read(1)
        handle.seek(-1, 2)
        handle.write(bytes([last[0] ^ 0xFF]))
    notices: list[str] = []
    with pytest.raises(LiteUnavailable, match="failed its check"):
        open_model(folder, notices)
    assert len(notices) == 1 and "packed decode copy" in notices[0] and "packed again" in notices[0]
    assert not packed.exists()  # moved aside: the next load through torch packs it again


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"model_type": "gpt2"}, "the runtime implements llama, mistral, qwen2, not 'gpt2'"),
        ({"sliding_window": 64, "use_sliding_window": True}, "sliding-window attention is not in the kernel"),
        ({"hidden_act": "gelu"}, "activation gelu is not in the kernel"),
        ({"head_dim": 24}, "multiples of 32"),
    ],
)
def test_models_the_kernel_lacks_are_declined_with_the_reason(
    change: dict[str, Any], reason: str, tmp_path: Path, default_model_folder: Path
) -> None:
    config = json.loads((default_model_folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(LiteUnavailable, match=reason):
        runtime.LiteConfig.read(tmp_path)


def test_a_reply_through_the_app_never_imports_torch(q4_default: Any, tmp_path: Path) -> None:
    """The whole load path of the window and the command line, in a fresh process: the reply is right and torch
    was never imported."""
    script = textwrap.dedent(
        """
        import json, sys, threading
        from app.core.engines.opening import open_backend
        from app.core.engines.backend import LoadRequest, ReplyRequest
        from app.core.chat.events import ChatMessage, DoneEvent, StatsEvent
        from app.core.chat.sampling import SamplingParams
        backend = open_backend(LoadRequest(sys.argv[1], device="cpu", response_cache=False))
        request = ReplyRequest([ChatMessage("user", "What is the capital of France?")],
                               SamplingParams(temperature=0, max_new_tokens=12))
        events = list(backend.generate(request, threading.Event()))
        stats = next(e for e in events if isinstance(e, StatsEvent)).stats
        print(json.dumps([type(backend).__name__, stats.decode_path, events[-1].text, "torch" in sys.modules]))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(q4_default.loaded.folder)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).parents[4],
    )
    assert result.returncode == 0, result.stderr[-2000:]
    name, path, text, imported = json.loads(result.stdout.strip().splitlines()[-1])
    assert (name, path) == ("LiteBackend", "lite-q4")
    assert "Paris" in text
    assert imported is False


def test_threads_follow_the_physical_cores_the_process_may_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime.psutil, "cpu_count", lambda logical=True: 1 if not logical else 2)
    assert runtime.default_threads() == 1  # a second hardware thread on the same core is not another thread
    monkeypatch.setattr(runtime.psutil, "cpu_count", lambda logical=True: None)
    assert runtime.default_threads() >= 1  # unknown: every CPU the process may run on
