"""`hearth serve` measured: what a resending chat client gets from the prefix-matched KV cache, and the API's cost.

    python bench/server.py [--turns 6] [--tokens 32]

1. A scripted conversation through the openai client against a real server on 127.0.0.1 (the embedded
   SmolLM2-135M-Instruct, bf16, CPU): each turn resends the whole conversation, as chat clients do. Per turn:
   prompt tokens, `cached_tokens`, TTFT. Then the same turns with the pool emptied before each one (no reuse).
2. Decode tok/s through the API (server `timings`) ÷ the engine called directly, same greedy request, interleaved.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TURNS = [
    "Hi! I'm planning a small vegetable garden.",
    "Which vegetables are easiest for a beginner?",
    "How much sun do tomatoes need?",
    "And how often should I water them?",
    "What about lettuce in summer?",
    "Can I grow herbs next to the tomatoes?",
    "Thanks, any last tip?",
]


def conversation(
    client: object, backend: object, turns: int, tokens: int, *, reuse: bool
) -> list[tuple[int, int, float]]:
    messages: list[dict[str, str]] = []
    rows = []
    for text in TURNS[:turns]:
        messages.append({"role": "user", "content": text})
        if not reuse:
            backend._pool.clear()  # type: ignore[attr-defined]
        reply = client.chat.completions.create(  # type: ignore[attr-defined]
            model="x", messages=messages, max_tokens=tokens, temperature=0
        )
        usage = reply.usage
        rows.append(
            (usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens, reply.model_extra["timings"]["ttft_ms"])
        )
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    import openai

    from app.core.chat.events import ChatMessage, StatsEvent
    from app.core.chat.sampling import SamplingParams
    from app.core.engines.backend import ReplyRequest
    from app.core.engines.loader import load_model
    from app.core.engines.local import EngineBackend
    from app.core.server import ServerConfig, ServerHandle

    backend = EngineBackend(load_model(None, quantization="bf16", device="cpu"))
    handle = ServerHandle(ServerConfig(port=0))
    address = handle.start(backend)
    client = openai.OpenAI(base_url=address, api_key="x", max_retries=0)
    try:
        with_reuse = conversation(client, backend, args.turns, args.tokens, reuse=True)
        without = conversation(client, backend, args.turns, args.tokens, reuse=False)
        print("turn | prompt tok | cached tok | TTFT ms (reuse) | TTFT ms (no reuse)")
        for turn, ((prompt, cached, ttft), (_p, _c, cold)) in enumerate(zip(with_reuse, without, strict=True), 1):
            print(f"{turn} | {prompt} | {cached} | {ttft:.0f} | {cold:.0f}")
        total = sum(p for p, _c, _t in with_reuse)
        reused = sum(c for _p, c, _t in with_reuse)
        print(f"reused {reused} of {total} prompt tokens ({100 * reused / total:.0f}%)")

        question = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]
        api_rates, direct_rates = [], []
        for _ in range(3):
            reply = client.chat.completions.create(model="x", messages=question, max_tokens=96, temperature=0)
            api_rates.append(reply.model_extra["timings"]["predicted_per_second"])
            request = ReplyRequest(
                (ChatMessage("user", question[0]["content"]),),
                params=SamplingParams(temperature=0, max_new_tokens=96),
                use_response_cache=False,
            )
            for event in backend.generate(request, threading.Event()):
                if isinstance(event, StatsEvent):
                    direct_rates.append(event.stats.decode_tokens_per_s)
        api, direct = statistics.median(api_rates), statistics.median(direct_rates)
        print(f"decode tok/s: API {api:.1f}, direct {direct:.1f}, ratio {api / direct:.3f}")
    finally:
        handle.stop()
    return 0


if __name__ == "__main__":
    time.sleep(0)
    raise SystemExit(main())
