"""What checking the decode path's derived files against their sha256 adds to a warm start (docs/speed.md).

    python bench/verify_cost.py [--trials 7]

Warm start = the kernel library and the packed copies are already in the cache dir. Times, per trial (medians
printed): the kernel library's sha256 (prebuilt or compiled), and reading the default model's packed fused-q4 copy
as the app does now (read once, hash, parse the bytes) against the unchecked read it replaced (safetensors'
load_file). Run it on a quiet machine: the numbers are milliseconds.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from safetensors.torch import load_file

from app.core.engines.loader import load_model
from app.core.fastpath import integrity, kernel, packed_cache, select


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=7)
    args = parser.parse_args()
    loaded = load_model(None, quantization="bf16", device="cpu")
    choice = select.apply_decode_path(loaded.model, "cpu", "bf16", folder=loaded.folder)  # warms both caches
    library = kernel.load_library()
    assert isinstance(library, kernel.NativeLibrary) and choice.fused is not None, choice.note
    copy = packed_cache.packed_cache_file(loaded.folder, "bf16", kind="decode-fused-q4")
    assert copy is not None and copy.exists()
    rows: dict[str, list[float]] = {
        "library sha256": [],
        "copy: unchecked": [],
        "copy: checked": [],
    }
    for _ in range(args.trials):
        started = time.perf_counter()
        integrity.sha256_file(Path(library.path))
        rows["library sha256"].append(time.perf_counter() - started)
        started = time.perf_counter()
        load_file(copy)
        rows["copy: unchecked"].append(time.perf_counter() - started)
        started = time.perf_counter()
        select._read_cache(copy, [])
        rows["copy: checked"].append(time.perf_counter() - started)
    print(
        f"library {library.origin}: {Path(library.path).stat().st_size / 1024:.0f} KiB; "
        f"copy {copy.stat().st_size / 2**20:.1f} MiB"
    )
    for name, seconds in rows.items():
        print(f"{name:16s} median {statistics.median(seconds) * 1000:7.1f} ms  (min {min(seconds) * 1000:.1f})")
    added = statistics.median(rows["copy: checked"]) - statistics.median(rows["copy: unchecked"])
    print(f"added to a warm start: {(added + statistics.median(rows['library sha256'])) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
