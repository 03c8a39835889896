"""llama.cpp's own tools (llama-quantize, llama-perplexity) built from the llama-cpp-python sdist, for the peer benches.

    python bench/llama_build.py                 # builds them once into .cache/llama-build/ (~10 min on 2 cores)
    python bench/llama_build.py --cmake-args    # prints the ggml flags for this CPU (the Makefile's CMAKE_ARGS)
    python bench/llama_build.py --cmake-args --cap avx2   # the same, as for an AVX2-only CPU (or avxvnni)
    python bench/llama_build.py --describe      # names the build: llama.cpp commit, sdist version, flags

The source is the llama.cpp that llama-cpp-python 0.3.36 vendors (the same code `make bench-peer` compiles into its
Python package), downloaded once with pip and unpacked under .cache/llama-src/. The CPU flags are chosen from this
CPU's feature flags at run time, never `-march=native`: on an Intel Xeon with AMX (a KVM guest) a native build
segfaults in ggml_backend_amx_mul_mat on its first multi-token batch, so AMX is always off and every other x86
extension ggml has an option for is switched on exactly when the CPU reports it (ggml turns SSE4.2, AVX, AVX2, BMI2,
FMA and F16C on by default once GGML_NATIVE is off, so each is written out either way). Other architectures (ARM:
NEON, dotprod, i8mm) have no AMX and keep ggml's native build.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Collection
from pathlib import Path

from app.core.fastpath.cpu import cpu_flags  # the app's own reading: OS lists, else CPUID

ROOT = Path(__file__).resolve().parent.parent
PEER_VERSION = "0.3.36"  # llama-cpp-python, as `make bench-peer` installs it
SDIST = ROOT / ".cache" / f"llama_cpp_python-{PEER_VERSION}.tar.gz"
LLAMA_SOURCE = ROOT / ".cache" / "llama-src"
LLAMA_TREE = LLAMA_SOURCE / f"llama_cpp_python-{PEER_VERSION}" / "vendor" / "llama.cpp"
BUILD_DIR = ROOT / ".cache" / "llama-build"
BUILD_INFO = "hearth-build.json"
TOOLS = ("llama-quantize", "llama-perplexity")
X86_MACHINES = ("x86_64", "amd64", "i386", "i686")

# ggml's x86 options and the CPU flags (Linux /proc/cpuinfo names) each needs; ggml's GGML_AVX512 compiles with
# -mavx512f -mavx512cd -mavx512vl -mavx512dq -mavx512bw, so it needs all five.
AVX512_BASE = ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw")
X86_OPTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("GGML_SSE42", ("sse4_2",)),
    ("GGML_AVX", ("avx",)),
    ("GGML_AVX2", ("avx2",)),
    ("GGML_BMI2", ("bmi2",)),
    ("GGML_FMA", ("fma",)),
    ("GGML_F16C", ("f16c",)),
    ("GGML_AVX_VNNI", ("avx_vnni",)),
    ("GGML_AVX512", AVX512_BASE),
    ("GGML_AVX512_VBMI", (*AVX512_BASE, "avx512vbmi")),
    ("GGML_AVX512_VNNI", (*AVX512_BASE, "avx512_vnni")),
    ("GGML_AVX512_BF16", (*AVX512_BASE, "avx512_bf16")),
)
AMX_OPTIONS = ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16")
# Caps that build llama.cpp as for a lesser x86 CPU on this one, named as Hearth's HEARTH_KERNEL_TARGET names them: an
# AVX2 peer beside Hearth's AVX2 kernel (Zen 2/3, Intel before Alder Lake), an AVX-VNNI one beside its AVX-VNNI kernel
# (Intel's Alder Lake and later client cores: AVX-VNNI, no AVX-512).
CAPS: dict[str, frozenset[str]] = {
    "avx2": frozenset({"sse4_2", "avx", "avx2", "bmi2", "fma", "f16c"}),
    "avxvnni": frozenset({"sse4_2", "avx", "avx2", "bmi2", "fma", "f16c", "avx_vnni"}),
}


def ggml_cpu_args(machine: str | None = None, flags: Collection[str] | None = None, cap: str = "") -> list[str]:
    """The ggml CMake options for a CPU: on x86 every extension set from its flags and AMX off; elsewhere native.
    `cap` (a CAPS name): only the extensions that CPU class has as well."""
    machine = (machine or platform.machine()).lower()
    if machine not in X86_MACHINES:
        return ["-DGGML_NATIVE=ON"]
    flags = set(cpu_flags() if flags is None else flags)
    if cap:
        flags &= CAPS[cap]
    args = ["-DGGML_NATIVE=OFF"]
    args += [f"-D{option}={'ON' if set(needs) <= flags else 'OFF'}" for option, needs in X86_OPTIONS]
    args += [f"-D{option}=OFF" for option in AMX_OPTIONS]
    return args


def cmake_args_line(cap: str = "") -> str:
    """CMAKE_ARGS for llama-cpp-python's pip build: the same CPU options as the tools get (capped to `cap`)."""
    return " ".join(ggml_cpu_args(cap=cap))


def llama_source(python: str = sys.executable) -> Path:
    """The llama.cpp tree from the llama-cpp-python sdist (downloaded once with pip into .cache, unpacked once)."""
    if (LLAMA_TREE / "CMakeLists.txt").exists():
        return LLAMA_TREE
    if not SDIST.exists():
        print(f"llama.cpp: downloading the llama-cpp-python {PEER_VERSION} sdist (its vendored llama.cpp)", flush=True)
        download = [python, "-m", "pip", "download", f"llama-cpp-python=={PEER_VERSION}", "--no-deps"]
        subprocess.run([*download, "--no-binary", ":all:", "-d", str(SDIST.parent)], check=True)
    prefix = f"llama_cpp_python-{PEER_VERSION}/"
    wanted = (prefix + "vendor/llama.cpp/", prefix + ".git/modules/vendor/llama.cpp/HEAD")
    with tarfile.open(SDIST) as archive:
        members = [m for m in archive.getmembers() if m.name.startswith(wanted) and "/.git/objects/" not in m.name]
        archive.extractall(LLAMA_SOURCE, members=members, filter="data")
    return LLAMA_TREE


def llama_commit() -> str:
    """The llama.cpp commit the sdist vendors (its submodule HEAD), short; "unknown" where the sdist lacks it."""
    member = f"llama_cpp_python-{PEER_VERSION}/.git/modules/vendor/llama.cpp/HEAD"
    head = LLAMA_SOURCE / member
    if not head.exists() and SDIST.exists():
        with tarfile.open(SDIST) as archive:
            if member in archive.getnames():
                archive.extractall(LLAMA_SOURCE, members=[archive.getmember(member)], filter="data")
    return head.read_text().strip()[:7] if head.exists() else "unknown"


def configure_args(source: Path) -> list[str]:
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    return [
        "cmake",
        "-S",
        str(source),
        "-B",
        str(BUILD_DIR),
        *generator,
        "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_SERVER=OFF",  # llama-server wants its web UI (a download); the benches need no server
        "-DLLAMA_BUILD_APP=OFF",
        "-DLLAMA_OPENSSL=OFF",
        "-DGGML_CCACHE=OFF",
        f"-DLLAMA_BUILD_COMMIT={llama_commit()}",
        *ggml_cpu_args(),
    ]


def describe(info: dict[str, object]) -> str:
    flags = " ".join(str(a) for a in info["ggml_args"])  # type: ignore[attr-defined]
    return f"llama.cpp {info['commit']} (llama-cpp-python {info['version']} sdist), {flags}"


def build_info() -> dict[str, object] | None:
    path = BUILD_DIR / BUILD_INFO
    return dict(json.loads(path.read_text())) if path.exists() else None


def build_tools(jobs: int | None = None) -> dict[str, object]:
    """Build llama-quantize and llama-perplexity once (rebuilt when this CPU wants other flags); their build info."""
    wanted = {"commit": llama_commit(), "version": PEER_VERSION, "ggml_args": ggml_cpu_args()}
    info = build_info()
    same = info is not None and all(info.get(k) == v for k, v in wanted.items())
    if same and all(Path(str(p)).exists() for p in dict(info["tools"]).values()):  # type: ignore[index, call-overload]
        return info  # type: ignore[return-value]
    source = llama_source()
    if info is not None and info.get("ggml_args") != wanted["ggml_args"]:
        (BUILD_DIR / "CMakeCache.txt").unlink(missing_ok=True)  # a configure with other CPU flags
    print(f"llama.cpp: building {', '.join(TOOLS)} into {BUILD_DIR}", flush=True)
    print("llama.cpp: " + " ".join(wanted["ggml_args"]), flush=True)  # type: ignore[call-overload]
    subprocess.run(configure_args(source), check=True, stdout=subprocess.DEVNULL)
    jobs = jobs or os.cpu_count() or 2
    subprocess.run(["cmake", "--build", str(BUILD_DIR), "--target", *TOOLS, "-j", str(jobs)], check=True)
    info = {**wanted, "tools": {name: str(BUILD_DIR / "bin" / name) for name in TOOLS}, "cpu": cpu_model()}
    (BUILD_DIR / BUILD_INFO).write_text(json.dumps(info, indent=1))
    return info


def tool(name: str) -> Path:
    """The path of one of llama.cpp's tools, built first where it isn't."""
    return Path(str(dict(build_tools()["tools"])[name]))  # type: ignore[call-overload]


# llama.cpp's converter tries SentencePiece first and expects FileNotFoundError when there is no tokenizer.model, but
# imports sentencepiece before looking; without that package installed, look first (BPE tokenizers need no
# sentencepiece), then run the script as its own __main__ with the sdist's gguf-py (the version it was written for).
_CONVERT = """
import os, runpy, sys
script = sys.argv[1]
sys.argv = sys.argv[1:]
here = os.path.dirname(script)
sys.path[:0] = [here, os.path.join(here, "gguf-py")]
import conversion.base as base
original = base.TextModel._create_vocab_sentencepiece
def look_first(self):
    if not (self.dir_model / "tokenizer.model").is_file():
        raise FileNotFoundError(self.dir_model / "tokenizer.model")
    return original(self)
base.TextModel._create_vocab_sentencepiece = look_first
runpy.run_path(script, run_name="__main__")
"""


def convert_to_gguf(folder: Path, out: Path, outtype: str = "bf16") -> Path:
    """A Hugging Face folder converted by llama.cpp's own convert_hf_to_gguf.py (run with this Python: it needs
    torch, transformers and numpy), written to `out` through a partial file."""
    script = llama_source() / "convert_hf_to_gguf.py"
    partial = out.with_name(out.name + ".partial")
    command = [sys.executable, "-c", _CONVERT, str(script), str(folder), "--outtype", outtype]
    command += ["--outfile", str(partial)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        raise SystemExit(f"convert_hf_to_gguf.py failed on {folder}:\n{done.stderr[-3000:]}")
    partial.replace(out)
    return out


def quantize(source: Path, out: Path, kind: str, threads: int | None = None) -> Path:
    """`source` (an F16/BF16/F32 GGUF) quantized to `kind` (Q4_K_M, Q8_0, ...) by llama-quantize, through a
    partial file."""
    partial = out.with_name(out.name + ".partial")
    command = [str(tool("llama-quantize")), str(source), str(partial), kind, str(threads or os.cpu_count() or 2)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        raise SystemExit(f"llama-quantize {kind} failed on {source}:\n{done.stderr[-3000:]}")
    partial.replace(out)
    return out


def cpu_model() -> str:
    """This CPU's model name and core count, as the benches print it."""
    name = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware"):
                name = value.strip()
                break
    elif sys.platform == "darwin":
        found = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True)
        name = found.stdout.strip() or name
    return f"{name}, {os.cpu_count()} logical cores"


def machine_line() -> str:
    """The machine a figure came from: CPU model and the SIMD flags the kernels care about."""
    interesting = ("avx2", "fma", "f16c", *AVX512_BASE, "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile")
    interesting += ("amx_int8", "amx_bf16", "asimd", "asimddp", "i8mm", "sve")
    flags = cpu_flags()
    shown = [f for f in interesting if f in flags]
    return f"{cpu_model()}; {' '.join(shown) or 'no SIMD flags read'}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cmake-args", action="store_true", help="print the ggml CMake options for this CPU")
    parser.add_argument("--describe", action="store_true", help="name the build (building it first if needed)")
    parser.add_argument("--cap", choices=sorted(CAPS), default="", help="with --cmake-args: as for that CPU class")
    parser.add_argument("--jobs", type=int, default=None)
    args = parser.parse_args(argv)
    if args.cmake_args:
        print(cmake_args_line(args.cap))
        return 0
    info = build_tools(args.jobs)
    print(describe(info))
    for name, path in dict(info["tools"]).items():  # type: ignore[call-overload]
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
