"""Decode paths side by side in one process: plain (eager) vs each fast path, interleaved, paired per trial.

    python bench/engine_speed.py [--quant bf16] [--trials 5] [--tokens 64] [--threads N]
                                  [--paths eager,fused-q4,fused-int8]

Prints per path: median decode tok/s, median prefill tok/s, the paired ratio to eager per trial, and greedy-token
agreement with eager (the same prompt, teacher-forced on eager's tokens, so one early divergence doesn't hide the
rest). The machine is noisy and shared: only the ratios measured in the same run mean anything.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PROMPT = "Write a long story about a dragon who learns to bake bread. Give every character a name."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model spec (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--quant", default="bf16")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--paths", default="eager,fused-q4,fused-int8")
    args = parser.parse_args(argv)

    import torch

    from app.core.chat.events import StatsEvent, TokenEvent
    from app.core.chat.sampling import SamplingParams
    from app.core.engines.engine import Engine, KVState
    from app.core.engines.loader import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    loaded = load_model(args.model, quantization=args.quant, device="cpu")
    engines = {name: Engine(loaded, decode_path=name) for name in args.paths.split(",")}
    for name, engine in engines.items():
        print(f"{name:>12}: runs as {engine.decode_path} — {engine.decode_path_note}")
    ids = engines["eager"].prepare_prompt([_user(PROMPT)]).ids
    params = SamplingParams(temperature=0.0, max_new_tokens=args.tokens)
    decode: dict[str, list[float]] = {name: [] for name in engines}
    cpu_rate: dict[str, list[float]] = {name: [] for name in engines}
    prefill: dict[str, list[float]] = {name: [] for name in engines}
    for trial in range(args.trials):
        order = list(engines) if trial % 2 == 0 else list(reversed(engines))
        for name in order:
            cpu_started = time.process_time()
            for event in engines[name].generate_from_ids(ids, params, kv=KVState(), use_response_cache=False):
                if isinstance(event, StatsEvent):
                    decode[name].append(event.stats.decode_tokens_per_s)
                    prefill[name].append(event.stats.prefill_tokens_per_s)
                    generated = event.stats.generated_tokens
            # CPU seconds of the whole process (prefill included): steadier than wall-clock on a shared machine.
            cpu_rate[name].append(generated / (time.process_time() - cpu_started))
    print(f"\n{loaded.quantization}, {torch.get_num_threads()} threads, {len(ids)}-token prompt, {args.tokens} tokens")
    print(f"{'path':>12} {'decode tok/s':>13} {'prefill tok/s':>14} {'tok per cpu-s':>14}  paired ratios to eager")
    for name in engines:
        ratios = [a / b for a, b in zip(decode[name], decode["eager"], strict=True) if b > 0]
        cpu_ratios = [a / b for a, b in zip(cpu_rate[name], cpu_rate["eager"], strict=True) if b > 0]
        print(
            f"{name:>12} {statistics.median(decode[name]):>13.1f} {statistics.median(prefill[name]):>14.0f}"
            f" {statistics.median(cpu_rate[name]):>14.1f}"
            f"  decode median {statistics.median(ratios):.2f}x [{' '.join(f'{r:.2f}' for r in ratios)}]"
            f"; per cpu-s median {statistics.median(cpu_ratios):.2f}x [{' '.join(f'{r:.2f}' for r in cpu_ratios)}]"
        )
    reference = _greedy_tokens(engines["eager"], ids, params, TokenEvent)
    for name, engine in engines.items():
        if name != "eager":
            same, total, first = _agreement(engine, ids, reference)
            print(f"{name:>12}: teacher-forced greedy agreement {same}/{total}; first divergence at token {first}")
    return 0


def _user(text: str) -> object:
    from app.core.chat.events import ChatMessage

    return ChatMessage("user", text)


def _greedy_tokens(engine: object, ids: list[int], params: object, token_type: type) -> list[int]:
    """Eager's greedy token ids, decoded step by step through the engine's own forward."""
    import torch

    from app.core.engines.engine import KVState

    kv = KVState()
    out: list[int] = []
    with torch.inference_mode():
        logits = engine._forward(ids, kv)  # type: ignore[attr-defined]
        for _ in range(params.max_new_tokens):  # type: ignore[attr-defined]
            token = int(torch.argmax(logits, dim=-1).item())
            out.append(token)
            logits = engine._forward([token], kv, decode_step=True)  # type: ignore[attr-defined]
    return out


def _agreement(engine: object, ids: list[int], reference: list[int]) -> tuple[int, int, int]:
    """Feed eager's tokens through `engine`'s decode path; count steps whose argmax equals eager's next token."""
    import torch

    from app.core.engines.engine import KVState

    kv = KVState()
    same = 0
    first = -1
    with torch.inference_mode():
        logits = engine._forward(ids, kv)  # type: ignore[attr-defined]
        for step, token in enumerate(reference):
            if int(torch.argmax(logits, dim=-1).item()) == token:
                same += 1
            elif first < 0:
                first = step
            with engine.path.step():  # type: ignore[attr-defined]
                logits = engine._forward([token], kv, decode_step=True)  # type: ignore[attr-defined]
    return same, len(reference), first


if __name__ == "__main__":
    raise SystemExit(main())
