"""First-answer latency with the CPU's fused decode step, cold (nothing cached) vs warm (kernel and int8 copies cached).

    python bench/first_answer.py [--trials 4] [--quant bf16]

Each run is a fresh process with its own cache dir (the GGUF is read as it is: there is nothing to convert). Cold:
the kernel is compiled and the int8 copies are packed (and written to the cache). Warm: both are read from the cache.
Printed per mode: median seconds from process start to the first token, the engine's setup (decode path) time, and
the time to first token of the reply itself; cold and warm runs are interleaved.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from app.core.engines.backend import ReplyRequest

ROOT = Path(__file__).resolve().parent.parent
QUESTION = "What is the capital of France?"


def worker() -> dict[str, object]:
    sys.path.insert(0, str(ROOT))
    import psutil

    from app.core.chat.events import ChatMessage, StatsEvent, TokenEvent
    from app.core.chat.sampling import SamplingParams
    from app.core.engines.engine import Engine
    from app.core.engines.loader import load_model

    loaded = load_model(None, quantization=os.environ.get("BENCH_QUANT", "bf16"), device="cpu")
    started = time.perf_counter()
    engine = Engine(loaded)
    setup_s = time.perf_counter() - started
    first_token_s = 0.0
    ttft = 0.0
    params = SamplingParams(temperature=0.0, max_new_tokens=8)
    for event in engine.generate(ReplyRequest([ChatMessage("user", QUESTION)], params, use_response_cache=False)):
        if isinstance(event, TokenEvent) and not first_token_s:
            first_token_s = time.time() - psutil.Process().create_time()
        if isinstance(event, StatsEvent):
            ttft = event.stats.ttft_s
    return {
        "path": engine.decode_path,
        "note": engine.decode_path_note,
        "launch_to_first_token_s": first_token_s,
        "engine_setup_s": setup_s,
        "ttft_s": ttft,
        "load_s": loaded.load_seconds,
    }


def run_once(cache: Path) -> dict[str, object]:
    env = {**os.environ, "HEARTH_CACHE_DIR": str(cache), "TQDM_DISABLE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--worker"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"first_answer: the worker failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def fresh_cache(parent: Path) -> Path:
    return Path(tempfile.mkdtemp(dir=parent))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--quant", default="bf16")
    args = parser.parse_args(argv)
    os.environ["BENCH_QUANT"] = args.quant
    if args.worker:
        print(json.dumps(worker()))
        return 0
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory() as scratch:
        parent = Path(scratch)
        warm_cache = fresh_cache(parent)
        run_once(warm_cache)  # fills the warm cache (not measured)
        runs: dict[str, list[dict[str, object]]] = {"cold": [], "warm": []}
        for trial in range(args.trials):
            for mode in ("cold", "warm") if trial % 2 == 0 else ("warm", "cold"):
                cache = fresh_cache(parent) if mode == "cold" else warm_cache
                runs[mode].append(run_once(cache))
                if mode == "cold":
                    shutil.rmtree(cache)
            print(
                f"trial {trial + 1}: launch to first token cold {runs['cold'][-1]['launch_to_first_token_s']:.2f} s, "
                f"warm {runs['warm'][-1]['launch_to_first_token_s']:.2f} s",
                flush=True,
            )
    print(f"\n{args.quant}, decode path: {runs['warm'][0]['path']} — {runs['warm'][0]['note']}")
    print(f"{'':6}{'launch→first token':>20}{'engine setup':>14}{'reply TTFT':>12}{'model load':>12}")
    for mode, rows in runs.items():

        def median(key: str, rows: list[dict[str, object]] = rows) -> float:
            return statistics.median(float(r[key]) for r in rows)  # type: ignore[arg-type]

        print(
            f"{mode:6}{median('launch_to_first_token_s'):>19.2f}s{median('engine_setup_s'):>13.2f}s"
            f"{median('ttft_s'):>11.2f}s{median('load_s'):>11.2f}s"
        )
    print(f"cold runs' setup notes: {runs['cold'][0]['note']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
