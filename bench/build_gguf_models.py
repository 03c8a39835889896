"""GGUF files in the formats users download, at the shapes they run, made by llama.cpp's own converter and quantizer.

    python bench/build_gguf_models.py                        # every shape, every type (~25 min on 2 cores, ~9 GB)
    python bench/build_gguf_models.py --shapes smollm2-135m --types Q4_K_M Q8_0
    python bench/build_gguf_models.py --shapes llama-3.1-8b --types Q4_K_M   # ~40 GB of disk while it runs

Shapes (random weights, seeded: speed does not depend on the values, only on shapes and block types):
- smollm2-135m: the embedded default model's shape, read from its GGUF header (30 layers, hidden 576, FFN 1536,
  9 heads, 3 KV heads, vocab 49,152, tied embedding).
- llama-3.2-1b: Llama-3.2-1B's published config (16 layers, hidden 2048, FFN 8192, 32 heads, 8 KV heads, head dim 64,
  tied embedding, RoPE theta 500000 with llama3 scaling: factor 32, low 1, high 4, original context 8192). Its
  128,256-token tokenizer is not available offline, so the file carries the default model's tokenizer (49,152
  tokens) with the vocabulary padded to 128,256 ([PAD] tokens, as convert_hf_to_gguf.py pads): the embedding and the
  head have Llama-3.2's size, and both engines tokenize alike.
- llama-3.1-8b: Llama-3.1-8B's published config (32 layers, hidden 4096, FFN 14336, 32 heads, 8 KV heads, head dim
  128, untied head, RoPE llama3 scaling factor 8), the same padded tokenizer. Not built by default: its BF16 file is
  16 GB and its Q4_K_M 4.9 GB (past 4 GiB, where 32-bit offsets would break).
And one real model: smollm2-135m-instruct, the default model's own weights (its shipped Q4_1 file, dequantized by
Hearth's converter to fp32) requantized: the quality bench's K-quant files with weights that mean something. The
shipped Q4_1 file itself is listed as is.

Each model: a Hugging Face folder (bf16; fp32 for the real one) -> llama.cpp's convert_hf_to_gguf.py -> a BF16 (F32)
GGUF -> llama-quantize (bench/llama_build.py builds it) to each type. Written under .cache/gguf-models/ with
manifest.json (per file: shape, format, tensor count and bytes per block type, types per tensor role, bytes a decode
step reads); the histograms are printed. Files already there are kept.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from bench import gguf_files, gpu_check, llama_build  # noqa: E402

OUT = ROOT / ".cache" / "gguf-models"
MANIFEST = OUT / "manifest.json"
TYPES = ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "Q4_0")
LLAMA_32_1B: dict[str, Any] = {
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "vocab_size": 128256,
    "tie_word_embeddings": True,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "hidden_act": "silu",
    "initializer_range": 0.02,
}
# Llama-3.1-8B's published config (gpu_check.py's, with Llama-3's rope scaling): the size most people run on a laptop
# (its Q4_K_M file crosses 4 GiB)
LLAMA_31_8B: dict[str, Any] = {
    **LLAMA_32_1B,
    **{
        key: value
        for key, value in gpu_check.LLAMA_8B.items()
        if key not in ("model_type", "bos_token_id", "eos_token_id")
    },
    "rope_scaling": {**LLAMA_32_1B["rope_scaling"], "factor": 8.0},
}
SHAPES = ("smollm2-135m", "llama-3.2-1b", "smollm2-135m-instruct", "llama-3.1-8b")
PADDED = ("llama-3.2-1b", "llama-3.1-8b")  # Llama-3's vocabulary size over the default model's tokenizer


def default_folder() -> Path:
    """The default model as a folder (fp32 safetensors + tokenizer): tokenizer and real weights."""
    return gguf_files.default_model_folder()


def shape_config(shape: str) -> dict[str, Any]:
    """The config.json values of a random-weight shape."""
    from app.core.models.gguf_meta import config_dict_from_gguf
    from app.core.models.model_source import default_model_gguf

    smol = config_dict_from_gguf(default_model_gguf())
    if shape == "smollm2-135m":
        keep = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
        keep += ("head_dim", "vocab_size", "tie_word_embeddings", "max_position_embeddings", "rms_norm_eps")
        return {**{k: smol[k] for k in keep}, "rope_theta": smol["rope_theta"], "hidden_act": "silu"}
    if shape == "llama-3.2-1b":
        return dict(LLAMA_32_1B)
    if shape == "llama-3.1-8b":
        return dict(LLAMA_31_8B)
    raise ValueError(f"no random-weight shape {shape!r}")


def random_folder(shape: str, out: Path, seed: int) -> Path:
    """A random-weight Hugging Face folder of `shape` (bf16) with the default model's tokenizer."""
    import torch
    from transformers import AutoConfig

    from tests.helpers.tiny_models import write_random_model

    tokenizer_folder = default_folder()
    tokenizer_config = json.loads((tokenizer_folder / "config.json").read_text())
    ids = {k: tokenizer_config.get(k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    config = AutoConfig.for_model("llama", **shape_config(shape), **ids)
    parameters = write_random_model(config, out, tokenizer_folder, seed, torch.bfloat16)
    print(f"{shape}: {parameters / 1e9:.3f} B parameters (random, seed {seed}), bf16", flush=True)
    return out


def full_precision(shape: str, seed: int) -> Path:
    """The shape's unquantized GGUF (BF16 for random weights, F32 for the requantized default), made once."""
    real = shape == "smollm2-135m-instruct"
    outtype = "f32" if real else "bf16"
    target = OUT / f"{shape}.{outtype.upper()}.gguf"
    if target.exists():
        return target
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=OUT) as scratch:
        folder = default_folder() if real else random_folder(shape, Path(scratch) / "hf", seed)
        print(f"{shape}: convert_hf_to_gguf.py --outtype {outtype}", flush=True)
        llama_build.convert_to_gguf(folder, target, outtype)
    return target


def build(shapes: list[str], types: list[str], seed: int, threads: int | None) -> dict[str, Any]:
    info = llama_build.build_tools()
    manifest: dict[str, Any] = json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {}
    files: dict[str, Any] = manifest.setdefault("files", {})
    for shape in shapes:
        source = full_precision(shape, seed)
        made = [source]
        for kind in types:
            target = OUT / f"{shape}.{kind}.gguf"
            if not target.exists():
                print(f"{shape}: llama-quantize {kind}", flush=True)
                llama_build.quantize(source, target, kind, threads)
            made.append(target)
        for path in made:
            entry = gguf_files.describe(path)
            entry["shape"] = shape
            real = shape.endswith("instruct")
            entry["weights"] = "the default model's, requantized" if real else f"random, seed {seed}"
            if shape in PADDED:
                entry["tokenizer"] = "the default model's (49,152 tokens), vocabulary padded to 128,256"
            files[path.name] = entry
    from app.core.models.model_source import default_model_gguf

    shipped = default_model_gguf()
    files[shipped.name] = {**gguf_files.describe(shipped), "shape": "smollm2-135m-instruct", "weights": "shipped"}
    manifest["llama_build"] = llama_build.describe(info)
    MANIFEST.write_text(json.dumps(manifest, indent=1))
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", choices=SHAPES, default=[s for s in SHAPES if s != "llama-3.1-8b"])
    parser.add_argument("--types", nargs="+", default=list(TYPES), help=f"llama-quantize types (default {TYPES})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    manifest = build(args.shapes, args.types, args.seed, args.threads)
    print(f"\nllama.cpp build: {manifest['llama_build']}")
    for entry in manifest["files"].values():
        if entry["shape"] in args.shapes or entry["weights"] == "shipped":
            print("\n".join(gguf_files.histogram_lines(entry)))
    print(f"\nmanifest: {MANIFEST}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
