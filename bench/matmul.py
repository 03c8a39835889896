"""Per matrix: GMAC/s of the GGUF kernel on a file's own matrices, for each kernel build this CPU runs, side by side.

    python bench/matmul.py [--model FILE.gguf] [--inputs 1,16,256] [--targets amx,avx512,avxvnni,avx2] [--rounds 3]

The matrices are layer 0's, one per distinct block type and shape (a Q4_K_M file: Q4_K and Q6_K, square and MLP
shapes), laid out as the runtime lays them out (`hearth_gg_repack_x16`: 16 rows at a time where the build has that
layout) and multiplied by `hearth_gg_matmul` with every core: one input is a decode step, many a prompt. Inputs are
random normal floats (speed does not depend on the values), at 8 bits (the MLP's inputs) and at 15 bits (`precise`:
the attention's and the head's). Each target runs in a process of its own, chosen by HEARTH_KERNEL_TARGET (the switch
users have); the process says which library it loaded, and a target that loads the same library as one before it
(this CPU lacks what it needs) is left out. Targets alternate round by round and each cell keeps its best time, so
the machine's noise falls on every target alike. Printed: the machine, the file, the library per target, and per
matrix and input count each target's GMAC/s (with one input also the rate it reads the matrix at, GB/s: decode is
bound by it) and its ratio to the first target.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import gguf_files, llama_build, worker_process  # noqa: E402

DEFAULT_TARGETS = {"x86_64": "amx,avx512,avxvnni,avx2", "aarch64": "dotprod,neon"}
COLD_BYTES = 512 << 20  # more than any CPU's last-level cache
FILE_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")


def default_model() -> Path:
    """The 1B Q4_K_M file bench/build_gguf_models.py makes, else the embedded default model."""
    built = ROOT / ".cache" / "gguf-models" / "llama-3.2-1b.Q4_K_M.gguf"
    if built.exists():
        return built
    from app.core.models.model_source import default_model_gguf

    return default_model_gguf()


def worker_matmul(spec: dict[str, Any]) -> dict[str, Any]:
    """One process, one library (spec's target, as HEARTH_KERNEL_TARGET): best seconds per (matrix, inputs, bits)."""
    import numpy as np

    from app.core.fastpath import blocks
    from app.core.fastpath.kernel import TARGET_ENV, load_library, q4_kernel_name
    from app.core.models.gguf_meta import read_gguf_header

    os.environ[TARGET_ENV] = str(spec["target"])  # read when the library loads, as a user's setting is
    library = load_library()
    if isinstance(library, str):
        return {"error": library}
    lib = library.lib
    blocks.declare(lib)
    path = Path(spec["model"])
    header = read_gguf_header(path)
    data = np.memmap(path, dtype=np.uint8, mode="r")
    rng = np.random.default_rng(0)
    threads = int(spec["threads"])
    times: dict[str, float] = {}
    seen: set[tuple[int, int, int]] = set()
    for tensor in header.tensors:
        if not tensor.name.startswith("blk.0.") or len(tensor.shape) != 2:
            continue
        if blocks.type_name(tensor.kind) not in FILE_TYPES:
            continue
        rows, cols = tensor.shape
        if (tensor.kind, rows, cols) in seen:
            continue
        seen.add((tensor.kind, rows, cols))
        start = header.data_start + tensor.offset
        weights = np.array(data[start : start + rows * blocks.row_bytes(tensor.kind, cols)])
        laid = blocks.repack_x16(lib, tensor.kind, weights, rows, cols, threads)
        kind, matrix = laid if laid is not None else (tensor.kind, weights)
        # A decode step reads its matrices from memory, never from a cache that held them a moment ago: one input
        # runs over copies that together pass COLD_BYTES (timed as a pass, per call), more inputs over one copy
        cold = 1 in spec["inputs"]
        copies = [matrix] + [matrix.copy() for _ in range(COLD_BYTES // matrix.nbytes if cold else 0)]
        for count in spec["inputs"]:
            x = rng.standard_normal((count, cols)).astype(np.float32)
            run = copies if count == 1 else [matrix]
            for precise in (False, True):
                blocks.matmul(lib, kind, matrix, rows, x, threads, precise=precise)  # warm: pages, buffers
                best = float("inf")
                for _ in range(int(spec["reps"])):
                    began = time.perf_counter()
                    for copy in run:
                        blocks.matmul(lib, kind, copy, rows, x, threads, precise=precise)
                    best = min(best, (time.perf_counter() - began) / len(run))
                name = f"{blocks.type_name(tensor.kind)} {rows}x{cols}{' x16' if laid is not None else ''}"
                times[json.dumps([name, rows * cols, matrix.nbytes, count, 15 if precise else 8])] = best
    amx = int(lib.hearth_amx(-1)) == 1
    described = f"{library.origin} ({q4_kernel_name(lib)}{', prompts on AMX tiles' if amx else ''})"
    return {"library": described, "times": times}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=["matmul"], help=argparse.SUPPRESS)
    parser.add_argument("--model", help="a GGUF file (default: the 1B Q4_K_M file if built, else the default model)")
    parser.add_argument("--inputs", default="1,16,256", help="input counts (1: a decode step)")
    parser.add_argument("--targets", help="HEARTH_KERNEL_TARGET values, first is the baseline")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=3, help="timed calls per cell per round")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker_matmul(json.loads(sys.stdin.read()))))
        return 0
    from app.core.fastpath.cpu import machine_arch

    model = Path(args.model) if args.model else default_model()
    targets = (args.targets or DEFAULT_TARGETS.get(machine_arch(), "")).split(",")
    spec = {
        "model": str(model), "inputs": [int(n) for n in args.inputs.split(",")], "reps": args.reps,
        "threads": args.threads,
    }  # fmt: skip
    print(f"machine: {llama_build.machine_line()}; {args.threads} threads")
    print(f"model: {model} ({gguf_files.file_format(model)})")
    best: dict[str, dict[str, float]] = {}
    libraries: dict[str, str] = {}
    for _ in range(args.rounds):
        for target in targets:
            result = worker_process.run_worker(sys.executable, Path(__file__), "matmul", {**spec, "target": target})
            if "error" in result:
                print(f"{target}: {result['error']}")
                return 1
            libraries[target] = str(result["library"])
            cells = best.setdefault(target, {})
            for key, seconds in dict(result["times"]).items():
                cells[key] = min(cells.get(key, float("inf")), float(seconds))
        # a target that loaded the same library as an earlier one measures nothing new: dropped after round one
        targets = [t for i, t in enumerate(targets) if libraries[t] not in [libraries[u] for u in targets[:i]]]
    for target in targets:
        print(f"{target}: {libraries[target]}")
    print()
    header = "| matrix | inputs | bits | " + " | ".join(f"{t} GMAC/s" for t in targets) + " |"
    print(header)
    print("|" + "---|" * (3 + len(targets)))
    for key in best[targets[0]]:
        name, macs, size, count, bits = json.loads(key)
        cells = []
        for target in targets:
            rate = macs * count / best[target][key] / 1e9
            ratio = best[targets[0]][key] / best[target][key]
            read = f", {size / best[target][key] / 1e9:.1f} GB/s" if count == 1 else ""  # decode: a read-rate figure
            cells.append(f"{rate:.1f}{read}" + ("" if target == targets[0] else f" ({ratio:.2f}×)"))
        print(f"| {name} | {count} | {bits} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
