"""Batched decode in the server's queue, without HTTP: C requests at once through `RequestQueue` decoded together
(`parallel` C) against the same requests one at a time (`parallel` 1), in one process, rounds interleaved.

    python bench/batching.py [--model FILE.gguf] [--clients 1,2,4,8] [--tokens 64] [--rounds 3] [--late]

Printed per C: aggregate decode tok/s (every reply's tokens after its first over the wall time from the first
reply's first token to the last reply's end: the other replies' prefills included), its paired ratio to one at a
time and to one client alone; the decode steps' own rate (tokens over the time inside the queue's batched steps
where replies decode together and no prompt runs beside them: what a batch buys); the median TTFT (from the submit,
so it includes the wait for a turn), the median batch size, and whether every reply's text equals its one-at-a-time
text (greedy: it must). The server's HTTP and the clients' parsing are left out: bench/server.py --clients measures
them too.

`--late` measures instead a long prompt (a ~1,000-token document question) arriving while three replies decode: the
longest pause in their streams while it is prefilled, their tokens/s over that time, and its own TTFT, with its
prompt run PROMPT_TOKENS_BESIDE_DECODE tokens a step beside their tokens (Hearth's way) against run whole in one step
(as before: every stream waits for the whole prompt). Rounds interleaved; the texts must match.
"""

from __future__ import annotations

import argparse
import itertools
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

    def counted(steps: Sequence[Any]) -> None:
        started = time.perf_counter()
        real(steps)
        if all(isinstance(step, DecodeStep) for step in steps):  # decode steps alone (a prompt's chunk aside)
            sizes.append(len(steps))
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


DOCUMENT = "Summarise this report in three lines:\n" + " ".join(
    f"In week {n} the {color} team shipped {n * 3} fixes, closed {n + 7} tickets and wrote {n % 5} design notes."
    for n, color in enumerate(["red", "blue", "green", "amber", "violet"] * 8)
)


def late(backend: Any, beside: int, tokens: int) -> dict[str, Any]:
    """Three replies decoding; the document's request arrives at the first one's 8th token, its prompt run `beside`
    tokens a step beside their decode tokens."""
    from app.core.chat.events import ChatMessage, DoneEvent, TokenEvent
    from app.core.chat.sampling import SamplingParams
    from app.core.engines import batching
    from app.core.engines.backend import ReplyRequest
    from app.core.server.queue import End, RequestQueue

    queue = RequestQueue(backend, parallel=4)
    stamps: list[list[float]] = [[], [], [], []]
    texts = [""] * 4
    ended = [threading.Event() for _ in range(4)]
    submitted = [0.0]

    def request(text: str, most: int) -> Any:
        params = SamplingParams(temperature=0.0, max_new_tokens=most)
        return ReplyRequest([ChatMessage("user", text)], params, use_response_cache=False)

    def sink_for(index: int) -> Any:
        def sink(item: Any) -> None:
            if isinstance(item, TokenEvent):
                stamps[index].append(time.perf_counter())
                if index == 0 and len(stamps[0]) == 8:
                    submitted[0] = time.perf_counter()
                    queue.submit(request(DOCUMENT, 16), threading.Event(), sink_for(3))
            elif isinstance(item, DoneEvent):
                texts[index] = item.text
            elif isinstance(item, End):
                ended[index].set()

        return sink

    backend.clear_caches()
    for index in range(3):
        queue.submit(request(PROMPTS[index], tokens), threading.Event(), sink_for(index))
    saved, batching.PROMPT_TOKENS_BESIDE_DECODE = batching.PROMPT_TOKENS_BESIDE_DECODE, beside
    try:
        queue.start()
        for event in ended:
            event.wait()
    finally:
        batching.PROMPT_TOKENS_BESIDE_DECODE = saved
        queue.stop()
    start, first = submitted[0], stamps[3][0]
    during = [[at for at in times if start <= at <= first] for times in stamps[:3]]
    gaps = [b - a for times in stamps[:3] for a, b in itertools.pairwise(times) if b >= start and a <= first]
    return {
        "pause_ms": max(gaps) * 1000,
        "tok/s": sum(len(times) for times in during) / (first - start),
        "ttft_ms": (first - start) * 1000,
        "prompt": len(backend.engine.prepare(request(DOCUMENT, 16)).ids),
        "texts": texts,
    }


def late_table(backend: Any, rounds: int, tokens: int) -> None:
    from app.core.engines.batching import PROMPT_TOKENS_BESIDE_DECODE

    late(backend, PROMPT_TOKENS_BESIDE_DECODE, 16)  # warm
    modes = {f"{PROMPT_TOKENS_BESIDE_DECODE} tokens a step beside them": PROMPT_TOKENS_BESIDE_DECODE,
             "whole, in one step": 1 << 30}  # fmt: skip
    results: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    for _ in range(rounds):
        for mode, beside in modes.items():
            results[mode].append(late(backend, beside, tokens))
    reference = results[next(iter(modes))][0]["texts"]
    print(f"a {results[next(iter(modes))][0]['prompt']}-token prompt arriving while 3 replies decode")
    print("its prompt run | longest pause in their streams ms | their tok/s meanwhile | its TTFT ms | same text")
    for mode, rows in results.items():
        same = all(row["texts"] == reference for row in rows)
        pause, rate = (statistics.median(r[key] for r in rows) for key in ("pause_ms", "tok/s"))
        print(f"{mode} | {pause:.0f} | {rate:.1f} | {statistics.median(r['ttft_ms'] for r in rows):.0f} | "
              f"{'yes' if same else 'NO'}")  # fmt: skip


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
    parser.add_argument("--late", action="store_true", help="a long prompt arriving while replies decode")
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
    if args.late:
        late_table(backend, args.rounds, args.tokens)
        backend.close()
        return 0
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
