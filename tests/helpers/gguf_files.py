"""Real GGUF files written in the test run with the `gguf` package (llama.cpp's own writer): tiny tokenizers and
tiny random models, laid out as llama.cpp's convert_hf_to_gguf.py lays them out (Q/K rows permuted, tied embedding
written once), quantized with `gguf.quants`.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# Token types (gguf.constants.TokenType).
NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6  # USER_DEFINED (4) is not written here
SAMPLE_TEXT = (
    "The capital of France is Paris. The capital of Italy is Rome. What is the capital of Spain? "
    "Hello, world! Hello there, how are you today? I am fine, thank you. Numbers: 12345 and 3.14159. "
    "def add(a, b):\n    return a + b\n\nCafé, naïve, über — unicode text: 日本語, emoji 🤗.\n"
)


@dataclass
class TokenizerSpec:
    """What a GGUF header says about its tokenizer (the tokenizer.* keys)."""

    model: str  # tokenizer.ggml.model: "gpt2" (byte-level BPE) or "llama" (sentencepiece)
    tokens: list[str]
    token_types: list[int]
    pre: str | None = None
    merges: list[str] | None = None
    scores: list[float] | None = None
    bos: int | None = None
    eos: int | None = None
    unk: int | None = None
    pad: int | None = None
    eot: int | None = None
    add_bos: bool | None = None
    chat_template: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _byte_alphabet() -> list[str]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return list(bytes_to_unicode().values())


def byte_level_bpe(vocab_size: int = 600, *, pre: str = "llama-bpe") -> TokenizerSpec:
    """A gpt2-style byte-level BPE (the Llama 3 / Qwen / SmolLM kind) trained on a few sentences, with control tokens
    at its end as llama.cpp writes them, and a ChatML-like chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=_byte_alphabet(), show_progress=False)
    tokenizer.train_from_iterator([SAMPLE_TEXT] * 4, trainer)
    state = tokenizer.to_str()
    import json

    model = json.loads(state)["model"]
    vocab: dict[str, int] = model["vocab"]
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    merges = [" ".join(pair) if isinstance(pair, list) else pair for pair in model["merges"]]
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"]
    types = [NORMAL] * len(tokens) + [CONTROL] * len(specials)
    tokens += specials
    first = len(tokens) - len(specials)
    template = (
        "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
        "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    return TokenizerSpec(
        "gpt2",
        tokens,
        types,
        pre=pre,
        merges=merges,
        bos=first,
        eos=first + 3,
        eot=first + 1,
        pad=first + 1,
        add_bos=True,
        chat_template=template,
    )


def synthetic_bpe(vocab_size: int, seed: int = 0) -> TokenizerSpec:
    """A byte-level BPE of `vocab_size` tokens built by random merges (a Llama-3-sized vocabulary for timing the
    reader: 128k tokens and as many merges; real merges, each giving a token of the vocabulary)."""
    rng = random.Random(seed)
    alphabet = _byte_alphabet()
    tokens = list(alphabet)
    known = set(tokens)
    merges: list[str] = []
    while len(tokens) < vocab_size - 2:
        left, right = rng.choice(tokens), rng.choice(alphabet)
        if len(left) > 12 or left + right in known:
            continue
        tokens.append(left + right)
        known.add(left + right)
        merges.append(f"{left} {right}")
    tokens += ["<|begin_of_text|>", "<|eot_id|>"]
    types = [NORMAL] * (len(tokens) - 2) + [CONTROL] * 2
    return TokenizerSpec(
        "gpt2", tokens, types, pre="llama-bpe", merges=merges, bos=len(tokens) - 2, eos=len(tokens) - 1
    )


def sentencepiece_llama() -> TokenizerSpec:
    """A sentencepiece vocabulary as llama.cpp writes Llama 2 / Mistral ones: <unk> <s> </s>, 256 byte tokens, then
    pieces with scores (no merges: transformers derives them from the scores)."""
    words = sorted({word.strip(".,!?:;()\n") for word in SAMPLE_TEXT.split()} - {""})
    pieces: list[str] = ["▁"]
    for word in words:
        for end in range(1, len(word) + 1):
            piece = word[:end]
            for candidate in ("▁" + piece, piece):
                if candidate not in pieces:
                    pieces.append(candidate)
    letters = sorted(set(SAMPLE_TEXT) - {" ", "\n"})
    pieces += [letter for letter in letters if letter not in pieces]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{byte:02X}>" for byte in range(256)] + pieces
    types = [UNKNOWN, CONTROL, CONTROL] + [BYTE] * 256 + [NORMAL] * len(pieces)
    scores = [0.0] * 259 + [-float(index) for index in range(len(pieces))]
    template = "{% for message in messages %}[{{ message['role'] }}] {{ message['content'] }}</s>{% endfor %}"
    return TokenizerSpec("llama", tokens, types, scores=scores, bos=1, eos=2, unk=0, chat_template=template)


def _add_tokenizer(writer: Any, spec: TokenizerSpec) -> None:
    writer.add_tokenizer_model(spec.model)
    if spec.pre is not None:
        writer.add_tokenizer_pre(spec.pre)
    writer.add_token_list(spec.tokens)
    writer.add_token_types(spec.token_types)
    if spec.merges is not None:
        writer.add_token_merges(spec.merges)
    if spec.scores is not None:
        writer.add_token_scores(spec.scores)
    for value, add in (
        (spec.bos, writer.add_bos_token_id),
        (spec.eos, writer.add_eos_token_id),
        (spec.unk, writer.add_unk_token_id),
        (spec.pad, writer.add_pad_token_id),
        (spec.eot, writer.add_eot_token_id),
    ):
        if value is not None:
            add(value)
    if spec.add_bos is not None:
        writer.add_add_bos_token(spec.add_bos)
    if spec.chat_template is not None:
        writer.add_chat_template(spec.chat_template)


LLAMA_SHAPE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
}


def write_gguf(
    path: Path,
    tokenizer: TokenizerSpec,
    tensors: Mapping[str, tuple[np.ndarray, int]] = {},
    *,
    arch: str = "llama",
    shape: Mapping[str, Any] | None = None,
    name: str = "tiny",
) -> Path:
    """A GGUF file: the llama-style header keys for `shape`, the tokenizer, and `tensors` (name -> (fp32 values in
    torch order, ggml type to store them as), or (uint8 blocks as stored, their ggml type))."""
    import gguf

    values = {**LLAMA_SHAPE, **(shape or {})}
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name(name)
    writer.add_block_count(values["num_hidden_layers"])
    writer.add_context_length(values["max_position_embeddings"])
    writer.add_embedding_length(values["hidden_size"])
    writer.add_feed_forward_length(values["intermediate_size"])
    writer.add_head_count(values["num_attention_heads"])
    writer.add_head_count_kv(values["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(values["rms_norm_eps"])
    writer.add_rope_freq_base(values["rope_theta"])
    writer.add_rope_dimension_count(values["hidden_size"] // values["num_attention_heads"])
    writer.add_vocab_size(len(tokenizer.tokens))
    _add_tokenizer(writer, tokenizer)
    for tensor_name, (array, kind) in tensors.items():
        qtype = gguf.GGMLQuantizationType(kind)
        if array.dtype == np.uint8:  # blocks as stored (random_blocks): types gguf-py can't quantize to
            data = np.ascontiguousarray(array)
        else:
            data = gguf.quants.quantize(np.ascontiguousarray(array, dtype=np.float32), qtype)
        writer.add_tensor(tensor_name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# transformers' llama names -> llama.cpp's (convert_hf_to_gguf.py)
_LAYER_NAMES = {
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
}


def llama_permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's Q/K row order (convert_hf_to_gguf.py LlamaModel.permute): the two rotary halves interleaved."""
    return (
        weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def llama_gguf_tensors(
    state_dict: Mapping[str, Any], config: Mapping[str, Any], matrix_type: int, embedding_type: int | None = None
) -> dict[str, tuple[np.ndarray, int]]:
    """A transformers llama state dict as llama.cpp's converter writes it: GGUF names, Q/K rows permuted, norms F32,
    the matrices as `matrix_type`, the embedding as `embedding_type` (the matrices' type by default), and the output
    head only when it is not tied."""
    tensors: dict[str, tuple[np.ndarray, int]] = {}
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    f32 = 0
    for name, value in state_dict.items():
        array = value.float().numpy() if hasattr(value, "numpy") else np.asarray(value, dtype=np.float32)
        if name == "model.embed_tokens.weight":
            tensors["token_embd.weight"] = (array, matrix_type if embedding_type is None else embedding_type)
        elif name == "model.norm.weight":
            tensors["output_norm.weight"] = (array, f32)
        elif name == "lm_head.weight":
            if not config.get("tie_word_embeddings", True):
                tensors["output.weight"] = (array, matrix_type)
        elif name.startswith("model.layers."):
            layer, rest = name[len("model.layers.") :].split(".", 1)
            if rest == "self_attn.q_proj.weight":
                array = llama_permute(array, heads)
            elif rest == "self_attn.k_proj.weight":
                array = llama_permute(array, kv_heads)
            kind = f32 if rest.endswith("layernorm.weight") else matrix_type
            tensors[f"blk.{layer}.{_LAYER_NAMES[rest]}"] = (array, kind)
    return tensors


# Where the K-quants gguf-py cannot write keep their fp16 scales (byte offsets in the block), for random_blocks.
_SCALE_OFFSETS = {"Q2_K": (80, 82), "Q3_K": (108,)}


def random_blocks(kind: int, rows: int, cols: int, seed: int = 0, scale: float = 0.02) -> np.ndarray:
    """`rows` rows of `cols` values of ggml type `kind` as block bytes [rows, row bytes]: Q4_0/Q4_1/Q5_x/Q8_0
    quantized from normal values, Q2_K/Q3_K random bits with small finite scales, Q4_K/Q5_K/Q6_K random bits with
    their fp16 scales set to sizes a trained model has (random bits would make some of them infinite)."""
    import gguf

    rng = np.random.default_rng(seed)
    qtype = gguf.GGMLQuantizationType(kind)
    values, size = gguf.GGML_QUANT_SIZES[qtype]
    if qtype.name in _SCALE_OFFSETS:  # Q2_K, Q3_K: random bits, finite scales
        blocks = rng.integers(0, 256, size=(rows, cols // values, size), dtype=np.uint8)
        for offset in _SCALE_OFFSETS[qtype.name]:
            scales = (rng.random((rows, cols // values)) * scale + scale / 20).astype(np.float16)
            blocks[:, :, offset : offset + 2] = scales.view(np.uint8).reshape(rows, cols // values, 2)
        return blocks.reshape(rows, -1)
    if qtype.name not in ("Q4_K", "Q5_K", "Q6_K"):
        weights = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        return np.ascontiguousarray(gguf.quants.quantize(weights, qtype)).reshape(rows, -1)
    raw = rng.integers(0, 256, size=(rows * cols // values, size), dtype=np.uint8)

    def halves(magnitude: np.ndarray) -> np.ndarray:
        return magnitude.astype(np.float16).view(np.uint8).reshape(-1, 2)

    # d (and dmin) sized so that the largest weight is a few times `scale` and a sub-block's mean offset (d sc q
    # against dmin m, both random) is near zero, as in a trained model's file.
    spread = 0.5 + np.abs(rng.standard_normal(raw.shape[0]))
    if qtype.name == "Q6_K":
        raw[:, 208:210] = halves(spread * scale / 1300)
    else:
        d = spread * scale / (300 if qtype.name == "Q4_K" else 600)
        raw[:, 0:2] = halves(d)
        raw[:, 2:4] = halves(d * (7.5 if qtype.name == "Q4_K" else 15.5))
    return raw.reshape(rows, -1)


def tiny_llama(seed: int = 0, **overrides: Any) -> tuple[Any, dict[str, Any]]:
    """A random transformers llama with LLAMA_SHAPE (fp32), and its config values."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    values = {**LLAMA_SHAPE, "vocab_size": len(byte_level_bpe().tokens), "tie_word_embeddings": True, **overrides}
    config = AutoConfig.for_model("llama", head_dim=values["hidden_size"] // values["num_attention_heads"], **values)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    return model, values


def tiny_llama_gguf(
    path: Path,
    matrix_type: int = 0,
    embedding_type: int | None = None,
    *,
    seed: int = 0,
    name: str = "tiny",
    **overrides: Any,
) -> tuple[Path, Any]:
    """A tiny random llama written as llama.cpp writes one (with byte_level_bpe's vocabulary), and the transformers
    model it was written from."""
    model, values = tiny_llama(seed, **overrides)
    tensors = llama_gguf_tensors(model.state_dict(), values, matrix_type, embedding_type)
    write_gguf(path, byte_level_bpe(), tensors, shape=values, name=name)
    return path, model
