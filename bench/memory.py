"""Memory planner vs measured: weights, KV cache at several lengths and the prefill peak, per model and quantization.

Estimated = app.core.memory.planner.plan_memory before loading. Measured = the loaded model's own tensors
(parameters, buffers, bnb quant_state), the DynamicCache's key/value tensors after a chunked prefill, and the
prefill transient: on the CPU the growth of the process's peak RSS (VmHWM, reset through /proc/self/clear_refs)
over one 512-token chunk minus the KV it added; on CUDA torch.cuda.max_memory_allocated.
`--calibrate` also prints the CPU runtime constant (anonymous RSS growth over load_model beyond the weights).

Run: .venv/bin/python bench/memory.py [--device cpu|cuda] [--models default,llama,...] [--quants nf4,bf16]
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import platform
import sys
import tempfile
from datetime import date
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TQDM_DISABLE", "1")

import psutil
import torch
from transformers import DynamicCache

from app.core.engines.loader import load_model
from app.core.memory.accounting import kv_bytes_by_device, measured_weights_by_device
from app.core.memory.planner import plan_memory
from app.core.memory.types import format_bytes
from app.core.memory.weights import PREFILL_CHUNK
from bench.gguf_files import default_model_folder
from tests.helpers.tiny_models import ARCHITECTURES, build_tiny_model

MiB = 2**20


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _reset_peak(device: str) -> int:
    """Reset the peak counter; returns the current level it is measured from."""
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return int(torch.cuda.memory_allocated())
    # Hand freed arena memory back first, or the transient hides in memory glibc already holds (it did: 0 B).
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")
    return _status_kib("VmRSS")


def _peak(device: str) -> int:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_allocated())
    return _status_kib("VmHWM")


def _forward(model: Any, cache: DynamicCache, tokens: int, device: str) -> None:
    ids = (torch.arange(tokens, device=device).remainder(1000) + 10).unsqueeze(0)
    with torch.inference_mode():
        for start in range(0, tokens, PREFILL_CHUNK):
            model(input_ids=ids[:, start : start + PREFILL_CHUNK], cache=cache, use_cache=True, logits_to_keep=1)


def _err(estimate: int, measured: int) -> str:
    return f"{(estimate - measured) / measured * 100:+.2f} %" if measured else "n/a"


def bench_one(name: str, folder: Path, quant: str, device: str, kv_lengths: list[int]) -> list[list[str]]:
    plans = {n: plan_memory(folder, quantization=quant, context=n, device=device, free_bytes=2**50) for n in kv_lengths}
    gc.collect()
    anon_before = _status_kib("RssAnon")
    loaded = load_model(str(folder), quantization=quant, device=device, ignore_fit=True)
    gc.collect()
    anon_growth = _status_kib("RssAnon") - anon_before
    rows: list[list[str]] = []
    for tokens in kv_lengths:
        cache = DynamicCache(config=loaded.model.config)
        _forward(loaded.model, cache, tokens, device)
        measured_kv = sum(kv_bytes_by_device(cache).values())
        estimate = plans[tokens].kv_bytes
        rows.append([name, quant, f"KV @ {tokens}", format_bytes(estimate), format_bytes(measured_kv)])
        rows[-1].append(_err(estimate, measured_kv))
        del cache
    # Weights after the first forward: bnb repacks 4-bit layers then on AVX512-BF16 CPUs (app.core.models.bnb_cpu).
    measured_weights = sum(measured_weights_by_device(loaded.model).values())
    first = plans[kv_lengths[0]]
    weights_row = [name, quant, "weights", format_bytes(first.weights_bytes), format_bytes(measured_weights)]
    rows.insert(0, [*weights_row, _err(first.weights_bytes, measured_weights)])
    # Prefill peak: one full chunk on top of a chunk already cached (the engine's steady state).
    cache = DynamicCache(config=loaded.model.config)
    _forward(loaded.model, cache, PREFILL_CHUNK, device)
    kv_before = sum(kv_bytes_by_device(cache).values())
    base = _reset_peak(device)
    _forward(loaded.model, cache, PREFILL_CHUNK, device)
    transient = _peak(device) - base - (sum(kv_bytes_by_device(cache).values()) - kv_before)
    plan = plan_memory(folder, quantization=quant, context=2 * PREFILL_CHUNK, device=device, free_bytes=2**50)
    parts = plan.overhead
    estimate = sum(
        v
        for k, v in parts.items()
        if k not in ("runtime", "cuda_context", "allocator_slack", "load_staging", "decode_copies")
    )
    rows.append([name, quant, "prefill peak", format_bytes(estimate), format_bytes(max(transient, 0))])
    rows[-1].append(_err(estimate, transient) if transient > 0 else "n/a")
    if not device.startswith("cuda"):
        rows.append([name, quant, "load slack (calibration)", "", format_bytes(anon_growth - measured_weights), ""])
    del loaded, cache
    gc.collect()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", default="default," + ",".join(ARCHITECTURES))
    parser.add_argument("--quants", default="nf4,nf4-nodq,int8,bf16")
    parser.add_argument("--calibrate", action="store_true", help="also print the CPU load slack rows")
    parser.add_argument("--default-lengths", default="128,1024,2048", help="KV lengths for the default model")
    args = parser.parse_args()
    device = "cuda:0" if args.device == "cuda" else args.device
    default_folder = default_model_folder()
    rows: list[list[str]] = []
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.models.split(","):
            if name == "default":
                folder, label = default_folder, "SmolLM2-135M"
                lengths = [int(n) for n in args.default_lengths.split(",")]
            else:
                folder = build_tiny_model(name, Path(scratch) / name, default_folder)
                lengths, label = [16, 100, 1000], f"tiny {name}"
            for quant in args.quants.split(","):
                rows.extend(bench_one(label, folder, quant, device, lengths))
                print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    if not args.calibrate:
        rows = [row for row in rows if not row[2].startswith("load slack")]
    cpu = platform.processor() or platform.machine()
    memory = psutil.virtual_memory().total / 2**30
    where = torch.cuda.get_device_name() if device.startswith("cuda") else f"{os.cpu_count()} CPU cores ({cpu})"
    print(f"Measured {date.today()} on {where}, {memory:.0f} GiB RAM, torch {torch.__version__}, device {device}.\n")
    print("| model | quant | what | estimated | measured | error |")
    print("|---|---|---|---:|---:|---:|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
