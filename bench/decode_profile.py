"""Where the fused decode step's time goes, per phase, on thread 0 (a `-DHEARTH_PROFILE` build of hearth_decode.c).

    python bench/decode_profile.py [--model .cache/models/random-tinyllama-1b] [--quant auto] [--steps 64]
                                   [--define PREFETCH_BYTES=4096] [--cflag=-mno-avx512f]

Phases (hearth_step): QKV matrix (+ RoPE and the KV write), attention, O matrix, gate/up matrix (+ SiLU), down
matrix, final norm + lm_head, and the barriers (thread 0 waiting for the others: imbalance, or a core another process
took). Per token, with each phase's effective read rate for the matrices (packed bytes / time).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TQDM_DISABLE", "1")

PHASES = ("qkv", "attention", "o", "barriers", "gate/up", "down", "lm_head")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--quant", default="auto")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=64, help="positions in the cache before the measured steps")
    parser.add_argument(
        "--define", action="append", default=[], help="a C macro for the build, e.g. PREFETCH_BYTES=4096 (repeatable)"
    )
    parser.add_argument(
        "--cflag", action="append", default=[], help="a compiler flag, e.g. -mno-avx512f for the AVX2 kernel"
    )
    args = parser.parse_args(argv)
    os.environ["HEARTH_KERNEL"] = "compile"
    import torch

    from app.core.engines.engine import Engine, KVState
    from app.core.engines.loader import load_model
    from app.core.fastpath import kernel

    kernel.EXTRA_FLAGS = ("-DHEARTH_PROFILE", *(f"-D{define}" for define in args.define), *args.cflag)
    engine = Engine(load_model(args.model, quantization=args.quant, device="cpu"))
    fused = engine.path.fused
    if fused is None:
        print(f"no fused step: {engine.decode_path_note}")
        return 1
    lib = fused.native.lib
    lib.hearth_profile.argtypes = [ctypes.c_void_p]
    seconds = (ctypes.c_double * 8)()
    kv = KVState()
    ids = torch.randint(100, 40000, (args.prompt,), generator=torch.Generator().manual_seed(0)).tolist()
    with torch.inference_mode():
        engine._forward(ids, kv)
        for _ in range(4):  # warm-up
            engine._forward([int(ids[-1])], kv, decode_step=True)
        lib.hearth_profile(ctypes.addressof(seconds))
        started = time.perf_counter()
        for step in range(args.steps):
            engine._forward([100 + step], kv, decode_step=True)
        wall = (time.perf_counter() - started) / args.steps
    lib.hearth_profile(ctypes.addressof(seconds))
    per_token = [s / args.steps for s in seconds[: len(PHASES)]]
    q4_kernel = kernel.Q4_KERNELS.get(int(lib.hearth_q4_kernel()), "?")
    print(
        f"{engine.decode_path} ({q4_kernel}): {1 / wall:.1f} tok/s, {wall * 1e3:.2f} ms a token "
        f"(thread 0's phases sum to {sum(per_token) * 1e3:.2f} ms)"
    )
    for name, value in zip(PHASES, per_token, strict=True):
        print(f"  {name:<10} {value * 1e3:8.3f} ms  {value / sum(per_token):6.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
