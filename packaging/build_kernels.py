"""Build the fused decode kernel (app/core/fastpath/native/hearth_decode.c) once per CPU target, for installs that
have no C compiler (most Windows machines, many Macs).

    python packaging/build_kernels.py [--out DIR] [--targets x86-64-avx2,...] [--cc gcc]

Writes one shared library per target this machine's compilers can build, with fixed -march flags (never -march=
native: the library runs on the user's CPU, not this one), and `manifest.json`: each library's sha256, size and the
CPU flags (/proc/cpuinfo names) it needs, best target first. At run time app/core/fastpath/native.py picks the first
entry this CPU has every flag for, checks the file's sha256 against the manifest before ctypes loads it, and falls
back to compiling from source when none fits. hearth.spec runs this for the bundle; for a wheel, run it before
`python -m build` (the libraries are package data).

OpenMP: the libraries link libgomp.so.1 (GCC's OpenMP runtime); torch's Linux wheels ship that same soname and load
it first, so no system libgomp is needed. A Windows DLL (mingw-w64's gcc) links libgomp and winpthreads into itself:
a user's PC has neither, and Python loads a library's dependencies only from beside it and the system folders.
`--platform win32` on Linux cross-builds the Windows x86-64 libraries with Debian's mingw-w64
(x86_64-w64-mingw32-gcc-posix); the Windows package's runner builds them natively.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO / "app" / "core" / "fastpath" / "native" / "hearth_decode.c"
DEFAULT_OUT = SOURCE.parent / "prebuilt"
MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1  # app.core.fastpath.native.MANIFEST_FORMAT reads this
COMMON_FLAGS = ("-O3", "-shared", "-fPIC", "-std=c11", "-ffp-contract=off")
OPENMP_FLAG = "-fopenmp"  # Apple's clang lacks it: there the library is built single-threaded (manifest "openmp")
NO_AMX_FLAG = "-DHEARTH_NO_AMX"  # the kernel without its AMX code (app.core.fastpath.kernel.NO_AMX_FLAG)
WINDOWS_LINK = ("-static",)  # libgomp and winpthreads inside the DLL (app.core.fastpath.kernel.WINDOWS_LINK)
WINDOWS_CROSS_COMPILER = "x86_64-w64-mingw32-gcc-posix"  # the posix-threads flavour: the one with libgomp
# x86-64-v3: what every AVX2 CPU (Haswell, Zen 1 and later) has; Linux's /proc/cpuinfo names.
AVX2_FLAGS = ("avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "abm", "movbe")
# No BF16: the kernel has no bf16 instruction (its bf16 caches convert with shifts), and asking for it shut out the
# AVX-512 VNNI CPUs without it (Cascade Lake and Ice Lake servers, Ice Lake, Tiger Lake and Rocket Lake laptops).
AVX512_FLAGS = (*AVX2_FLAGS, "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd", "avx512_vnni")
# AVX-VNNI: vpdpbusd on 256-bit vectors without AVX-512 (Intel Alder Lake and later client cores, Zen 5).
AVXVNNI_FLAGS = (*AVX2_FLAGS, "avx_vnni")


@dataclass(frozen=True)
class Target:
    name: str
    arch: str  # platform.machine(), normalized as native.machine_arch() does
    march: tuple[str, ...]
    requires: tuple[str, ...]


# Best first: the run time takes the first one the CPU can run.
TARGETS = (
    Target("x86-64-avx512", "x86_64", ("-march=x86-64-v4", "-mavx512vnni"), AVX512_FLAGS),
    Target("x86-64-avxvnni", "x86_64", ("-march=x86-64-v3", "-mavxvnni"), AVXVNNI_FLAGS),
    Target("x86-64-avx2", "x86_64", ("-march=x86-64-v3",), AVX2_FLAGS),
    Target("arm64-dotprod", "aarch64", ("-march=armv8.2-a+dotprod",), ("asimd", "asimddp")),
    Target("arm64", "aarch64", ("-march=armv8-a",), ("asimd",)),
)  # fmt: skip
CROSS_COMPILERS = {"aarch64": "aarch64-linux-gnu-gcc", "x86_64": "x86_64-linux-gnu-gcc"}


def host_arch() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def suffix(platform_name: str = sys.platform) -> str:
    return ".dll" if platform_name == "win32" else ".dylib" if platform_name == "darwin" else ".so"


def compiler_for(arch: str, cc: str | None, platform_name: str = sys.platform) -> str | None:
    """The host compiler for the host's architecture; Debian's cross gcc for the other one, or for Windows x86-64
    (Linux only)."""
    if platform_name != sys.platform:
        if sys.platform.startswith("linux") and platform_name == "win32" and arch == "x86_64":
            return shutil.which(cc or WINDOWS_CROSS_COMPILER)
        return None
    if arch == host_arch():
        for candidate in (cc or os.environ.get("CC", ""), "cc", "gcc", "clang"):
            if candidate and (found := shutil.which(candidate)):
                return found
        return None
    if sys.platform.startswith("linux") and arch in CROSS_COMPILERS:
        return shutil.which(CROSS_COMPILERS[arch])
    return None


def source_abi() -> int:
    match = re.search(r"^#define HEARTH_ABI (\d+)", SOURCE.read_text(encoding="utf-8"), re.MULTILINE)
    if match is None:
        raise SystemExit(f"build_kernels: no HEARTH_ABI in {SOURCE}")
    return int(match.group(1))


def sha256_file(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def build_target(
    target: Target, compiler: str, out: Path, platform_name: str = sys.platform
) -> dict[str, object] | str:
    """Compile one target for `platform_name` into `out`; its manifest entry, or why it was skipped."""
    base = [*COMMON_FLAGS, *target.march, *(WINDOWS_LINK if platform_name == "win32" else ())]
    name = f"hearth_decode-{target.name}{suffix(platform_name)}"
    partial = out / f"{name}.partial"
    # OpenMP first; then, for x86, without the AMX code too (an assembler older than binutils 2.36 lacks it)
    amx_choices = ([], [NO_AMX_FLAG]) if target.arch == "x86_64" else ([],)
    choices = [[*base, *openmp, *amx] for openmp in ([OPENMP_FLAG], []) for amx in amx_choices]
    for flags in choices:
        command = [compiler, *flags, "-o", str(partial), str(SOURCE), "-lm"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if result.returncode == 0:
            break
        partial.unlink(missing_ok=True)
    else:
        first = next((line for line in result.stderr.splitlines() if "error" in line), result.stderr.strip()[:200])
        return f"{compiler} failed: {first.strip()}"
    final = out / name
    os.replace(partial, final)
    return {
        "target": target.name,
        "arch": target.arch,
        "platform": platform_name,
        "file": name,
        "sha256": sha256_file(final),
        "bytes": final.stat().st_size,
        "requires": sorted(set(target.requires)),
        "openmp": OPENMP_FLAG in flags,
        "compiler": Path(compiler).name,
        "flags": flags,
    }


def build(
    out: Path = DEFAULT_OUT, names: list[str] | None = None, cc: str | None = None, platform_name: str = sys.platform
) -> dict[str, object]:
    """Build every target this machine can for `platform_name` (this OS, or win32 from Linux), replace `out`'s
    libraries and manifest; returns the manifest, with the targets that were not built and why under "skipped"."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("hearth_decode-*"):
        old.unlink()
    libraries: list[dict[str, object]] = []
    skipped: dict[str, str] = {}
    wanted = [target for target in TARGETS if not names or target.name in names]
    compilers = {target.name: compiler_for(target.arch, cc, platform_name) for target in wanted}
    # The targets compile side by side, a core each (one compile is single-threaded); the manifest keeps TARGETS' order.
    with ThreadPoolExecutor(max_workers=max(1, min(len(wanted), os.cpu_count() or 1))) as pool:
        entries = {
            target.name: pool.submit(build_target, target, compiler, out, platform_name)
            for target in wanted
            if (compiler := compilers[target.name]) is not None
        }
        for target in wanted:
            if target.name not in entries:
                skipped[target.name] = f"no compiler for {target.arch} {platform_name} on this {host_arch()} machine"
                continue
            entry = entries[target.name].result()
            if isinstance(entry, str):
                skipped[target.name] = entry
            else:
                libraries.append(entry)
    manifest = {
        "format": MANIFEST_FORMAT,
        "abi": source_abi(),
        "source_sha256": sha256_file(SOURCE),
        "libraries": libraries,
        "skipped": skipped,
    }
    partial = out / f"{MANIFEST_NAME}.partial"
    partial.write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    os.replace(partial, out / MANIFEST_NAME)
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--targets", default="", help=f"comma-separated subset of {[t.name for t in TARGETS]}")
    parser.add_argument("--cc", default=None, help="the host C compiler (default: CC, cc, gcc, clang)")
    parser.add_argument(
        "--platform", default=sys.platform, choices=sorted({sys.platform, "win32"}),
        help="the OS the libraries are for (win32 from Linux: mingw-w64's gcc)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    names = [name for name in args.targets.split(",") if name]
    unknown = set(names) - {t.name for t in TARGETS}
    if unknown:
        parser.error(f"unknown targets {sorted(unknown)}")
    if args.platform != sys.platform and args.out.resolve() == DEFAULT_OUT.resolve():
        parser.error(f"a build for {args.platform} needs its own --out folder: {DEFAULT_OUT} holds this OS's libraries")
    manifest = build(args.out, names, args.cc, args.platform)
    for entry in manifest["libraries"]:  # type: ignore[attr-defined]
        print(f"built {entry['target']}: {entry['file']} ({entry['bytes']} bytes, needs {' '.join(entry['requires'])})")
    for name, why in manifest["skipped"].items():  # type: ignore[attr-defined]
        print(f"skipped {name}: {why}")
    return 0 if manifest["libraries"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
