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
    from transformers import AutoConfig, AutoModelForCausalLM

    values = {**BASE, **ARCHITECTURES[arch], **overrides}
    model_type = values.pop("model_type")
    config = AutoConfig.for_model(model_type, **values)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        if (tokenizer_folder / name).exists():
            shutil.copy(tokenizer_folder / name, folder / name)
    return folder
