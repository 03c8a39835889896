"""Decode beside busy cores: Hearth's runtimes (their adaptive teams, as users run them: `auto`, the torch-free one the
app picks; `torch`, HEARTH_RUNTIME=torch) and llama.cpp on the same GGUF, quiet and with 1 and 2 competing CPU-bound
processes, interleaved, with paired ratios.

    python bench/contention.py [--model FILE.gguf] [--trials 3] [--tokens 64] [--busy 0,1,2] [--apart]
                               [--runtime auto,torch]

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
RUNTIMES = ("auto", "torch")
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
        "--runtime", default="auto", help="Hearth's runtimes, comma-separated: auto (as the app), torch (default: auto)"
    )
    parser.add_argument("--peer-python", default=str(peer.DEFAULT_PEER_PYTHON))
    args = parser.parse_args(argv)
    runtimes = [value.strip() for value in args.runtime.split(",") if value.strip()]
    if not runtimes or any(runtime not in RUNTIMES for runtime in runtimes):
        print(f"contention: --runtime takes {', '.join(RUNTIMES)}, comma-separated (got {args.runtime!r})",
              file=sys.stderr)  # fmt: skip
        return 2
    if not Path(args.peer_python).exists():
        print(f"contention: {args.peer_python} not found; run `make bench-peer` once", file=sys.stderr)
        return 2
    levels = [int(value) for value in args.busy.split(",")]
    short, long, model_path, folder = peer.prompts(16, args.model)
    gguf = peer.peer_gguf(model_path, folder, args.peer_python, os.cpu_count() or 2)
    info = gguf_files.describe(gguf)
    spec: dict[str, object] = {
        "model": args.model, "context": 1024, "short_ids": short, "long_ids": long, "tokens": args.tokens,
        "threads": os.cpu_count() or 2, "quant": "auto", "adaptive": True, "gguf": str(gguf),
        "gguf_bytes_per_token": info["decode_bytes_per_token"],
    }  # fmt: skip
    print(f"machine: {llama_build.machine_line()}")
    where = "each in a session of its own" if args.apart else "in the bench's session"
    print(f"model: {gguf.name} ({info['format']} file); {args.tokens} new tokens; competing: {levels} processes, "
          f"{where}; scheduler autogroup: {autogroup()}; Hearth's runtimes: {', '.join(runtimes)}")  # fmt: skip
    print(f"llama.cpp build: {worker_process.llama_build_line(args.peer_python)}")
    engines = [*(f"hearth:{runtime}" for runtime in runtimes), "llama"]
    speed: dict[tuple[str, int], list[float]] = {(engine, n): [] for engine in engines for n in levels}
    for trial in range(args.trials):
        order = levels[trial % len(levels) :] + levels[: trial % len(levels)]
        for n in order:
            busy = competitors(n, args.apart)
            try:
                turn = (trial + n) % len(engines)  # each engine goes first in turn
                for engine in engines[turn:] + engines[:turn]:
                    kind, _, runtime = engine.partition(":")
                    python = args.peer_python if kind == "llama" else sys.executable
                    result = peer.run_worker(python, kind, {**spec, "runtime": runtime or "auto"}, args.peer_python)
                    speed[(engine, n)].append(float(result["decode_tok_s"]))  # type: ignore[arg-type]
            finally:
                stop(busy)
            said = " / ".join(f"{engine} {speed[(engine, n)][-1]:.1f}" for engine in engines)
            print(f"trial {trial + 1}, {n} busy: {said} tok/s", flush=True)
    print()
    print("\n".join(table(speed, levels, runtimes, f"{info['format']} file")))
    print(f"\nmedians of {args.trials} trials; ratios paired per trial; load average now {os.getloadavg()[0]:.1f}")
    return 0


def table(speed: dict[tuple[str, int], list[float]], levels: list[int], runtimes: list[str], label: str) -> list[str]:
    """The Markdown table: per runtime and contention level, medians and ratios paired per trial (the first level is
    the quiet one each share is of)."""
    lines = [
        f"| Hearth's runtime | competing processes | Hearth tok/s | llama.cpp tok/s | Hearth / llama.cpp ({label}) "
        "| Hearth vs quiet | llama.cpp vs quiet |",
        "|---|---|---|---|---|---|---|",
    ]
    quiet = levels[0]
    for runtime in runtimes:
        for n in levels:
            hearth, llama = speed[(f"hearth:{runtime}", n)], speed[("llama", n)]
            pair = statistics.median(h / p for h, p in zip(hearth, llama, strict=True))
            h_share = statistics.median(h / q for h, q in zip(hearth, speed[(f"hearth:{runtime}", quiet)], strict=True))
            p_share = statistics.median(p / q for p, q in zip(llama, speed[("llama", quiet)], strict=True))
            lines.append(f"| {runtime} | {n} | {statistics.median(hearth):.1f} | {statistics.median(llama):.1f} | "
                         f"{pair:.2f}× | {h_share:.0%} | {p_share:.0%} |")  # fmt: skip
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
