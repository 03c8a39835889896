"""GGUF files loaded straight into torch, tensor by tensor: the same model as the one written and as transformers'
own GGUF loader reads, nothing written to disk, one tensor staged at a time, and every refusal named."""

from __future__ import annotations

import os
import struct
import threading
import weakref
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch

from app.core.engines import gguf_torch
from app.core.engines.gguf_torch import dequantize_tensor, gguf_config, gguf_state_dict
from app.core.engines.loader import load_model
from app.core.errors import CorruptModelError, LoadCancelled, UnsupportedModelError
from app.core.models.model_source import default_model_gguf
from tests.helpers.gguf_files import (
    byte_level_bpe,
    llama_gguf_tensors,
    random_blocks,
    tiny_llama,
    tiny_llama_gguf,
    write_gguf,
)

Q = gguf.GGMLQuantizationType
IDS = torch.tensor([[1, 5, 9, 20, 33, 7]])
# A K-quant mix as llama.cpp's Q4_K_M writes it (Q4_K, Q6_K for some matrices and the tied embedding), plus Q5_K.
K_QUANT_MIX = {
    "attn_q": Q.Q4_K,
    "attn_k": Q.Q4_K,
    "attn_v": Q.Q6_K,
    "attn_output": Q.Q4_K,
    "ffn_gate": Q.Q5_K,
    "ffn_up": Q.Q4_K,
    "ffn_down": Q.Q6_K,
    "token_embd": Q.Q6_K,
}


def k_quant_gguf(path: Path) -> Path:
    """A tiny llama (rows of 256 and 512: K-quant blocks are 256 wide) stored in the K_QUANT_MIX."""
    model, values = tiny_llama(hidden_size=256, intermediate_size=512)
    tensors = llama_gguf_tensors(model.state_dict(), values, Q.F32)
    for index, (name, (array, _kind)) in enumerate(list(tensors.items())):
        short = name.split(".")[-2] if name.startswith("blk.") else name.split(".")[0]
        if short in K_QUANT_MIX:
            kind = K_QUANT_MIX[short]
            tensors[name] = (random_blocks(kind, array.shape[0], array.shape[1], seed=index), kind)
    return write_gguf(path, byte_level_bpe(), tensors, shape=values)


@pytest.mark.parametrize(
    ("label", "overrides"),
    [("tied", {}), ("untied", {"tie_word_embeddings": False}), ("mistral-named", {"name": "tiny-mistral-7b"})],
)
def test_an_f32_gguf_gives_back_the_model_it_was_written_from(
    label: str, overrides: dict[str, Any], tmp_path: Path
) -> None:
    """llama.cpp's Q/K row order is undone, names mapped, the head tied or not: the exact weights and logits."""
    path, written = tiny_llama_gguf(tmp_path / f"{label}.gguf", seed=3, **overrides)
    loaded = load_model(str(path), quantization="fp32", device="cpu")
    model = loaded.model
    expected = written.state_dict()
    assert set(model.state_dict()) == set(expected)
    assert all(torch.equal(model.state_dict()[name], value) for name, value in expected.items())
    with torch.inference_mode():
        assert torch.equal(model(IDS).logits, written(IDS).logits)
    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert tied == (label != "untied")
    assert type(model).__name__ == ("MistralForCausalLM" if label == "mistral-named" else "LlamaForCausalLM")
    assert loaded.folder == path and loaded.weights_fingerprint


@pytest.mark.parametrize("label", ["Q8_0 + F16 embedding", "Q4_0 + Q4_1 embedding", "K-quant mix"])
def test_quantized_ggufs_load_as_transformers_own_gguf_loader_reads_them(label: str, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    if label == "K-quant mix":
        path = k_quant_gguf(tmp_path / "k.gguf")
    elif label.startswith("Q8_0"):
        path = tiny_llama_gguf(tmp_path / "q8.gguf", Q.Q8_0, Q.F16)[0]
    else:
        path = tiny_llama_gguf(tmp_path / "q4.gguf", Q.Q4_0, Q.Q4_1)[0]
    ours = load_model(str(path), quantization="fp32", device="cpu").model.state_dict()
    theirs = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).state_dict()
    assert set(ours) == set(theirs)
    assert [name for name in theirs if not torch.equal(ours[name], theirs[name])] == []


@pytest.mark.parametrize(
    "kind", [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q2_K, Q.Q3_K]
)
def test_dequantize_tensor_is_bit_for_bit_gguf_quants(kind: Q) -> None:
    """The contract of the one dequantizer (a faster one for the common types goes behind it)."""
    rows, row = 6, 512
    if kind in (Q.F32, Q.F16, Q.BF16):
        values = np.random.default_rng(1).standard_normal((rows, row)).astype(np.float32)
        raw = gguf.quants.quantize(values, kind).view(np.uint8).reshape(rows, -1)
    else:
        raw = random_blocks(kind, rows, row, seed=int(kind))
    stored = np.ascontiguousarray(raw).reshape(-1)
    got = dequantize_tensor(stored, int(kind), (rows, row))
    want = gguf.quants.dequantize(raw, kind)
    assert got.dtype == np.float32 and got.shape == (rows, row)
    assert np.array_equal(got.view(np.uint32), np.asarray(want, dtype=np.float32).view(np.uint32))
    assert not np.shares_memory(got, stored)  # never a view of the file's bytes


def test_a_gguf_load_writes_no_converted_copy_and_names_the_file(isolated_cache: Path, tmp_path: Path) -> None:
    path = tiny_llama_gguf(tmp_path / "model.gguf", Q.Q8_0)[0]
    before = sorted(p.name for p in tmp_path.iterdir())
    loaded = load_model(str(path), quantization="bf16", device="cpu")
    assert loaded.folder == path and loaded.model.dtype == torch.bfloat16
    written = [p for p in isolated_cache.rglob("*") if p.is_file()] if isolated_cache.exists() else []
    # no converted folder, no copy of the weights: only the tokenizer's two copies for the next load (a few MB)
    assert sorted((p.parent.name, p.suffix) for p in written) == [
        ("gguf-tokenizers", ".json"),
        ("gguf-tokenizers", ".settings"),
    ], written
    assert sorted(p.name for p in tmp_path.iterdir() if p != isolated_cache) == before  # nothing beside the file
    assert type(loaded.tokenizer).__name__ == "StandaloneTokenizer"


@pytest.mark.parametrize("quantization", ["bf16", "nf4"])
def test_one_tensor_is_staged_at_a_time(quantization: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers is handed each tensor when it places it, and lets go of it before the next: the load never holds
    more than one tensor's dequantized values beside the model."""
    path = tiny_llama_gguf(tmp_path / "model.gguf", Q.Q8_0)[0]
    live: weakref.WeakSet[torch.Tensor] = weakref.WeakSet()
    most = [0]
    threads: set[str] = set()
    materialize = gguf_torch.GGUFTensorReader.materialize

    def watched(self: Any, tensor: Any) -> torch.Tensor:
        most[0] = max(most[0], len(live))
        threads.add(threading.current_thread().name)
        out = materialize(self, tensor)
        live.add(out)
        return out

    monkeypatch.setattr(gguf_torch.GGUFTensorReader, "materialize", watched)
    before = os.environ.get("HF_DEACTIVATE_ASYNC_LOAD")
    loaded = load_model(str(path), quantization=quantization, device="cpu")
    assert most[0] <= 1
    # Read where it is placed: on worker threads transformers would read every tensor ahead of placing them.
    assert threads == {threading.current_thread().name}
    assert os.environ.get("HF_DEACTIVATE_ASYNC_LOAD") == before  # transformers' own loads are left as they were
    if quantization == "nf4":
        import bitsandbytes as bnb

        layers = [m for n, m in loaded.model.named_modules() if isinstance(m, torch.nn.Linear) and "lm_head" not in n]
        assert layers and all(isinstance(m, bnb.nn.Linear4bit) for m in layers)
        assert loaded.model.lm_head.weight.dtype == torch.bfloat16
        with torch.inference_mode():
            assert torch.isfinite(loaded.model(IDS).logits).all()


def test_progress_is_reported_per_tensor_and_cancel_stops_the_load(tmp_path: Path) -> None:
    path = tiny_llama_gguf(tmp_path / "model.gguf", Q.Q8_0)[0]
    seen: list[tuple[str, float | None]] = []
    load_model(str(path), quantization="bf16", device="cpu", progress=lambda m, f: seen.append((m, f)))
    tensors = [(m, f) for m, f in seen if m.startswith("Loading ") and m.endswith(".weight…")]
    assert len(tensors) == len(gguf_state_dict(path, gguf_config(path), None, (0, 1))[0])
    fractions = [f for _m, f in tensors]
    assert fractions == sorted(fractions) and fractions[0] >= 0.3 and fractions[-1] < 0.95
    assert seen[-1] == ("Ready", 1.0)

    cancel = threading.Event()

    def progress(message: str, _fraction: float | None) -> None:
        if message.startswith("Loading blk.0.ffn"):
            cancel.set()

    with pytest.raises(LoadCancelled):
        load_model(str(path), quantization="bf16", device="cpu", progress=progress, cancel=cancel)


def test_the_default_model_loads_from_its_gguf(default_loaded: Any) -> None:
    assert default_loaded.folder == default_model_gguf()
    assert type(default_loaded.tokenizer).__name__ == "StandaloneTokenizer"
    assert default_loaded.model.generation_config.eos_token_id == 2


# -- refusals --------------------------------------------------------------------------------------------------
def _tensors() -> dict[str, tuple[np.ndarray, int]]:
    model, values = tiny_llama()
    return llama_gguf_tensors(model.state_dict(), values, Q.F32)


def test_an_architecture_transformers_lacks_is_named(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "odd.gguf", byte_level_bpe(), arch="notanarch")
    with pytest.raises(UnsupportedModelError, match="GGUF architecture 'notanarch' is not supported by transformers"):
        load_model(str(path), quantization="bf16", device="cpu")


def test_stacked_expert_files_are_refused_by_name(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "moe.gguf", byte_level_bpe(), arch="qwen3moe")
    with pytest.raises(UnsupportedModelError, match=r"moe\.gguf: qwen3moe GGUF files \(mixture of experts"):
        gguf_state_dict(path, gguf_config(path), None, (0, 1))


def test_a_file_missing_a_weight_is_refused_before_loading(tmp_path: Path) -> None:
    tensors = _tensors()
    del tensors["blk.1.ffn_down.weight"]
    path = write_gguf(tmp_path / "holey.gguf", byte_level_bpe(), tensors)
    with pytest.raises(CorruptModelError, match=r"holey\.gguf lacks weights its llama header needs \(model\.layers\.1"):
        load_model(str(path), quantization="bf16", device="cpu")


def test_a_tensor_of_the_wrong_size_is_refused(tmp_path: Path) -> None:
    tensors = _tensors()
    array, kind = tensors["blk.0.ffn_up.weight"]
    tensors["blk.0.ffn_up.weight"] = (array[:96], kind)
    path = write_gguf(tmp_path / "odd-size.gguf", byte_level_bpe(), tensors)
    with pytest.raises(CorruptModelError, match=r"tensor blk\.0\.ffn_up\.weight holds 6,144 values but the model"):
        load_model(str(path), quantization="bf16", device="cpu")


def _set_tensor_type(path: Path, name: str, kind: int) -> None:
    """Rewrite one tensor's ggml type in the header's tensor table."""
    data = bytearray(path.read_bytes())
    entry = struct.pack("<Q", len(name)) + name.encode()
    at = data.index(entry) + len(entry)
    dims = struct.unpack_from("<I", data, at)[0]
    struct.pack_into("<I", data, at + 4 + 8 * dims, kind)
    path.write_bytes(bytes(data))


def test_a_tensor_type_the_loader_cannot_read_is_named(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "new-type.gguf", byte_level_bpe(), _tensors())
    _set_tensor_type(path, "blk.0.attn_v.weight", 99)
    with pytest.raises(UnsupportedModelError, match=r"tensor blk\.0\.attn_v\.weight \(type 99\): ggml type 99 is not"):
        load_model(str(path), quantization="bf16", device="cpu")


def test_a_file_cut_inside_its_tensors_is_named_as_incomplete(tmp_path: Path) -> None:
    whole = tiny_llama_gguf(tmp_path / "whole.gguf", Q.Q8_0)[0].read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[: len(whole) - 1000])
    with pytest.raises(CorruptModelError, match=r"cut\.gguf is an incomplete GGUF file: it has [\d,]+ bytes"):
        load_model(str(cut), quantization="bf16", device="cpu")
    # Cut after that check (a file shrinking while it loads): the read itself says so.
    path = tiny_llama_gguf(tmp_path / "shrinks.gguf", Q.Q8_0)[0]
    state, reader, _model_class = gguf_state_dict(path, gguf_config(path), None, (0, 1))
    with path.open("r+b") as handle:
        handle.truncate(path.stat().st_size - 1000)
    reader.open()
    try:
        with pytest.raises(CorruptModelError, match=r"shrinks\.gguf ends inside tensor .* the file may be truncated"):
            for tensor in state.values():
                tensor[...]
    finally:
        reader.close()
