"""Build a random-weight model of TinyLlama-1.1B's shape with SmolLM2's tokenizer, for speed and memory benchmarks.

    python bench/build_1b_model.py [--out .cache/models/random-tinyllama-1b] [--seed 0]

TinyLlama-1.1B's published config: 22 layers, hidden 2048, intermediate 5632, 32 heads, 4 KV heads (head dim 64),
RMSNorm eps 1e-5, RoPE theta 10000, untied lm_head. The vocabulary is SmolLM2's (49,152 tokens, the tokenizer of the
embedded default model), so both engines tokenize alike and no download is needed. Decode and prefill speed do not
depend on the weights' values, only their shapes; the weights are seeded, so the file is the same on every run.
Written as bf16 safetensors (2.2 GB); `bench/peer.py --model FOLDER` converts it for llama.cpp.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

DEFAULT_OUT = ROOT / ".cache" / "models" / "random-tinyllama-1b"
TINYLLAMA_SHAPE = {
    "model_type": "llama",
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "initializer_range": 0.02,
}


def build(out: Path, seed: int) -> Path:
    import torch
    from transformers import AutoConfig

    from app.core.models.model_source import read_config
    from bench.gguf_files import default_model_folder
    from tests.helpers.tiny_models import write_random_model

    tokenizer_folder = default_model_folder()
    smol = read_config(tokenizer_folder)
    values = dict(TINYLLAMA_SHAPE)
    model_type = str(values.pop("model_type"))
    config = AutoConfig.for_model(
        model_type,
        **values,
        vocab_size=int(smol["vocab_size"]),
        bos_token_id=smol.get("bos_token_id"),
        eos_token_id=smol.get("eos_token_id"),
        pad_token_id=smol.get("pad_token_id"),
    )
    parameters = write_random_model(config, out, tokenizer_folder, seed, torch.bfloat16)
    print(f"wrote {out}: {parameters / 1e9:.2f} B parameters, bf16")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    build(args.out, args.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
