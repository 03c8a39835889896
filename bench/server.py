"""`hearth serve` measured against `hearth chat`: the same request through every front end, and what a resending chat
client gets from the prefix-matched KV cache.

    python bench/server.py [--rounds 3] [--tokens 128] [--peer-python .cache/peer-venv/bin/python] [--cache]
        [--clients 1,2,4,8] [--model FILE.gguf] [--skip-front-ends]

1. Front ends (the default model, CPU, greedy, the same system and user message): decode tok/s and TTFT through
   `hearth chat` (a fresh process a round, its own `--json` stats), `hearth serve` on the torch-free runtime (the one
   both now open), `hearth serve` held to the torch runtime (HEARTH_RUNTIME=torch, q4: the CPU fast path it had), and
   llama.cpp's server (llama-cpp-python's `llama_cpp.server` on the model's own GGUF) where --peer-python has it
   (`make bench-peer` builds one; add its [server] extra). Servers are measured from the client, streamed: TTFT is
   the first content chunk, decode rate the chunks after it over their time (the usage's token count when given).
   Rounds interleave the front ends; printed: medians and per-round paired ratios to `hearth chat`.
2. --cache: a scripted conversation against a server in this process (bf16, torch): each turn resends the whole
   conversation; per turn prompt tokens, `cached_tokens`, TTFT, then the same turns with the pool emptied each time.
3. --clients: C clients send the same streamed request at once to `hearth serve` (replies decoded together, and
   with --parallel 1: one at a time) and llama.cpp's server: aggregate tok/s (and its ratio to one client),
   per-client decode tok/s and TTFT; --model: on that GGUF file instead of the default model's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SYSTEM = "You are a helpful assistant."
PROMPT = "Tell me a long story about a lighthouse keeper and the ships she guides home."
DEFAULT_PEER_PYTHON = ROOT / ".cache" / "peer-venv" / "bin" / "python"
TURNS = [
    "Hi! I'm planning a small vegetable garden.",
    "Which vegetables are easiest for a beginner?",
    "How much sun do tomatoes need?",
    "And how often should I water them?",
    "What about lettuce in summer?",
    "Can I grow herbs next to the tomatoes?",
    "Thanks, any last tip?",
]
Row = dict[str, float]


# -- 1. front ends ---------------------------------------------------------------------------------------------
def through_chat(tokens: int) -> Row:
    result = subprocess.run(
        [sys.executable, "-m", "app", "chat", PROMPT, "--system", SYSTEM, "--device", "cpu", "--temperature", "0",
         "--max-tokens", str(tokens), "--no-response-cache", "--json"],
        capture_output=True, text=True, cwd=ROOT, timeout=900,
    )  # fmt: skip
    if result.returncode != 0:
        raise SystemExit(f"hearth chat failed:\n{result.stderr[-2000:]}")
    stats = next(e for e in map(json.loads, result.stdout.splitlines()) if e["type"] == "stats")
    rate, ttft, generated = stats["decode_tokens_per_s"], stats["ttft_s"] * 1000, stats["generated_tokens"]
    return {"tok/s": rate, "ttft_ms": ttft, "tokens": generated, "engine tok/s": rate}


def through_server(base_url: str, tokens: int) -> Row:
    """One streamed request, timed at the client."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=900)
    started = time.perf_counter()
    first = last = None
    chunks = 0
    usage = None
    stream = client.chat.completions.create(
        model="x", messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPT}],
        temperature=0, max_tokens=tokens, stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    engine_rate = 0.0
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        timings = (chunk.model_extra or {}).get("timings")
        if isinstance(timings, dict) and isinstance(timings.get("predicted_per_second"), int | float):
            engine_rate = float(timings["predicted_per_second"])  # the server's own figure, as chat's --json stats
        if chunk.choices and chunk.choices[0].delta.content:
            last = time.perf_counter()
            first = first or last
            chunks += 1
    generated = usage.completion_tokens if usage is not None else chunks
    if first is None or last is None or last <= first:
        return {"tok/s": 0.0, "ttft_ms": 0.0, "tokens": generated, "engine tok/s": engine_rate}
    return {
        "tok/s": (generated - 1) / (last - first),
        "ttft_ms": (first - started) * 1000,
        "tokens": generated,
        "engine tok/s": engine_rate,
    }


@dataclass(frozen=True)
class ServerProcess:
    argv: list[str]
    env: dict[str, str]
    ready: re.Pattern[str]  # the log line that says it listens; group 1: its base URL (without /v1 for llama.cpp)
    suffix: str = ""


@contextmanager
def serving(spec: ServerProcess) -> Iterator[str]:
    """The server process; yields its base URL once its log names it."""
    process = subprocess.Popen(spec.argv, cwd=ROOT, env=spec.env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                               text=True)  # fmt: skip
    assert process.stderr is not None
    lines: list[str] = []
    try:
        url = None
        while url is None:
            line = process.stderr.readline()
            if not line:
                raise SystemExit(f"{' '.join(spec.argv[:4])} did not start:\n{''.join(lines)[-2000:]}")
            lines.append(line)
            if found := spec.ready.search(line):
                url = found.group(1) + spec.suffix
        stderr = process.stderr
        threading.Thread(target=lambda: list(iter(stderr.readline, "")), daemon=True).start()  # keep the pipe open
        for line in lines:
            if line.startswith("hearth: runtime:"):
                print(f"  {line.strip()}")
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            process.wait(60)
        if process.poll() is None:
            process.kill()


def server_specs(
    peer_python: Path, *, torch_row: bool = True, model: Path | None = None, one_at_a_time_row: bool = False
) -> dict[str, ServerProcess]:
    """`hearth serve` on the torch-free runtime (and held to torch, or to one reply at a time), and llama.cpp's server
    where the peer has one; on `model` (a GGUF file) or the default model's."""
    import psutil

    from app.core.models.model_source import default_model_gguf

    hearth_ready = re.compile(r"at (http://127\.0\.0\.1:\d+/v1) · ")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    serve = [sys.executable, "-m", "app", "serve", "--port", "0", "--device", "cpu"]
    if model is not None:
        serve += ["--model", str(model)]
    servers = {"hearth serve (torch-free)": ServerProcess(serve, env, hearth_ready)}
    if one_at_a_time_row:
        servers["hearth serve --parallel 1"] = ServerProcess([*serve, "--parallel", "1"], env, hearth_ready)
    if torch_row:
        torch_env = {**env, "HEARTH_RUNTIME": "torch"}
        servers["hearth serve (torch)"] = ServerProcess([*serve, "--quant", "q4"], torch_env, hearth_ready)
    gguf = model or default_model_gguf()
    peer = [str(peer_python), "-c", "import llama_cpp.server"]
    if peer_python.exists() and subprocess.run(peer, capture_output=True).returncode == 0:
        threads = psutil.cpu_count(logical=False) or 1
        servers["llama.cpp server"] = ServerProcess(
            [str(peer_python), "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1", "--port",
             str(free_port()), "--n_threads", str(threads), "--n_ctx", "2048"],
            env, re.compile(r"Uvicorn running on (http://127\.0\.0\.1:\d+)"), "/v1",
        )  # fmt: skip
    else:
        print(f"  llama.cpp server: not measured ({peer_python} has no llama_cpp.server: `make bench-peer`)")
    return servers


def front_ends(rounds: int, tokens: int, peer_python: Path) -> None:
    servers = server_specs(peer_python)
    rows: dict[str, list[Row]] = {"hearth chat": [], **{name: [] for name in servers}}
    with ExitStack() as stack:
        urls = {name: stack.enter_context(serving(spec)) for name, spec in servers.items()}
        for number in range(1, rounds + 1):
            rows["hearth chat"].append(through_chat(tokens))
            for name, url in urls.items():
                rows[name].append(through_server(url, tokens))
            print(f"  round {number}: " + " · ".join(f"{n} {r[-1]['tok/s']:.1f} tok/s" for n, r in rows.items()))
    chat = rows["hearth chat"]
    print(f"\nsame request, at most {tokens} tokens, greedy; medians of {rounds} interleaved rounds")
    print(
        "Decode tok/s at the client: chunks after the first over their time (chat: its own --json stats). At the "
        "engine: the server's own `timings` figure (measured as chat's stats are; llama-cpp-python sends none)."
    )
    print("front end | decode tok/s | ÷ hearth chat (paired) | at the engine | ÷ hearth chat | TTFT ms | tokens")
    for name, measured in rows.items():
        ratios = [m["tok/s"] / c["tok/s"] for m, c in zip(measured, chat, strict=True) if c["tok/s"] > 0]
        engine = [
            m["engine tok/s"] / c["tok/s"]
            for m, c in zip(measured, chat, strict=True)
            if c["tok/s"] > 0 and m["engine tok/s"] > 0
        ]
        at_engine = (
            f"{statistics.median(m['engine tok/s'] for m in measured):.1f} | {statistics.median(engine):.3f}"
            if engine
            else "– | –"
        )
        print(f"{name} | {statistics.median(m['tok/s'] for m in measured):.1f} | "
              f"{statistics.median(ratios) if ratios else 0:.3f} | {at_engine} | "
              f"{statistics.median(m['ttft_ms'] for m in measured):.0f} | "
              f"{statistics.median(m['tokens'] for m in measured):.0f}")  # fmt: skip


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# -- 3. concurrent clients ------------------------------------------------------------------------------------
def concurrent(counts: list[int], tokens: int, peer_python: Path, model: Path | None) -> None:
    """C clients send the same streamed request at once: per-client decode tok/s and TTFT, and the aggregate (all
    tokens generated over the wall time from the first send to the last reply's end)."""
    from concurrent.futures import ThreadPoolExecutor

    servers = server_specs(peer_python, torch_row=False, model=model, one_at_a_time_row=True)
    on = model or "the default model"
    print(f"same request from C clients at once, at most {tokens} tokens each, greedy, on {on}")
    print("server | clients | aggregate tok/s | ÷ one client | per-client decode tok/s (median) | TTFT ms median / max")
    for name, spec in servers.items():  # one server at a time: the others' threads would compete for the cores
        with serving(spec) as url:
            through_server(url, 8)  # warm: the first request maps the weights
            single = 0.0
            for count in counts:
                started = time.perf_counter()
                with ThreadPoolExecutor(count) as pool:
                    rows = list(pool.map(through_server, [url] * count, [tokens] * count))
                wall = time.perf_counter() - started
                aggregate = sum(row["tokens"] for row in rows) / wall
                single = single or aggregate
                ttfts = sorted(row["ttft_ms"] for row in rows)
                print(f"{name} | {count} | {aggregate:.1f} | {aggregate / single:.2f} | "
                      f"{statistics.median(row['tok/s'] for row in rows):.1f} | "
                      f"{statistics.median(ttfts):.0f} / {ttfts[-1]:.0f}", flush=True)  # fmt: skip


# -- 2. the prefix-matched cache --------------------------------------------------------------------------------
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


def cache_reuse(turns: int, tokens: int) -> None:
    import openai

    from app.core.engines.loader import load_model
    from app.core.engines.local import EngineBackend
    from app.core.server import ServerConfig, ServerHandle

    backend = EngineBackend(load_model(None, quantization="bf16", device="cpu"))
    handle = ServerHandle(ServerConfig(port=0))
    address = handle.start(backend)
    client = openai.OpenAI(base_url=address, api_key="x", max_retries=0)
    try:
        with_reuse = conversation(client, backend, turns, tokens, reuse=True)
        without = conversation(client, backend, turns, tokens, reuse=False)
        print("turn | prompt tok | cached tok | TTFT ms (reuse) | TTFT ms (no reuse)")
        for turn, ((prompt, cached, ttft), (_p, _c, cold)) in enumerate(zip(with_reuse, without, strict=True), 1):
            print(f"{turn} | {prompt} | {cached} | {ttft:.0f} | {cold:.0f}")
        total = sum(p for p, _c, _t in with_reuse)
        reused = sum(c for _p, c, _t in with_reuse)
        print(f"reused {reused} of {total} prompt tokens ({100 * reused / total:.0f}%)")
    finally:
        handle.stop()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--peer-python", type=Path, default=DEFAULT_PEER_PYTHON)
    parser.add_argument("--cache", action="store_true", help="also the prefix-cache conversation (bf16, torch)")
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--clients", default="", help="e.g. 1,2,4,8: also concurrent clients per server")
    parser.add_argument("--skip-front-ends", action="store_true", help="leave out part 1")
    parser.add_argument("--model", type=Path, default=None, help="part 3 on this GGUF file")
    args = parser.parse_args()
    if not args.skip_front_ends:
        print("1. the same request through every front end")
        front_ends(args.rounds, args.tokens, args.peer_python)
    if args.cache:
        print("\n2. a resending chat client and the prefix-matched KV cache")
        cache_reuse(args.turns, 32)
    if args.clients:
        print("\n3. concurrent clients")
        concurrent([int(count) for count in args.clients.split(",")], args.tokens, args.peer_python, args.model)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
