"""Batched decode in the server's queue, without HTTP: C requests at once through `RequestQueue` decoded together
(`parallel` C) against the same requests one at a time (`parallel` 1), in one process, rounds interleaved.

    python bench/batching.py [--model FILE.gguf] [--clients 1,2,4,8] [--tokens 64] [--rounds 3]

Printed per C: aggregate decode tok/s (every reply's tokens after its first over the wall time from the first
reply's first token to the last reply's end: the other replies' prefills included), its paired ratio to one at a
time and to one client alone; the decode steps' own rate (tokens over the time inside the queue's batched steps,
where replies run together: what a batch buys, prefills aside); the median TTFT (from the submit, so it includes the
wait for a turn), the median batch size, and whether every reply's text equals its one-at-a-time text (greedy: it
must). The server's HTTP and the clients' parsing are left out: bench/server.py --clients measures them too.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import llama_build  # noqa: E402

PROMPTS = [
    "Tell me a long story about a lighthouse keeper and the ships she guides home.",
    "Explain how a bicycle stays upright, step by step.",
    "Write a letter to a friend about a trip to the mountains.",
    "Describe the water cycle to a ten-year-old.",
    "List ten ideas for a rainy afternoon and say why each is fun.",
    "What makes bread rise? Explain the chemistry simply.",
    "Write a short poem about autumn leaves and then explain it.",
    "How do bees make honey? Give the whole process.",
]


def run(backend: Any, count: int, parallel: int, tokens: int) -> dict[str, Any]:
    """`count` requests at once through a queue running `parallel` together, from empty KV caches: no run reuses
    another's prefix, every reply pays its whole prefill in every mode."""
    from app.core.chat.events import ChatMessage, DoneEvent, StatsEvent, TokenEvent
    from app.core.chat.sampling import SamplingParams
    from app.core.engines.backend import ReplyRequest
    from app.core.engines.batching import DecodeStep
    from app.core.server.queue import End, RequestQueue

    sizes: list[int] = []
    step_s: list[float] = []
    real = backend.decode_batch

    def counted(steps: Sequence[DecodeStep]) -> None:
        sizes.append(len(steps))
        started = time.perf_counter()
        real(steps)
        step_s.append(time.perf_counter() - started)

    backend.decode_batch = counted
    queue = RequestQueue(backend, parallel=parallel)
    ended = [threading.Event() for _ in range(count)]
    texts = [""] * count
    first = [0.0] * count
    generated = [0] * count
    submitted = [0.0] * count

    def sink_for(index: int) -> Any:
        def sink(item: Any) -> None:
            if isinstance(item, TokenEvent) and not first[index]:
                first[index] = time.perf_counter()
            elif isinstance(item, StatsEvent):
                generated[index] = item.stats.generated_tokens
            elif isinstance(item, DoneEvent):
                texts[index] = item.text
            elif isinstance(item, End):
                ended[index].set()

        return sink

    backend.clear_caches()
    for index in range(count):
        request = ReplyRequest(
            [ChatMessage("user", PROMPTS[index % len(PROMPTS)])],
            SamplingParams(temperature=0.0, max_new_tokens=tokens),
            use_response_cache=False,
        )
        submitted[index] = time.perf_counter()
        queue.submit(request, threading.Event(), sink_for(index))
    queue.start()
    for event in ended:
        event.wait()
    done = time.perf_counter()
    queue.stop()
    del backend.decode_batch
    wall = done - min(first)
    return {
        "tok/s": sum(max(n - 1, 0) for n in generated) / wall,
        "ttft_ms": statistics.median(at - sent for at, sent in zip(first, submitted, strict=True)) * 1000,
        "texts": texts,
        "batch": statistics.median(sizes) if sizes else 1,
        "step tok/s": sum(sizes) / sum(step_s) if step_s else 0.0,
    }


def steps_rate(rows: list[dict[str, Any]]) -> str:
    rates = [row["step tok/s"] for row in rows if row["step tok/s"] > 0]
    return f"{statistics.median(rates):.1f}" if rates else "–"


def steps_ratio(rows: list[dict[str, Any]], alone: float) -> str:
    rates = [row["step tok/s"] for row in rows if row["step tok/s"] > 0]
    return f"{statistics.median(rates) / alone:.2f}" if rates and alone > 0 else "–"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", type=Path, default=None, help="a GGUF file (default: the embedded model's)")
    parser.add_argument("--clients", default="1,2,4,8")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from app.core.engines.backend import LoadRequest
    from app.core.engines.lite.backend import LiteBackend, open_lite_backend

    backend = open_lite_backend(
        LoadRequest(str(args.model) if args.model else None, device="cpu", response_cache=False, prompt_cache_gib=0)
    )
    assert isinstance(backend, LiteBackend), backend
    print(f"machine: {llama_build.machine_line()}")
    print(f"model: {args.model or 'the embedded default model'}; {backend.engine.decode_path_note}")
    print(f"{args.tokens} tokens at most per reply, greedy, {args.rounds} rounds interleaved; "
          f"at most {backend.max_batch} together")  # fmt: skip
    counts = [int(count) for count in args.clients.split(",")]
    run(backend, 1, 1, 8)  # warm: the first pass maps the weights
    results: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for _ in range(args.rounds):
        for count in counts:
            # "together" with one client still runs the batched path (its steps one row each): the same code as more
            for mode, parallel in (("together", max(2, count)), ("one at a time", 1)):
                results.setdefault((count, mode), []).append(run(backend, count, parallel, args.tokens))
    alone = statistics.median(r["tok/s"] for r in results[(counts[0], "one at a time")])
    alone_steps = statistics.median(r["step tok/s"] for r in results[(counts[0], "together")])
    print("clients | mode | aggregate tok/s | ÷ one at a time (paired) | ÷ one client | decode steps tok/s | "
          "÷ one client | TTFT ms | batch | same text")  # fmt: skip
    for count in counts:
        for mode in ("together", "one at a time"):
            rows = results[(count, mode)]
            serial = results[(count, "one at a time")]
            ratios = [row["tok/s"] / base["tok/s"] for row, base in zip(rows, serial, strict=True)]
            same = all(row["texts"] == base["texts"] for row, base in zip(rows, serial, strict=True))
            print(f"{count} | {mode} | {statistics.median(r['tok/s'] for r in rows):.1f} | "
                  f"{statistics.median(ratios):.2f} | {statistics.median(r['tok/s'] for r in rows) / alone:.2f} | "
                  f"{steps_rate(rows)} | {steps_ratio(rows, alone_steps)} | "
                  f"{statistics.median(r['ttft_ms'] for r in rows):.0f} | "
                  f"{statistics.median(r['batch'] for r in rows):.0f} | {'yes' if same else 'NO'}")  # fmt: skip
    backend.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
