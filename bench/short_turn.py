"""A reused turn's prefill on the q4 CPU path: a few new tokens on top of a conversation's cached prefix.

    python bench/short_turn.py [--model .cache/models/random-tinyllama-1b] [--trials 5] [--new 1,4,12,32,64]

Each trial, in one process and interleaved: the same turn prefilled (a) as before 2026-12-03 evening: every Q4_1
matrix dequantized into the scratch buffer for a GEMM and the int8 lm_head dequantized in torch, and (b) as now:
up to `packed.RECORD_PREFILL_ROWS` rows multiplied straight from the records (`hearth_q4_prefill`) and the lm_head
through the step's int8 path (`hearth_lm_head`). Prints each variant's median prefill time per new-token count and the
per-trial paired ratios (before ÷ now: above 1 is faster now).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TQDM_DISABLE", "1")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a folder or GGUF (default: the embedded model)")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--new", default="1,4,12,32,64", help="new tokens per turn (comma-separated)")
    parser.add_argument("--history", type=int, default=300, help="tokens already in the cache")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    from app.core.engines.loader import load_model
    from app.core.fastpath import packed
    from app.core.fastpath.native import new_slab_cache

    loaded = load_model(args.model, quantization="q4", device="cpu")
    if loaded.quantization != "q4":
        print(f"loaded as {loaded.quantization}, not q4: {loaded.notices}")
        return 1
    model = loaded.model
    matrices = [m for m in model.modules() if isinstance(m, packed.Q4Linear)]
    head = model.get_output_embeddings()
    library = getattr(head, "library", None)
    record_rows = {id(matrix): matrix.record_rows for matrix in matrices}

    def use(variant: str) -> None:
        for matrix in matrices:
            matrix.record_rows = record_rows[id(matrix)] if variant == "now" else 0
        if isinstance(head, packed.Int8RowsLinear):
            head.library = None if variant == "before" else library

    cache: Any = new_slab_cache(model, args.history + 64)
    history = torch.tensor([[(i * 37) % 40000 + 100 for i in range(args.history)]])
    with torch.inference_mode():
        model(input_ids=history, use_cache=True, logits_to_keep=1, cache=cache)

    def turn(count: int) -> float:
        ids = torch.tensor([[(i * 53) % 40000 + 200 for i in range(count)]])
        started = time.perf_counter()
        with torch.inference_mode():
            model(input_ids=ids, use_cache=True, logits_to_keep=1, cache=cache)
        elapsed = time.perf_counter() - started
        for layer in cache.layers:
            layer.crop(-count)  # back to the history: every trial prefills the same turn
        return elapsed

    counts = [int(n) for n in args.new.split(",")]
    times: dict[tuple[str, int], list[float]] = {(v, n): [] for v in ("before", "now") for n in counts}
    for variant in ("before", "now"):  # warm-up, not measured
        use(variant)
        turn(counts[0])
    for _ in range(args.trials):
        for count in counts:
            for variant in ("before", "now"):
                use(variant)
                times[(variant, count)].append(turn(count))
    print(f"{loaded.source.display_name}: {args.history} tokens cached, {args.threads} threads, {args.trials} trials")
    print(f"{'new tokens':>10}  {'before (s)':>10}  {'now (s)':>8}  paired before ÷ now")
    for count in counts:
        before, now = times[("before", count)], times[("now", count)]
        ratios = [b / n for b, n in zip(before, now, strict=True)]
        listed = " ".join(f"{r:.2f}" for r in ratios)
        print(
            f"{count:>10}  {statistics.median(before):>10.3f}  {statistics.median(now):>8.3f}  "
            f"median {statistics.median(ratios):.2f}x  [{listed}]"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
