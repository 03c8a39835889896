"""bench/quality.py's fp32 reference forward from a GGUF's own blocks against transformers' fp32 logits, and its
comparison figures. The GGUF is written here with the `gguf` package as llama.cpp's converter lays a llama model out
(Q and K rows permuted for ggml's rope, tensor names, rope_freqs for llama3 scaling), quantized to Q8_0."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.quality import GGUFLlama, compare

TINY: dict[str, Any] = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
}
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def _permute(rows: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: each head's two rotary halves interleaved, row by row."""
    return rows.reshape(heads, 2, rows.shape[0] // heads // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def _gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    _, _, index, rest = hf.split(".", 3)
    module = rest.removesuffix(".weight")
    return f"blk.{index}.{NAMES[module]}.weight"


def write_model(folder: Path, tied: bool, rope: dict[str, Any] | None) -> tuple[Any, Path]:
    """A random tiny Llama (transformers, fp32) whose matrices hold exactly the Q8_0 values written to its GGUF."""
    import gguf
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**TINY, tie_word_embeddings=tied, rope_scaling=rope)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_rope_freq_base(TINY["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    q8 = gguf.GGMLQuantizationType.Q8_0
    with torch.no_grad():
        for name, param in model.state_dict().items():
            if tied and name == "lm_head.weight":
                continue
            values = param.numpy()
            if values.ndim == 1:
                writer.add_tensor(_gguf_name(name), values.astype(np.float32))
                continue
            blocks = gguf.quants.quantize(values, q8)
            param.copy_(torch.from_numpy(gguf.quants.dequantize(blocks, q8)))  # transformers runs the same values
            if name.endswith("q_proj.weight"):
                blocks = _permute(blocks, config.num_attention_heads)
            elif name.endswith("k_proj.weight"):
                blocks = _permute(blocks, config.num_key_value_heads)
            writer.add_tensor(_gguf_name(name), blocks, raw_dtype=q8)
        if rope is not None:  # what the converter writes for llama3 scaling: each frequency's divisor
            plain = 1.0 / (TINY["rope_theta"] ** (torch.arange(0, config.head_dim, 2, dtype=torch.float32) / 16))
            factors = (plain / model.model.rotary_emb.inv_freq).numpy().astype(np.float32)
            writer.add_tensor("rope_freqs.weight", factors)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model, path


@pytest.mark.parametrize(
    ("tied", "rope"), [(True, None), (False, None), (True, LLAMA3_ROPE)], ids=["tied", "untied", "llama3-rope"]
)
def test_reference_forward_matches_transformers_fp32(tmp_path: Path, tied: bool, rope: dict[str, Any] | None) -> None:
    import torch

    model, path = write_model(tmp_path, tied, rope)
    ids = [int(i) for i in torch.randint(0, TINY["vocab_size"], (80,), generator=torch.Generator().manual_seed(1))]
    ours = GGUFLlama(path).logits(ids)
    with torch.no_grad():
        theirs = model(torch.tensor([ids])).logits[0].numpy()
    assert ours.shape == theirs.shape == (80, TINY["vocab_size"])
    np.testing.assert_allclose(ours, theirs, atol=2e-5, rtol=1e-4)


def test_reference_forward_notices_a_wrong_rope(tmp_path: Path) -> None:
    """The check above can fail: a GGUF without its rope_freqs tensor (plain rope) no longer matches llama3 scaling."""
    import torch

    model, path = write_model(tmp_path, True, LLAMA3_ROPE)
    reference = GGUFLlama(path)
    del reference.weights["rope_freqs.weight"]
    ids = list(range(100, 180))
    with torch.no_grad():
        theirs = model(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(reference.logits(ids) - theirs).max() > 1e-3


def test_compare_figures() -> None:
    """Identical logits: KL 0, full agreement, perplexity exp(mean NLL); a flat engine: KL = log(vocab) - H(ref)."""
    rng = np.random.default_rng(0)
    reference = rng.normal(size=(6, 8)).astype(np.float32)
    ids = [0, 1, 2, 3, 4, 5]
    same = compare(reference, reference, ids)
    assert same["kl_mean"] == pytest.approx(0.0, abs=1e-12)
    assert same["top1"] == 1.0
    log_p = reference[:-1] - np.log(np.exp(reference[:-1].astype(np.float64)).sum(axis=1, keepdims=True))
    expected = np.exp(-log_p[np.arange(5), ids[1:]].mean())
    assert same["perplexity"] == pytest.approx(expected, rel=1e-9)
    flat = compare(reference, np.zeros_like(reference), ids)
    entropy = -(np.exp(log_p) * log_p).sum(axis=1)
    assert flat["kl_mean"] == pytest.approx(float((np.log(8) - entropy).mean()), rel=1e-9)
    assert flat["perplexity"] == pytest.approx(8.0, rel=1e-9)
