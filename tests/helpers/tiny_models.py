"""Tiny random models built from a config, with the default model's tokenizer: no network needed.

Layer sizes are multiples of 32 because bitsandbytes' CPU 4-bit kernel requires it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")

BASE: dict[str, Any] = {
    "vocab_size": 49152,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 512,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
}

ARCHITECTURES: dict[str, dict[str, Any]] = {
    "llama": {"model_type": "llama", "tie_word_embeddings": True},
    "llama-untied": {"model_type": "llama", "tie_word_embeddings": False},
    "qwen2": {"model_type": "qwen2", "tie_word_embeddings": False, "use_sliding_window": False},
    "mistral": {"model_type": "mistral", "tie_word_embeddings": False, "sliding_window": 64},
    "gemma2": {
        "model_type": "gemma2",
        "tie_word_embeddings": True,
        "sliding_window": 32,
        "num_hidden_layers": 2,
        "query_pre_attn_scalar": 16,
    },
    "gemma3": {
        "model_type": "gemma3_text",
        "tie_word_embeddings": True,
        "sliding_window": 32,
        "num_hidden_layers": 2,
        "query_pre_attn_scalar": 16,
        "layer_types": ["sliding_attention", "full_attention"],
    },
    "phi3": {"model_type": "phi3", "tie_word_embeddings": False},
}


def build_tiny_model(arch: str, folder: Path, tokenizer_folder: Path, seed: int = 0, **overrides: Any) -> Path:
    """Write a random-weight model of `arch` (config.json + model.safetensors + tokenizer) into `folder`."""
    import torch
    from transformers import AutoConfig

    values = {**BASE, **ARCHITECTURES[arch], **overrides}
    model_type = values.pop("model_type")
    write_random_model(AutoConfig.for_model(model_type, **values), folder, tokenizer_folder, seed, torch.float32)
    return folder


def write_random_model(config: Any, folder: Path, tokenizer_folder: Path, seed: int, dtype: Any) -> int:
    """A seeded random-weight model of `config` in `dtype` (config.json + safetensors) with the tokenizer files of
    `tokenizer_folder`, into `folder` (also the benches' larger shapes); its number of parameters."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        if (tokenizer_folder / name).exists():
            shutil.copy(tokenizer_folder / name, folder / name)
    return sum(p.numel() for p in model.parameters())


def write_default_model_folder(folder: Path) -> Path:
    """The embedded default model as a Hugging Face folder (fp32 safetensors, config, tokenizer), read from its GGUF
    tensor by tensor, for what needs a folder: the folder planner, transformers serve, folder loads in tests and the
    benches' peers (Hearth itself runs the GGUF)."""
    import torch

    from app.core.engines.gguf_torch import gguf_config, load_gguf_model
    from app.core.models.gguf_tokenizer import build_with_transformers
    from app.core.models.model_source import default_model_gguf

    gguf = default_model_gguf()
    model = load_gguf_model(gguf, gguf_config(gguf), device_map={"": "cpu"}, dtype=torch.float32)
    model.save_pretrained(folder)
    build_with_transformers(gguf).save_pretrained(folder)
    return folder
