"""Warm start of `hearth chat` on a GGUF file: from launch to the reply's first token, fresh processes, this tree
against another revision (or alone), interleaved.

    python bench/warm_start.py [--model FILE.gguf] [--runs 8] [--against REV]

Each side runs `hearth chat --model FILE -t 0 --max-tokens 1 --no-response-cache Hello` from its own tree, with its
own cache folder (HEARTH_CACHE_DIR, seeded with this cache's compiled kernels). One run per side warms it (the
tokenizer's copies, the saved prefetch choice, and the bytecode where it is missing) and is not counted. Then the
sides alternate, run by run; each run is timed from before its process starts to the first byte of the reply on
stdout (the command prints each token as it comes), and to its exit. Prints each side's median and range, and the
median of the paired ratios (REV ÷ this tree), with the machine named. Issue 29's goal: ≤ 2 s to the first token
for a 1B Q4_K_M file on the 2-core CI machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.core.models.model_source import default_model_gguf  # noqa: E402
from app.core.storage.paths import cache_dir  # noqa: E402
from bench import gguf_files, llama_build  # noqa: E402

LAUNCH = "import sys; from app.cli import main; sys.argv[0] = 'hearth'; sys.exit(main())"


def chat_command(model: Path) -> list[str]:
    options = ["--model", str(model), "-t", "0", "--max-tokens", "1", "--no-response-cache"]
    return [sys.executable, "-c", LAUNCH, "chat", *options, "Hello"]


def side_environment(tree: Path, folder: Path) -> dict[str, str]:
    """The side's own cache folder (seeded with the kernels compiled here); its bytecode is written beside its sources
    by the warming run where it is missing."""
    cache = folder / "cache"
    kernels = cache_dir() / "native"
    if kernels.is_dir() and not (cache / "native").exists():
        shutil.copytree(kernels, cache / "native")
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPATH=str(tree), HEARTH_CACHE_DIR=str(cache))
    return env


def timed_run(tree: Path, model: Path, env: dict[str, str]) -> tuple[float, float]:
    """(seconds to the reply's first byte on stdout, seconds to exit) of one fresh `hearth chat`."""
    started = time.perf_counter()
    process = subprocess.Popen(chat_command(model), cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None
    first = process.stdout.read(1)
    first_token = time.perf_counter() - started
    process.stdout.read()  # the rest of the reply
    errors = process.stderr.read().decode(errors="replace")
    if process.wait() != 0 or not first:
        raise SystemExit(f"hearth chat failed in {tree} (exit {process.returncode}): {errors.strip()[-800:]}")
    return first_token, time.perf_counter() - started


def worktree(rev: str, folder: Path) -> Path:
    tree = folder / "tree"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), rev], check=True, capture_output=True
    )
    return tree


def summary(name: str, times: list[float]) -> str:
    return f"{name}: median {statistics.median(times):.2f} s (range {min(times):.2f}-{max(times):.2f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="a GGUF file (default: the built-in model)")
    parser.add_argument("--runs", type=int, default=8, help="counted runs per side (default 8)")
    parser.add_argument("--against", default="", help="a git revision to alternate with (e.g. HEAD~3)")
    args = parser.parse_args(argv)
    model = (args.model or default_model_gguf()).resolve()
    print(f"machine: {llama_build.machine_line()}")
    print(f"model: {model.name} ({gguf_files.file_format(model)}, {model.stat().st_size / 2**20:,.0f} MiB)")
    with tempfile.TemporaryDirectory(prefix="hearth-warm-start-") as scratch:
        sides = {"this tree": ROOT}
        if args.against:
            sides[args.against] = worktree(args.against, Path(scratch) / "against")
        try:
            envs = {
                name: side_environment(tree, Path(scratch) / f"side-{index}")
                for index, (name, tree) in enumerate(sides.items())
            }
            for name, tree in sides.items():
                timed_run(tree, model, envs[name])  # warms the side's caches and bytecode: not counted
            first: dict[str, list[float]] = {name: [] for name in sides}
            total: dict[str, list[float]] = {name: [] for name in sides}
            for run in range(args.runs):
                order = list(sides) if run % 2 == 0 else list(reversed(sides))
                for name in order:
                    token_s, exit_s = timed_run(sides[name], model, envs[name])
                    first[name].append(token_s)
                    total[name].append(exit_s)
                print(f"run {run + 1}: " + ", ".join(f"{name} {first[name][-1]:.2f} s" for name in sides), flush=True)
            for name in sides:
                exit_s = statistics.median(total[name])
                print(f"to the first token, {summary(name, first[name])}; to exit, median {exit_s:.2f} s")
            if args.against:
                ratios = [old / new for old, new in zip(first[args.against], first["this tree"], strict=True)]
                print(
                    f"{args.against} ÷ this tree, paired per run: median {statistics.median(ratios):.2f}x "
                    f"(range {min(ratios):.2f}-{max(ratios):.2f})"
                )
        finally:
            if args.against:
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(sides[args.against])],
                    capture_output=True,
                )
                subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], capture_output=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
