"""Decode beside busy cores: Hearth's torch-free runtime (its adaptive team, as users run it; `--runtime torch`: its
torch runtime) and llama.cpp on the same GGUF, quiet and with 1 and 2 competing CPU-bound processes, interleaved, with
paired ratios.

    python bench/contention.py [--model FILE.gguf] [--trials 3] [--tokens 64] [--busy 0,1,2] [--apart] [--runtime torch]

Each measurement is one fresh process per engine (bench/peer.py's workers: the same prompt ids, greedy, llama.cpp
with as many threads as this machine has CPUs, its default), while N processes running `while True: pass` compete
for the cores. Per trial the contention levels and the engines' order rotate. Printed: median decode tok/s per engine
and level, each level's speed as a share of the same engine's quiet speed (paired per trial), and Hearth / llama.cpp
at each level (paired), with the machine, the file's format and the llama.cpp build named.

`--apart` starts each competitor in a session of its own, as another application is: where Linux groups tasks for the
scheduler (autogroup, on by default with most desktop kernels, or a desktop's per-application cgroups) the CPU is
then shared between the groups before it is shared between their threads, so Hearth's two threads together get what
the one competitor gets. Without it the competitors share Hearth's session and each thread counts alike.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import gguf_files, llama_build, peer, worker_process  # noqa: E402

SPIN = "while True: pass"
AUTOGROUP = Path("/proc/sys/kernel/sched_autogroup_enabled")


def competitors(count: int, apart: bool = False) -> list[subprocess.Popen[bytes]]:
    started = [subprocess.Popen([sys.executable, "-c", SPIN], start_new_session=apart) for _ in range(count)]
    time.sleep(0.5)  # let the scheduler see them
    return started


def autogroup(setting: Path = AUTOGROUP) -> str:
    """Whether Linux groups each session's tasks for the scheduler (kernel.sched_autogroup_enabled)."""
    try:
        return {"1": "on", "0": "off"}.get(setting.read_text().strip(), "?")
    except OSError:
        return "none"


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        process.kill()
    for process in processes:
        process.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a GGUF file; default: the embedded model")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--busy", default="0,1,2", help="numbers of competing processes")
    parser.add_argument("--apart", action="store_true", help="each competitor in a session of its own")
    parser.add_argument(
        "--runtime", choices=["auto", "torch"], default="auto", help="Hearth's runtime (auto: as the app)"
    )
    parser.add_argument("--peer-python", default=str(peer.DEFAULT_PEER_PYTHON))
    args = parser.parse_args(argv)
    if not Path(args.peer_python).exists():
        print(f"contention: {args.peer_python} not found; run `make bench-peer` once", file=sys.stderr)
        return 2
    levels = [int(value) for value in args.busy.split(",")]
    short, long, model_path, folder = peer.prompts(16, args.model)
    gguf = peer.peer_gguf(model_path, folder, args.peer_python, os.cpu_count() or 2)
    info = gguf_files.describe(gguf)
    spec: dict[str, object] = {
        "model": args.model, "context": 1024, "short_ids": short, "long_ids": long, "tokens": args.tokens,
        "threads": os.cpu_count() or 2, "quant": "auto", "runtime": args.runtime, "adaptive": True, "gguf": str(gguf),
        "gguf_bytes_per_token": info["decode_bytes_per_token"],
    }  # fmt: skip
    print(f"machine: {llama_build.machine_line()}")
    where = "each in a session of its own" if args.apart else "in the bench's session"
    print(f"model: {gguf.name} ({info['format']} file); {args.tokens} new tokens; competing: {levels} processes, "
          f"{where}; scheduler autogroup: {autogroup()}; Hearth's runtime: {args.runtime}")  # fmt: skip
    print(f"llama.cpp build: {worker_process.llama_build_line(args.peer_python)}")
    pythons = {"hearth": sys.executable, "llama": args.peer_python}
    speed: dict[tuple[str, int], list[float]] = {(engine, n): [] for engine in pythons for n in levels}
    for trial in range(args.trials):
        order = levels[trial % len(levels) :] + levels[: trial % len(levels)]
        for n in order:
            busy = competitors(n, args.apart)
            try:
                for engine in ("hearth", "llama") if (trial + n) % 2 == 0 else ("llama", "hearth"):
                    result = peer.run_worker(pythons[engine], engine, spec, args.peer_python)
                    speed[(engine, n)].append(float(result["decode_tok_s"]))  # type: ignore[arg-type]
            finally:
                stop(busy)
            print(f"trial {trial + 1}, {n} busy: hearth {speed[('hearth', n)][-1]:.1f} / llama.cpp "
                  f"{speed[('llama', n)][-1]:.1f} tok/s", flush=True)  # fmt: skip
    label = f"{info['format']} file"
    print(f"\n| competing processes | Hearth tok/s | llama.cpp tok/s | Hearth / llama.cpp ({label}) | Hearth vs quiet "
          "| llama.cpp vs quiet |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    quiet = levels[0]
    for n in levels:
        hearth, llama = speed[("hearth", n)], speed[("llama", n)]
        pair = statistics.median(h / p for h, p in zip(hearth, llama, strict=True))
        h_share = statistics.median(h / q for h, q in zip(hearth, speed[("hearth", quiet)], strict=True))
        p_share = statistics.median(p / q for p, q in zip(llama, speed[("llama", quiet)], strict=True))
        print(f"| {n} | {statistics.median(hearth):.1f} | {statistics.median(llama):.1f} | {pair:.2f}× | "
              f"{h_share:.0%} | {p_share:.0%} |")  # fmt: skip
    print(f"\nmedians of {args.trials} trials; ratios paired per trial; load average now {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
