"""Engine benchmark on the default model: ratios measured side by side in one run (the machine is noisy).

1. Our streaming decode tok/s ÷ raw `model.generate` tok/s on the same prompt and weights (target ≥ 0.97).
2. TTFT at turn 8 of a scripted chat with KV reuse ÷ without (target ≤ 0.15).
3. Decode tok/s for fp32, bf16 and nf4 side by side.

Run: .venv/bin/python bench/engine.py [--trials 5] [--tokens 64]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TQDM_DISABLE", "1")

import torch
from transformers.generation.streamers import BaseStreamer

from app.core.chat.events import ChatMessage, DoneEvent, StatsEvent
from app.core.chat.sampling import SamplingParams
from app.core.engines.backend import ReplyRequest
from app.core.engines.engine import Engine, KVState
from app.core.engines.loader import LoadedModel, load_model

STORY = [ChatMessage("user", "Write a long, detailed story about a dragon who learns to bake bread.")]
CHAT_SCRIPT = [
    "Hi! I'm planning a trip to Italy.",
    "Which cities should I visit first?",
    "What food should I try in Rome?",
    "And in Florence?",
    "How do I get from Rome to Florence?",
    "Is it better to rent a car?",
    "What should I pack for October?",
    "Summarise my plan in three bullet points.",
]


class TimestampStreamer(BaseStreamer):
    """Records when generate() hands over each token (the first put() is the prompt)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value: Any) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def ours_decode(engine: Engine, tokens: int) -> tuple[float, int]:
    stats = None
    for event in engine.generate(ReplyRequest(STORY, SamplingParams(temperature=0, max_new_tokens=tokens))):
        if isinstance(event, StatsEvent):
            stats = event.stats
    assert stats is not None
    return stats.decode_tokens_per_s, stats.generated_tokens


def raw_generate_decode(loaded: LoadedModel, engine: Engine, tokens: int) -> tuple[float, int]:
    ids = torch.tensor([engine.prepare_prompt(STORY).ids])
    streamer = TimestampStreamer()
    with torch.inference_mode():
        out = loaded.model.generate(ids, max_new_tokens=tokens, do_sample=False, streamer=streamer)
    generated = out.shape[1] - ids.shape[1]
    first, last = streamer.times[1], streamer.times[-1]
    return (generated - 1) / (last - first), generated


def ttft_turn8(engine: Engine) -> tuple[float, float, int, int]:
    params = SamplingParams(temperature=0, max_new_tokens=32)
    history: list[ChatMessage] = [ChatMessage("system", "You are a helpful travel assistant.")]
    kv = KVState()
    reused_stats = None
    for turn, question in enumerate(CHAT_SCRIPT, start=1):
        history.append(ChatMessage("user", question))
        if turn == len(CHAT_SCRIPT):
            break
        for event in engine.generate(ReplyRequest(history, params, use_response_cache=False), kv=kv):
            if isinstance(event, DoneEvent):
                history.append(ChatMessage("assistant", event.text))
    for event in engine.generate(ReplyRequest(history, params, use_response_cache=False), kv=kv):
        if isinstance(event, StatsEvent):
            reused_stats = event.stats
    fresh_stats = None
    for event in engine.generate(ReplyRequest(history, params, use_response_cache=False), kv=KVState()):
        if isinstance(event, StatsEvent):
            fresh_stats = event.stats
    assert reused_stats and fresh_stats
    return reused_stats.ttft_s, fresh_stats.ttft_s, reused_stats.cached_tokens, reused_stats.prompt_tokens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    print(f"# bench/engine.py · {date.today()} · {platform.processor() or platform.machine()} · {os.cpu_count()} cores")
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads, default model SmolLM2-135M-Instruct\n")

    loaded = load_model(None, quantization="auto", device="auto")
    engine = Engine(loaded)
    # The streaming overhead is measured on the same computation as generate(): the plain (eager) decode path.
    plain = Engine(loaded, decode_path="eager")
    print(f"## 1. Streaming overhead ({loaded.quantization} on {loaded.device}, {args.tokens} new tokens, greedy)")
    ours_decode(plain, 8)  # warm-up
    ours_decode(engine, 8)
    raw_generate_decode(loaded, plain, 8)
    ratios, ours_rates, raw_rates, default_rates = [], [], [], []
    for _ in range(args.trials):  # interleaved, paired per trial
        ours, _ = ours_decode(plain, args.tokens)
        raw, _ = raw_generate_decode(loaded, plain, args.tokens)
        default_rates.append(ours_decode(engine, args.tokens)[0])
        ours_rates.append(ours)
        raw_rates.append(raw)
        ratios.append(ours / raw)
    print("| engine | decode tok/s (median) |\n|---|---|")
    print(f"| Hearth streaming generator, eager path | {statistics.median(ours_rates):.1f} |")
    print(f"| transformers `generate()` | {statistics.median(raw_rates):.1f} |")
    default_rate = statistics.median(default_rates)
    print(f"| Hearth streaming generator, default path ({engine.decode_path}) | {default_rate:.1f} |")
    per_trial = ", ".join(f"{r:.2f}" for r in ratios)
    print(f"ratio eager ours/raw per trial: {per_trial} → median **{statistics.median(ratios):.2f}** (target ≥ 0.97)")
    default_ratios = ", ".join(f"{d / r:.2f}" for d, r in zip(default_rates, raw_rates, strict=True))
    print(f"ratio default path/raw per trial: {default_ratios}\n")

    print("## 2. TTFT at turn 8 of a scripted chat, KV reuse vs none")
    reuse_list, fresh_list, ttft_ratios = [], [], []
    cached = prompt = 0
    for _ in range(max(1, args.trials // 2)):
        reused, fresh, cached, prompt = ttft_turn8(engine)
        reuse_list.append(reused)
        fresh_list.append(fresh)
        ttft_ratios.append(reused / fresh)
    print(f"prompt {prompt} tokens, {cached} reused from the cache")
    with_ms, without_ms = statistics.median(reuse_list) * 1000, statistics.median(fresh_list) * 1000
    print(f"TTFT with reuse {with_ms:.0f} ms, without {without_ms:.0f} ms")
    per_trial = ", ".join(f"{r:.3f}" for r in ttft_ratios)
    print(f"ratio per trial: {per_trial} → median **{statistics.median(ttft_ratios):.3f}** (target ≤ 0.15)\n")
    del engine, loaded

    print("## 3. Decode tok/s by precision (same prompt, interleaved)")
    engines = {q: Engine(load_model(None, quantization=q, device="cpu")) for q in ("fp32", "bf16", "nf4")}
    for e in engines.values():
        ours_decode(e, 4)
    rates: dict[str, list[float]] = {q: [] for q in engines}
    for _ in range(max(1, args.trials // 2)):
        for q, e in engines.items():
            rates[q].append(ours_decode(e, args.tokens // 2)[0])
    base = statistics.median(rates["fp32"])
    print("| precision (decode path) | decode tok/s (median) | vs fp32 |\n|---|---|---|")
    for q, values in rates.items():
        label = f"{q} ({engines[q].decode_path})"
        print(f"| {label} | {statistics.median(values):.1f} | {statistics.median(values) / base:.2f}× |")


if __name__ == "__main__":
    main()
