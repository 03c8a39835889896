"""Remote engines: the client's own overhead, and what a 10-turn conversation re-sends and costs.

    python bench/remote.py [--trials 5] [--tokens 64] [--paced-rate 200]

1. Overhead. (a) A pacing server on 127.0.0.1 (FastAPI + uvicorn, in this process's background thread) streams N
   OpenAI-shaped chunks at a fixed rate and reports its own send rate in a llama-server-style `timings` object;
   the ratio is RemoteBackend's client-side decode tok/s ÷ the rate the server reports for that request (target
   ≥ 0.98). (b) The same on `transformers serve` (Hugging Face's OpenAI-compatible server, offline, default
   SmolLM2-135M-Instruct on the CPU), which reports no rate: there the reference is a bare httpx2 client reading the
   same greedy request's SSE lines, interleaved with RemoteBackend per trial.
2. A scripted 10-turn conversation through ChatSession on `transformers serve`: prompt tokens per turn (the
   server's usage), the part that re-sent history, and what a prefix-caching server (vLLM's automatic prefix
   caching) would have reused — computed as the previous turn's prompt + reply, since transformers serve has no
   prefix cache to measure — and the conversation's cost on two hosted price lists (genai-prices' bundled snapshot),
   with and without prompt caching. Prices are estimates.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator
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
    "Which herbs keep pests away?",
    "How do I make compost?",
    "How long does compost take?",
    "Thanks! Summarise the plan in one sentence.",
]
PRICE_LISTS = [("openai", "gpt-4o-mini"), ("anthropic", "claude-haiku-4-5")]


def pacing_server(tokens: int, rate: float):  # type: ignore[no-untyped-def]
    """A FastAPI app streaming `tokens` chunks at `rate` per second, reporting its measured send rate."""
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    app = FastAPI()

    def chunk(delta: dict[str, object], finish: str | None = None, **extra: object) -> bytes:
        body = {"id": "p", "object": "chat.completion.chunk", "created": 0, "model": "paced",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}  # fmt: skip
        return f"data: {json.dumps(body)}\n\n".encode()

    @app.post("/v1/chat/completions")
    async def chat() -> StreamingResponse:
        async def stream() -> AsyncIterator[bytes]:
            interval = 1.0 / rate
            start = time.perf_counter()
            first = last = start
            for index in range(tokens):
                delay = start + index * interval - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                yield chunk({"content": f" t{index}"})
                last = time.perf_counter()
                if index == 0:
                    first = last
            server_rate = (tokens - 1) / (last - first)
            usage = {"prompt_tokens": 10, "completion_tokens": tokens, "total_tokens": tokens + 10}
            yield chunk({}, "length", usage=usage, timings={"predicted_n": tokens, "predicted_per_second": server_rate})
            yield b"data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    return app


def serve_in_thread(app) -> tuple[object, int]:  # type: ignore[no-untyped-def]
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="critical", lifespan="off"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    return server, server.servers[0].sockets[0].getsockname()[1]


def request(text: str, max_tokens: int):  # type: ignore[no-untyped-def]
    from app.core.chat.events import ChatMessage
    from app.core.chat.sampling import SamplingParams
    from app.core.engines.backend import ReplyRequest

    params = SamplingParams(temperature=0.0, max_new_tokens=max_tokens)
    return ReplyRequest((ChatMessage("user", text),), params=params, use_response_cache=False)


def through_backend(backend, req) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    from app.core.chat.events import StatsEvent

    stats = next(e.stats for e in backend.generate(req, threading.Event()) if isinstance(e, StatsEvent))
    return stats.decode_tokens_per_s, stats.generated_tokens


def bare_client(base_url: str, model: str, text: str, max_tokens: int) -> tuple[float, int]:
    """The reference: httpx2 reading SSE lines, no SDK, no event objects."""
    import httpx2

    body = {"model": model, "stream": True, "max_tokens": max_tokens, "temperature": 0.0,
            "messages": [{"role": "user", "content": text}]}  # fmt: skip
    stamps: list[float] = []
    with httpx2.stream("POST", f"{base_url}/chat/completions", json=body, timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith("data: {") and '"content"' in line and '"content":""' not in line:
                stamps.append(time.perf_counter())
    return (len(stamps) - 1) / (stamps[-1] - stamps[0]), len(stamps)


def overhead_paced(trials: int, tokens: int, rate: float) -> None:
    from app.core.engines.remote.backend import RemoteBackend
    from app.core.engines.remote.engines import EngineConfig

    server, port = serve_in_thread(pacing_server(tokens, rate))
    backend = RemoteBackend(EngineConfig("paced", base_url=f"http://127.0.0.1:{port}/v1"), "paced")
    ratios = []
    for _ in range(trials):
        client_rate, _ = through_backend(backend, request("go", tokens))
        assert backend.last_timings is not None and backend.last_timings.predicted_per_second
        ratios.append(client_rate / backend.last_timings.predicted_per_second)
    server.should_exit = True  # type: ignore[attr-defined]
    print(f"1a. pacing server (FastAPI+uvicorn on 127.0.0.1, {tokens} chunks at {rate:g}/s, reports its send rate)")
    print(f"    RemoteBackend tok/s ÷ server-reported tok/s: median {statistics.median(ratios):.4f} "
          f"(min {min(ratios):.4f}, max {max(ratios):.4f}, {trials} trials; target ≥ 0.98)")  # fmt: skip


def start_transformers_serve():  # type: ignore[no-untyped-def]
    from app.core.engines.loader import load_model
    from tests.helpers.transformers_serve import transformers_serve

    folder = load_model(None, quantization="bf16", device="cpu").folder
    return transformers_serve(folder, Path(tempfile.mkdtemp()) / "transformers-serve.log")


def overhead_transformers(server, trials: int, tokens: int) -> None:  # type: ignore[no-untyped-def]
    from app.core.engines.remote.backend import RemoteBackend
    from app.core.engines.remote.engines import EngineConfig

    text = "Write a long story about a dragon who learns to bake bread."
    backend = RemoteBackend(EngineConfig("tserve", base_url=server.base_url), server.model)
    through_backend(backend, request(text, 8))  # warm-up
    ratios, ours, refs = [], [], []
    for _ in range(trials):
        ref_rate, _ = bare_client(server.base_url, server.model, text, tokens)
        our_rate, _ = through_backend(backend, request(text, tokens))
        ratios.append(our_rate / ref_rate)
        ours.append(our_rate)
        refs.append(ref_rate)
    print(f"1b. transformers serve (offline, SmolLM2-135M-Instruct bf16, CPU), {tokens} tokens greedy, interleaved")
    print(f"    RemoteBackend {statistics.median(ours):.1f} tok/s vs bare httpx2 client {statistics.median(refs):.1f} "
          f"tok/s: ratio median {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f})")  # fmt: skip
    print("    (two different requests per pair: the CPU server's own decode rate, which swings with the machine's")
    print("     load, dominates this ratio; 1a is the client-overhead measure)")


def conversation(server, reply_tokens: int) -> None:  # type: ignore[no-untyped-def]
    from app.core.chat.events import ChatMessage, StatsEvent
    from app.core.chat.sampling import SamplingParams
    from app.core.engines.backend import ReplyRequest
    from app.core.engines.remote.backend import RemoteBackend
    from app.core.engines.remote.engines import EngineConfig
    from app.core.engines.remote.pricing import ConversationCost, TokenUsage, price_reply
    from app.core.engines.session import ChatSession

    backend = RemoteBackend(EngineConfig("tserve", base_url=server.base_url), server.model)
    session = ChatSession(backend, system_prompt="You are a helpful gardening assistant.",
                                params=SamplingParams(temperature=0.0, max_new_tokens=reply_tokens))  # fmt: skip
    rows = []
    previous_total = 0  # prompt + reply of the turn before: what a prefix cache holds
    for turn, text in enumerate(TURNS, 1):
        events = list(session.ask(text))  # to the end: the session keeps the reply only after DoneEvent
        stats = next(e.stats for e in events if isinstance(e, StatsEvent))
        # What was sent: the system prompt and every message but the reply just added.
        sent = ReplyRequest(tuple([ChatMessage("system", session.system_prompt or ""), *session.messages[:-1]]))
        history = backend._history_tokens(sent, stats.prompt_tokens)
        cached = min(previous_total, stats.prompt_tokens - 1) if turn > 1 else 0
        rows.append((turn, stats.prompt_tokens, history, cached, stats.generated_tokens))
        previous_total = stats.prompt_tokens + stats.generated_tokens
    print(
        "\n2. ten-turn conversation on transformers serve "
        f"(prompt tokens from the server's usage; replies ≤ {reply_tokens} tokens)"
    )
    print("   turn  prompt  re-sent history  prefilled (no prefix cache)  prefilled (prefix cache)  reply")
    for turn, prompt, history, cached, reply in rows:
        print(f"   {turn:4d}  {prompt:6d}  {history:15d}  {prompt:27d}  {prompt - cached:24d}  {reply:5d}")
    total_prompt = sum(r[1] for r in rows)
    total_cached = sum(r[3] for r in rows)
    print(f"   total prompt tokens sent {total_prompt}; re-sent history {sum(r[2] for r in rows)}; "
          f"prefilled with a prefix cache {total_prompt - total_cached} "
          f"({100 * total_cached / total_prompt:.0f}% reused; computed, not measured)")  # fmt: skip
    print("   the same tokens on hosted price lists (genai-prices bundled snapshot; estimates). OpenAI and Anthropic")
    print("   cache only prefixes of ≥ 1,024 tokens, so a chat this short would get no discount: the 'with' rows are")
    print("   the per-token arithmetic for a prefix-cached conversation.")
    for provider, model in PRICE_LISTS:
        for use_cache in (False, True):
            ledger = ConversationCost()
            for _, prompt, history, cached, reply in rows:
                usage = TokenUsage(prompt, cached if use_cache else 0, reply, history)
                ledger.add(price_reply(usage, model, provider, hypothetical=True))
            print(f"     {provider}/{model:18s} {'with' if use_cache else 'no  '} prompt caching: "
                  f"${ledger.total_usd:.6f} (re-sending history ${ledger.history_usd:.6f}, "
                  f"caching saved ${ledger.cache_saved_usd:.6f})")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--paced-tokens", type=int, default=400)
    parser.add_argument("--paced-rate", type=float, default=200.0)
    parser.add_argument("--reply-tokens", type=int, default=32)
    args = parser.parse_args()
    overhead_paced(args.trials, args.paced_tokens, args.paced_rate)
    with start_transformers_serve() as server:
        overhead_transformers(server, args.trials, args.tokens)
        conversation(server, args.reply_tokens)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
