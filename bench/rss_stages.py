"""Resident memory of one q4 (or other) CPU load, stage by stage, read from /proc/self/status (Linux).

    python bench/rss_stages.py [--model .cache/models/random-tinyllama-1b] [--quant q4] [--prompt-tokens 500]

Prints VmRSS, VmHWM (peak), RssAnon and RssFile after: importing torch, importing the app, load_model, Engine, a
short reply, a long prompt (distinct token ids) with 16 new tokens, and malloc_trim; then the largest mappings of
/proc/self/smaps (which file or heap holds what). One fresh process per run: the peak is this process's own.
"""

from __future__ import annotations

import argparse
import collections
import time
from pathlib import Path


def status() -> dict[str, float]:
    found: dict[str, float] = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            found[key] = int(value.split()[0]) / 1024
    return found


def mark(name: str) -> None:
    s = status()
    print(
        f"{name:30s} RSS {s['VmRSS']:7.1f}  peak {s['VmHWM']:7.1f}  anon {s['RssAnon']:7.1f}  "
        f"file {s['RssFile']:7.1f} MiB",
        flush=True,
    )


def largest_mappings(count: int = 8) -> list[tuple[str, float]]:
    sizes: collections.Counter[str] = collections.Counter()
    current = "[anon]"
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and not fields[0].endswith(":"):
            current = fields[5] if len(fields) > 5 else "[anon]"
        elif fields and fields[0] == "Rss:":
            sizes[current] += int(fields[1])
    return [(name, kib / 1024) for name, kib in sizes.most_common(count)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None, help="a folder or GGUF (default: the embedded model)")
    parser.add_argument("--quant", default="q4")
    parser.add_argument("--prompt-tokens", type=int, default=500)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    import torch

    mark("import torch")
    torch.set_num_threads(args.threads)
    from app.core.chat.sampling import SamplingParams
    from app.core.engines.engine import Engine, KVState
    from app.core.engines.loader import load_model
    from app.core.memory.release import release_freed_memory

    mark("app imports")
    started = time.perf_counter()
    loaded = load_model(args.model, quantization=args.quant, device="cpu")
    mark(f"load_model ({time.perf_counter() - started:.1f} s)")
    engine = Engine(loaded)
    mark(f"Engine ({engine.decode_path})")
    short = SamplingParams(temperature=0.0, max_new_tokens=8)
    list(engine.generate_from_ids([1, 2, 3], short, kv=KVState(), use_response_cache=False))
    mark("short reply")
    ids = [(i * 37) % 40000 + 100 for i in range(args.prompt_tokens)]
    long = SamplingParams(temperature=0.0, max_new_tokens=16)
    kv = KVState()  # kept, as a conversation keeps its cache for the next turn
    list(engine.generate_from_ids(ids, long, kv=kv, use_response_cache=False))
    mark(f"{args.prompt_tokens}-token prompt + 16")
    release_freed_memory()
    mark("after malloc_trim")
    for name, mib in largest_mappings():
        print(f"{mib:8.1f} MiB  {name}")


if __name__ == "__main__":
    main()
