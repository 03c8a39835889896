"""Loading real (tiny, random) models through transformers + bitsandbytes, and refusing bad ones clearly."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from app.core.chat.events import ChatMessage, DoneEvent, TokenEvent
from app.core.chat.sampling import SamplingParams
from app.core.engines.backend import ReplyRequest
from app.core.engines.engine import Engine
from app.core.engines.loader import load_model, resolve_device
from app.core.errors import (
    CorruptModelError,
    DeviceUnavailableError,
    ModelNotFoundError,
    QuantizationError,
    UnsafeModelError,
    UnsupportedModelError,
)
from app.core.models.model_source import default_model_gguf, resolve_model
from app.core.models.quant import resolve_quantization


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma2"])
def test_tiny_models_load_in_nf4_on_the_cpu_with_a_16_bit_head_and_generate(arch: str, tiny_model_dir: Any) -> None:
    import bitsandbytes as bnb

    loaded = load_model(str(tiny_model_dir(arch)), quantization="nf4", device="cpu")
    model = loaded.model
    linears = [
        m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and not name.endswith("lm_head")
    ]
    assert linears and all(isinstance(m, bnb.nn.Linear4bit) for m in linears)
    assert linears[0].weight.quant_state.quant_type == "nf4"
    assert linears[0].weight.quant_state.nested  # double quant
    assert not isinstance(model.lm_head, bnb.nn.Linear4bit)
    assert model.lm_head.weight.dtype == torch.bfloat16
    assert loaded.quantization == "nf4" and loaded.device == "cpu"
    assert [p.device for p in loaded.placements] == ["cpu"] and loaded.placements[0].parameter_bytes > 0
    events = list(
        Engine(loaded).generate(
            ReplyRequest([ChatMessage("user", "hi")], SamplingParams(temperature=0, max_new_tokens=6))
        )
    )
    done = events[-1]
    assert isinstance(done, DoneEvent) and done.finish_reason in ("stop", "length")


def test_int8_and_16_bit_loads(tiny_model_dir: Any) -> None:
    import bitsandbytes as bnb

    folder = str(tiny_model_dir("llama-untied"))
    int8 = load_model(folder, quantization="int8", device="cpu")
    assert any(isinstance(m, bnb.nn.Linear8bitLt) for m in int8.model.modules())
    assert not isinstance(int8.model.lm_head, bnb.nn.Linear8bitLt)
    fp16 = load_model(folder, quantization="fp16", device="cpu")
    assert fp16.model.model.layers[0].self_attn.q_proj.weight.dtype == torch.float16


def test_auto_on_a_cpu_only_machine_says_so() -> None:
    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    device, notices = resolve_device("auto")
    assert device == "cpu" and notices and "CPU" in notices[0]
    assert resolve_quantization("auto", "cpu") == "q4"
    assert resolve_quantization("auto", "cuda:0") == "nf4"


def test_asking_for_a_missing_gpu_is_an_error_not_a_silent_fallback() -> None:
    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    with pytest.raises(DeviceUnavailableError, match="--device cpu"):
        resolve_device("cuda")
    with pytest.raises(DeviceUnavailableError, match="MPS"):
        resolve_device("mps")


def test_pickle_only_folder_is_refused_with_the_file_and_the_opt_in(tmp_path: Path) -> None:
    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "pytorch_model.bin").write_bytes(b"not really a pickle")
    with pytest.raises(UnsafeModelError) as info:
        load_model(str(folder), device="cpu")
    assert "pytorch_model.bin" in str(info.value) and "--allow-pickle" in str(info.value)


def test_remote_code_models_are_refused_by_default(tmp_path: Path) -> None:
    folder = tmp_path / "custom"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({"model_type": "my_custom_arch", "auto_map": {"AutoModelForCausalLM": "x.Y"}})
    )
    (folder / "model.safetensors").write_bytes(b"")
    with pytest.raises(UnsafeModelError, match="--trust-remote-code"):
        load_model(str(folder), device="cpu")


def test_unknown_architecture_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "unknown"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "definitely_not_a_model"}))
    (folder / "model.safetensors").write_bytes(b"")
    with pytest.raises(UnsupportedModelError, match="definitely_not_a_model"):
        load_model(str(folder), device="cpu")


def test_corrupt_safetensors_gives_a_clear_error(tiny_model_dir: Any, tmp_path: Path) -> None:
    folder = tmp_path / "corrupt"
    shutil.copytree(tiny_model_dir("llama"), folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 3])
    with pytest.raises(CorruptModelError) as info:
        load_model(str(folder), quantization="bf16", device="cpu")
    assert str(folder) in str(info.value)


def test_an_unknown_device_is_named() -> None:
    with pytest.raises(DeviceUnavailableError, match=r"Unknown device 'tpu': use auto, cuda, cpu or mps\."):
        load_model(None, device="tpu")


def test_truncated_and_fake_gguf_files_give_clear_errors(tmp_path: Path) -> None:
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(default_model_gguf().read_bytes()[:4096])
    with pytest.raises(CorruptModelError) as info:
        load_model(str(truncated), device="cpu")
    assert "truncated.gguf" in str(info.value)
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"hello, not a gguf file at all" * 4)
    with pytest.raises(CorruptModelError, match="not a GGUF file"):
        resolve_model(str(fake))


def test_missing_paths_and_uncached_repos_are_explained(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve_model(str(tmp_path / "nope"))
    notes = tmp_path / "notes.txt"
    notes.write_text("not a model", encoding="utf-8")
    with pytest.raises(ModelNotFoundError, match=r"notes\.txt is a file but not a GGUF model; give a \.gguf file"):
        resolve_model(str(notes))
    with pytest.raises(ModelNotFoundError, match="hearth pull"):
        resolve_model("someone/not-downloaded-model")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match=r"config\.json"):
        load_model(str(tmp_path / "empty"), device="cpu")


def test_cpu_4bit_rejects_layer_sizes_the_kernel_cannot_run(tiny_model_dir: Any) -> None:
    folder = tiny_model_dir("llama", hidden_size=48, num_attention_heads=3, num_key_value_heads=1)
    with pytest.raises(QuantizationError, match="divisible by 32"):
        load_model(str(folder), quantization="nf4", device="cpu")


def test_a_folder_whose_only_weights_are_a_gguf_loads_that_file(tmp_path: Path) -> None:
    from tests.helpers.gguf_files import tiny_llama_gguf

    folder = tmp_path / "downloaded"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))  # the header's config is the one read
    path, written = tiny_llama_gguf(folder / "model.Q8_0.gguf", 8)
    loaded = load_model(str(folder), quantization="fp32", device="cpu")
    assert loaded.folder == path and loaded.model.config.num_hidden_layers == written.config.num_hidden_layers
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.Q8_0.gguf"]  # nothing written


@pytest.mark.parametrize("through", ["standalone", "transformers", "wrapper"])
def test_streamed_text_never_splits_a_multibyte_character(default_loaded: Any, through: str) -> None:
    """Hearth's own tokenizer and transformers' are decoded through their backend; a transformers tokenizer class with
    its own _decode is asked through it."""
    from app.core.chat.detok import IncrementalDetokenizer
    from app.core.models.gguf_tokenizer import build_with_transformers

    tokenizer = default_loaded.tokenizer if through == "standalone" else build_with_transformers(default_model_gguf())
    if through == "wrapper":

        class OwnDecode(type(tokenizer)):  # type: ignore[misc]
            def _decode(self, *args: Any, **kwargs: Any) -> str:
                return str(super()._decode(*args, **kwargs))

        tokenizer.__class__ = OwnDecode
    text = "Café 🐉 dragons — naïve 日本語 ok"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    detok = IncrementalDetokenizer(tokenizer)
    assert (detok._backend is not None) == (through != "wrapper")
    pieces = [detok.add(i) for i in ids]
    pieces.append(detok.flush())
    assert "".join(pieces) == tokenizer.decode(ids)
    assert all("\ufffd" not in piece for piece in pieces)
    assert any(piece == "" for piece in pieces)  # some multi-token characters were held back, not split


def test_tokens_events_are_text(default_loaded: Any) -> None:
    events = list(
        Engine(default_loaded).generate(
            ReplyRequest([ChatMessage("user", "Hi")], SamplingParams(temperature=0, max_new_tokens=4))
        )
    )
    pieces = [e.text for e in events if isinstance(e, TokenEvent)]
    done = events[-1]
    assert isinstance(done, DoneEvent) and done.text.strip()  # four greedy tokens of an answer
    assert pieces and all(isinstance(piece, str) and piece for piece in pieces)
    assert "".join(pieces) == done.text  # every token reached the stream, none dropped or repeated
