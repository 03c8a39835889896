"""`make gpu-wheels`: download bench/gpu_wheels.txt's wheels for the GPU image (or, for the rehearsal, this Python)
into a folder, and trim bitsandbytes to the libraries the check loads.

    python bench/gpu_wheels.py --out .gpu-wheels                   # CPython 3.12, manylinux x86-64 (the GPU image)
    python bench/gpu_wheels.py --out DIR --for-this-python         # the same versions for this interpreter

bitsandbytes' wheel holds one library per CUDA and ROCm version (43 MB); the trimmed copy keeps the CUDA 13.0 one
(the image's torch is built for CUDA 13.0) and the CPU one (the rehearsal), and its RECORD lists just those files.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / "gpu_wheels.txt"
IMAGE_PYTHON = "3.12"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64")
BNB_KEEP = ("libbitsandbytes_cuda130.so", "libbitsandbytes_cpu.so")
TRAVEL_LIMIT = 64 << 20  # what travels with the working tree to the GPU machine, all of it


def download(out: Path, this_python: bool) -> None:
    target = [] if this_python else ["--python-version", IMAGE_PYTHON, "--implementation", "cp"]
    for platform in () if this_python else PLATFORMS:
        target += ["--platform", platform]
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "-d", str(out)]
    subprocess.run([*command, *target, "-r", str(REQUIREMENTS)], check=True)


def trim_bitsandbytes(out: Path) -> None:
    for wheel in out.glob("bitsandbytes-*.whl"):
        with zipfile.ZipFile(wheel) as source:
            names = [n for n in source.namelist() if not n.endswith(".so") or n.rsplit("/", 1)[-1] in BNB_KEEP]
            if len(names) == len(source.namelist()):
                continue  # trimmed already
            trimmed = wheel.with_suffix(".partial")
            with zipfile.ZipFile(trimmed, "w", zipfile.ZIP_DEFLATED) as target:
                for name in names:
                    data = source.read(name)
                    if name.endswith(".dist-info/RECORD"):
                        kept = set(names)
                        lines = data.decode().splitlines()
                        data = ("\n".join(line for line in lines if line.split(",", 1)[0] in kept) + "\n").encode()
                    target.writestr(source.getinfo(name), data)
        trimmed.replace(wheel)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--for-this-python", action="store_true", help="this interpreter's wheels (the rehearsal)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    download(args.out, args.for_this_python)
    trim_bitsandbytes(args.out)
    total = sum(p.stat().st_size for p in args.out.glob("*.whl"))
    print(f"gpu-wheels: {len(list(args.out.glob('*.whl')))} wheels, {total / 2**20:.1f} MiB in {args.out}")
    if total > TRAVEL_LIMIT // 2:
        print(f"gpu-wheels: over half of the {TRAVEL_LIMIT >> 20} MiB that travel to the GPU machine", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
