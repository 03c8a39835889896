"""The fused decode kernel's AArch64 NEON code, and its Windows build, against its x86-64 Linux build, on fixed
inputs (no ARM machine and no Windows here).

tests/core/native_harness/harness.c builds tiny random Llama models from fixed seeds (both weight formats, fp32 and
bf16 KV caches and embeddings, biases, GQA, 1 and 2 OpenMP threads, short and >512-position attention), runs
hearth_step and prints every logit as a hex float. For x86-64 Linux it is built once with -DHARNESS_LIBRARY and runs
on kernel libraries: the one this test run loaded (compiled here at -O3 -march=native, or prebuilt: the reference)
and the run's -O1 build of each x86 target (tests/helpers/x86_builds.py, which the block tests load too). It is
cross-built for AArch64 twice: -march=armv8.2-a+dotprod (int8 dots with sdot) under
`qemu-aarch64 -cpu max`, and -march=armv8-a (widening multiplies) under `-cpu cortex-a53`, a core without DotProd,
so that build can't lean on it. Correctness only: qemu says nothing about speed on real ARM hardware. The harness
packs its weights with C ports of native.py's packers; a third test checks they give native.py's bytes. `harness
prefill` runs hearth_q4_prefill (prefill straight from the Q4_1 records) on one matrix for the same comparison.
Each run also prints hearth_gg_matmul's products on every GGUF block type (Q4_0 to Q6_K, the torch-free runtime's
matrices), in the file's row layout and the 16-row one, with 8-bit and 15-bit inputs, and the GGUF forward's gated
activation (hearth_silu_times: no libm, the same bits on every build).
The Windows builds (AVX2, and AVX-512 VNNI where this CPU has it) come from mingw-w64's gcc, the compiler of the
Windows package's CI runner, and run under Wine: Windows' calling convention, its C runtime and libm, its threads
under libgomp, on this CPU's own instructions.

Bound: per step, max |ARM - x86| <= 1e-6 × max |x86 logit|. The NEON code mirrors the AVX2 code lane for lane
(same float lanes, same horizontal-sum order, FMA in the same places; int8 dot products are exact on both), and no
other float op is fused (-ffp-contract=off), so the builds are meant to agree bit for bit: they do here (Debian 12,
gcc 12; clang 14 too, also for -mcpu=apple-m1). The slack admits last-bit differences that reach the logits without
crossing an int8 rounding step, e.g. another sum order (a reordered horizontal sum measured 3e-7) or an ULP from
another libm's expf/sinf. Anything that moves one activation across a rounding step shows as ~1e-3 (unfusing one
FMA measured 5e-3) and fails on purpose: the builds no longer compute the same thing. A wrong lane or nibble
measured > 1.
"""

from __future__ import annotations

import math
import os
import platform
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch

from app.core.fastpath import cpu, kernel
from app.core.fastpath.int8 import quantize_rows
from app.core.fastpath.native import quantize_q4_blocks
from app.core.fastpath.packed import dequantize_q4, interleave_q4, interleave_rows
from tests.helpers.build_kernels import load_build_kernels
from tests.helpers.x86_builds import FLAGS, KERNEL_DIR, X86_BUILDS, x86_compiler

REPO_ROOT = Path(__file__).resolve().parents[2]
HARNESS = REPO_ROOT / "tests" / "core" / "native_harness" / "harness.c"
CROSS_CC = "aarch64-linux-gnu-gcc"
QEMU = "qemu-aarch64"
INSTALL_HINT = "Debian/Ubuntu: `make cross-tools` (apt-get install gcc-aarch64-linux-gnu qemu-user)"
WINDOWS_CC = load_build_kernels().WINDOWS_CROSS_COMPILER  # the posix-threads flavour: it has libgomp
WINDOWS_HINT = "Debian/Ubuntu: `make cross-tools` (apt-get install gcc-mingw-w64-x86-64-posix wine64)"
RELATIVE_BOUND = 1e-6
VARIANTS, STEPS = 5, 11  # harness.c's VARIANTS and POSITIONS
# The CPU qemu emulates per build: `max` has DotProd; a Cortex-A53 (Armv8.0) faults on sdot.
ARM_BUILDS = {"dotprod": ("armv8.2-a+dotprod", "max"), "plain": ("armv8-a", "cortex-a53")}

# The Windows libraries a user's CPU may get (packaging/build_kernels.py's x86 targets, built there).
WINDOWS_BUILDS = {build: X86_BUILDS[build] for build in ("avx512-vnni", "avx2")}

Logits = dict[tuple[int, int, int], list[float]]  # (variant, position, token) -> logits
# (GGUF type, 15-bit inputs, "row" or "x16" layout) -> hearth_gg_matmul's outputs; None: the build has no such layout
Products = dict[tuple[int, int, str], list[float] | None]
GGUF_TYPES = (2, 3, 6, 7, 8, 12, 13, 14)  # harness.c's print_gguf: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K


def harness_command(compiler: str, flags: list[str], target: Path, libraries: tuple[str, ...] = ()) -> list[str]:
    """`flags` after FLAGS: a later -O wins."""
    return [compiler, *FLAGS, *flags, f"-I{KERNEL_DIR}", "-o", str(target), str(HARNESS), "-lm", *libraries]


def compile_harness(compiler: str, flags: list[str], target: Path, libraries: tuple[str, ...] = ()) -> None:
    command = harness_command(compiler, flags, target, libraries)
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stderr}"


class HarnessRun(NamedTuple):
    flags: dict[str, int]  # the build's header: simd, openmp, dotprod, q4
    logits: Logits
    products: Products
    activation: list[float]  # hearth_silu_times on the harness's fixed values


def library_env(library: Path | None) -> dict[str, str] | None:
    """The environment that points the x86-64 harness at a kernel library (HARNESS_LIBRARY builds), else None."""
    return None if library is None else {**os.environ, "HEARTH_HARNESS_LIBRARY": str(library)}


def run_harness(command: list[str], library: Path | None = None) -> HarnessRun:
    """The build's header, its logits per step and its GGUF products (`library`: the kernel the x86-64 harness runs)."""
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False, env=library_env(library))
    assert result.returncode == 0, f"{' '.join(command)} exited {result.returncode}:\n{result.stderr[-2000:]}"
    header, *lines = result.stdout.splitlines()
    words = header.split()
    flags = {words[i]: int(words[i + 1]) for i in range(0, len(words), 2)}
    logits: Logits = {}
    products: Products = {}
    activation: list[float] = []
    for line in lines:
        if line.startswith("silu "):
            activation = [float.fromhex(v) for v in line.split()[1:]]
            continue
        if line.startswith("gg "):
            _, kind, precise, layout, *values = line.split()
            assert values and values[0] != "error", line
            key = (int(kind), int(precise), layout)
            products[key] = None if values == ["none"] else [float.fromhex(v) for v in values]
            continue
        variant, position, token, *values = line.split()
        logits[(int(variant), int(position), int(token))] = [float.fromhex(v) for v in values]
    assert len(products) == 2 * 2 * len(GGUF_TYPES), sorted(products)
    assert activation, "the harness printed no activation"
    return HarnessRun(flags, logits, products, activation)


def within_bound(
    found: Mapping[Any, list[float] | None], reference: Mapping[Any, list[float] | None], label: str
) -> float:
    """Asserts that each of `found`'s vectors is within RELATIVE_BOUND times the largest |value| of `reference`'s
    vector of the same key; returns the worst ratio."""
    worst = 0.0
    for key, expected in reference.items():
        got = found[key]
        assert expected is not None and got is not None, f"{label} {key}"
        scale = max(abs(v) for v in expected)
        difference = max(abs(a - b) for a, b in zip(got, expected, strict=True))
        assert difference <= RELATIVE_BOUND * scale, f"{label} {key}: {difference / scale}"
        worst = max(worst, difference / scale)
    return worst


@pytest.fixture(scope="module")
def x86_harness(tmp_path_factory: pytest.TempPathFactory, harness_builds: Path) -> Path:
    """The harness for x86-64 Linux built with -DHARNESS_LIBRARY: it runs the kernel library HEARTH_HARNESS_LIBRARY
    names (the run's own, a build of x86_kernel_builds), so no x86 build of the kernel is compiled again for it. The
    cross builds compile beside it, on the cores pytest leaves idle; arm_build and windows_build find them made, or
    build them again and report why not."""
    compiler = x86_compiler()
    if compiler is None:
        pytest.skip(f"the x86-64 harness needs an x86-64 CPU and gcc or cc; this machine is {platform.machine()}")
    binary = tmp_path_factory.mktemp("harness") / "harness-x86_64"
    builds = []
    cross = shutil.which(CROSS_CC)
    if cross is not None:
        builds += [(cross, *arm_harness_build(build, harness_builds)) for build in ARM_BUILDS]
    windows = shutil.which(WINDOWS_CC)
    if windows is not None:
        builds += [
            (windows, *windows_harness_build(build, harness_builds))
            for build in WINDOWS_BUILDS
            if WINDOWS_BUILDS[build][1] <= cpu.cpu_flags()
        ]
    beside = [
        subprocess.Popen(harness_command(*build), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for build in builds
    ]
    try:
        compile_harness(compiler, ["-march=x86-64", "-DHARNESS_LIBRARY"], binary, ("-ldl",))
    finally:
        for process in beside:
            process.wait(timeout=300)
    return binary


@pytest.fixture(scope="module")
def x86_logits(x86_harness: Path, run_library: kernel.NativeLibrary) -> Logits:
    """The reference: the harness on the library this test run loaded."""
    flags, logits, _, _ = run_harness([str(x86_harness)], run_library.path)
    if not flags["simd"]:
        pytest.skip("this CPU lacks AVX2+FMA, so the x86-64 reference would run the scalar loops")
    assert len(logits) == VARIANTS * STEPS
    assert all(math.isfinite(v) for values in logits.values() for v in values)
    assert all(max(values) - min(values) > 1.0 for values in logits.values())  # real spreads, not zeros
    return logits


@pytest.fixture(scope="module")
def cross_tools(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    compiler, qemu = shutil.which(CROSS_CC), shutil.which(QEMU)
    if compiler is None or qemu is None:
        pytest.skip(f"{CROSS_CC if compiler is None else QEMU} is not installed; {INSTALL_HINT}")
    # A toolchain without the arm64 libc/libgomp can't link anything: a missing install, not a kernel failure.
    probe = tmp_path_factory.mktemp("probe")
    (probe / "probe.c").write_text("#include <omp.h>\nint main(void) { return omp_get_max_threads() > 0 ? 0 : 1; }\n")
    result = subprocess.run(
        [compiler, "-static", "-fopenmp", "-o", str(probe / "probe"), str(probe / "probe.c")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        pytest.skip(f"{CROSS_CC} can't link a static OpenMP program ({result.stderr.strip()[:200]}); {INSTALL_HINT}")
    return compiler, qemu


@pytest.mark.parametrize("build", list(ARM_BUILDS))
def test_the_aarch64_build_computes_the_harness_builds_logits_and_gguf_products(
    build: str,
    x86_logits: Logits,
    cross_tools: tuple[str, str],
    harness_builds: Path,
    x86_harness: Path,
    x86_kernel_builds: dict[str, Path],
) -> None:
    compiler, qemu = cross_tools
    _, cpu = ARM_BUILDS[build]
    binary = arm_build(build, compiler, harness_builds)
    flags, logits, products, activation = run_harness([qemu, "-cpu", cpu, str(binary)])

    # hearth_simd() is what native.py checks before using a library: NEON counts, as AVX2+FMA does on x86.
    assert flags == {"simd": 1, "openmp": 1, "dotprod": int(build == "dotprod"), "q4": 2 if build == "dotprod" else 1}
    assert logits.keys() == x86_logits.keys()  # the same steps on the same tokens
    worst = within_bound(logits, x86_logits, f"{build}, step (variant, pos, token)")
    print(f"{build}: max |ARM - x86| / max |logit| = {worst:.3g} over {len(logits)} steps")
    # The GGUF block products (the torch-free runtime's): the row layout mirrors AVX2's lanes but sums them in another
    # order (measured 3e-7 of the largest output); the 16-row layout (DotProd builds: sdot by lane, 8 rows at a time)
    # takes the x86 loops' exact integer sums and their float steps in their order, so it gives their bits; the build
    # without DotProd has none
    avx2_run = linux_run("avx2", x86_harness, x86_kernel_builds)
    avx2 = avx2_run.products
    # the GGUF forward's activation: NEON's 4 lanes and the tail take exp256's operations in its order, no libm
    assert [a.hex() for a in activation] == [a.hex() for a in avx2_run.activation]
    x16 = {key: value for key, value in avx2.items() if key[2] == "x16"}
    assert x16 and all(value is not None for value in x16.values())
    if build == "dotprod":
        assert [key for key, value in x16.items() if products[key] != value] == []
    else:
        assert all(products[key] is None for key in x16)
    worst = within_bound(products, {key: v for key, v in avx2.items() if key[2] == "row"}, f"{build}, GGUF type")
    print(f"{build}: GGUF products, max |ARM - AVX2| / max |output| = {worst:.3g}")


def test_the_harness_packs_weights_exactly_as_native_py_does(x86_harness: Path) -> None:
    """The harness's C packers (what the ARM comparison runs on) give native.py's bytes for the same floats."""
    result = subprocess.run([str(x86_harness), "pack"], capture_output=True, text=True, timeout=60, check=True)
    fields = {name: values for name, *values in (line.split() for line in result.stdout.splitlines())}
    rows, cols = (int(v) for v in fields["shape"])
    weight = torch.tensor([float.fromhex(v) for v in fields["weights"]]).reshape(rows, cols)
    assert not weight[0].any() and (weight[1, :32] == 0.125).all()  # the zero row and the constant block
    q, scale = quantize_rows(weight)
    assert q.flatten().tolist() == [int(v) for v in fields["int8_q"]]
    assert scale.tolist() == [float.fromhex(v) for v in fields["int8_s"]]
    nibbles, pairs = quantize_q4_blocks(weight)
    assert nibbles.flatten().tolist() == [int(v) for v in fields["q4_nibbles"]]
    assert pairs.view(torch.uint16).flatten().tolist() == [int(v) for v in fields["q4_pairs"]]
    assert interleave_q4(nibbles, pairs).flatten().tolist() == [int(v) for v in fields["q4_records"]]
    assert interleave_rows(q).flatten().tolist() == [int(v) for v in fields["head_records"]]


# Each cross build's flags and binary: the x86_harness fixture compiles them side by side, the tests find them made
def arm_harness_build(build: str, directory: Path) -> tuple[list[str], Path]:
    # static: libc and libgomp travel inside the binary, so qemu needs no arm64 prefix
    return [f"-march={ARM_BUILDS[build][0]}", "-static"], directory / f"harness-aarch64-{build}"


def windows_harness_build(build: str, directory: Path) -> tuple[list[str], Path]:
    # static: libgomp and winpthreads travel inside the .exe (no Windows PC has them)
    return [*WINDOWS_BUILDS[build][0], "-static"], directory / f"harness-windows-{build}.exe"


def built_once(compiler: str, flags: list[str], binary: Path) -> Path:
    """`binary`, compiled unless the module already has it (the logits and the prefill tests run the same one)."""
    if not binary.is_file():
        compile_harness(compiler, flags, binary)
    return binary


def skip_unless_this_cpu_runs(needs: set[str], build: str) -> None:
    missing = needs - cpu.cpu_flags()
    if missing:
        pytest.skip(f"this CPU lacks {', '.join(sorted(missing))} for the {build} build")


def x86_library(build: str, x86_kernel_builds: dict[str, Path]) -> Path:
    """The kernel library built with X86_BUILDS[build]'s flags, or a skip where this CPU can't run that build."""
    skip_unless_this_cpu_runs(X86_BUILDS[build][1], build)
    return x86_kernel_builds[build]


_linux_runs: dict[tuple[str, Path], HarnessRun] = {}


def linux_run(build: str, harness: Path, x86_kernel_builds: dict[str, Path]) -> HarnessRun:
    """The Linux x86-64 harness on the kernel built with X86_BUILDS[build]'s flags, run once per module."""
    if (build, harness) not in _linux_runs:
        _linux_runs[(build, harness)] = run_harness([str(harness)], x86_library(build, x86_kernel_builds))
    return _linux_runs[(build, harness)]


def arm_build(build: str, compiler: str, directory: Path) -> Path:
    """The harness cross-built with ARM_BUILDS[build]'s -march, once per module."""
    return built_once(compiler, *arm_harness_build(build, directory))


@pytest.fixture(scope="module")
def harness_builds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("harness-builds")


@pytest.mark.parametrize("build", list(X86_BUILDS))
def test_each_x86_build_this_cpu_runs_computes_the_native_builds_logits(
    build: str, x86_logits: Logits, x86_harness: Path, x86_kernel_builds: dict[str, Path]
) -> None:
    """AVX-512 VNNI, AVX2 and the scalar loops on the same inputs: the Q4_1 kernels accumulate each row in its own
    lane in one order, so the SIMD builds agree bit for bit; the scalar build's int8 paths sum in another order
    (measured 3e-7), inside the same bound as ARM."""
    flags, logits, _, activation = linux_run(build, x86_harness, x86_kernel_builds)
    # the GGUF forward's activation: every build the same bits, the scalar loops' included (exp256 mirrored, no libm)
    assert [a.hex() for a in activation] == [
        a.hex() for a in linux_run("avx2", x86_harness, x86_kernel_builds).activation
    ]
    assert flags["q4"] == X86_BUILDS[build][2] and flags["simd"] == int(build != "scalar")
    assert logits.keys() == x86_logits.keys()
    for step, reference in x86_logits.items():
        scale = max(abs(v) for v in reference)
        difference = max(abs(a - b) for a, b in zip(logits[step], reference, strict=True))
        if build != "scalar":
            assert difference == 0.0, f"{build}, step {step}: {difference / scale}"
        assert difference <= RELATIVE_BOUND * scale, f"{build}, step (variant, pos, token) {step}: {difference / scale}"


def run_prefill(command: list[str], library: Path | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`harness prefill`: (weight [rows, cols], x [n, cols], hearth_q4_prefill's y [n, rows])."""
    result = subprocess.run(
        [*command, "prefill"], capture_output=True, text=True, timeout=120, check=False, env=library_env(library)
    )
    assert result.returncode == 0, result.stderr[-2000:]
    fields = {name: values for name, *values in (line.split() for line in result.stdout.splitlines())}
    rows, cols, n = (int(v) for v in fields["shape"])
    assert fields["code"] == ["0"]

    def floats(name: str, *shape: int) -> torch.Tensor:
        return torch.tensor([float.fromhex(v) for v in fields[name]], dtype=torch.float64).reshape(*shape)

    return floats("weights", rows, cols), floats("x", n, cols), floats("y", n, rows)


@pytest.fixture(scope="module")
def native_prefill(x86_harness: Path, run_library: kernel.NativeLibrary) -> torch.Tensor:
    """The run's library's hearth_q4_prefill output, checked against the exact product (15-bit activations: 1e-4)."""
    weight, x, y = run_prefill([str(x86_harness)], run_library.path)
    dense = dequantize_q4(interleave_q4(*quantize_q4_blocks(weight.float())), weight.shape[1]).double()
    exact = x @ dense.t()
    assert float((y - exact).abs().max() / exact.abs().max()) < 1e-4
    return y


@pytest.mark.parametrize("build", list(X86_BUILDS))
def test_each_x86_build_prefills_from_the_records_as_the_native_build(
    build: str, native_prefill: torch.Tensor, x86_harness: Path, x86_kernel_builds: dict[str, Path]
) -> None:
    """hearth_q4_prefill: the AVX-512 and AVX2 tiles sum a block's two int8 halves exactly in int32 and round alike
    (bit for bit the same); the scalar loops run group_block once per half, within float rounding of them."""
    _, _, y = run_prefill([str(x86_harness)], x86_library(build, x86_kernel_builds))
    if build != "scalar":
        assert torch.equal(y, native_prefill)
    assert float((y - native_prefill).abs().max()) <= RELATIVE_BOUND * float(native_prefill.abs().max())


@pytest.mark.parametrize("build", list(ARM_BUILDS))
def test_the_aarch64_build_prefills_from_the_records_as_the_x86_build(
    build: str, cross_tools: tuple[str, str], native_prefill: torch.Tensor, harness_builds: Path
) -> None:
    """ARM keeps the GEMM for prefill (the record kernel is unmeasured there), but its build of hearth_q4_prefill
    (NEON group_block, once per half) must compute the x86 build's product wherever it is turned on."""
    compiler, qemu = cross_tools
    _, cpu = ARM_BUILDS[build]
    binary = arm_build(build, compiler, harness_builds)
    _, _, y = run_prefill([qemu, "-cpu", cpu, str(binary)])
    assert float((y - native_prefill).abs().max()) <= RELATIVE_BOUND * float(native_prefill.abs().max())


def windows_build(build: str, compiler: str, directory: Path) -> Path:
    """The harness built for Windows with WINDOWS_BUILDS[build]'s flags, once per module, or a skip where this CPU
    can't run that build."""
    skip_unless_this_cpu_runs(WINDOWS_BUILDS[build][1], f"Windows {build}")
    return built_once(compiler, *windows_harness_build(build, directory))


@pytest.fixture(scope="module")
def windows_tools(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[str]]:
    """mingw-w64's gcc, and the command that runs a Windows program here (Wine, in a prefix of its own)."""
    compiler = shutil.which(WINDOWS_CC)
    wine = shutil.which("wine64") or shutil.which("wine")
    if wine is None and Path("/usr/lib/wine/wine64").is_file():  # Debian's wine64 without the wine wrapper
        wine = "/usr/lib/wine/wine64"
    if compiler is None or wine is None:
        pytest.skip(f"{WINDOWS_CC if compiler is None else 'wine64'} is not installed; {WINDOWS_HINT}")
    prefix, server = tmp_path_factory.mktemp("wineprefix"), tmp_path_factory.mktemp("wineserver")
    # no .NET or HTML engine to set up in the new prefix (programs of plain C only): 5 s to make it instead of 8;
    # TMPDIR: the server's socket folder in the test's tmp, not a new /tmp/wine-* left behind by every run
    return compiler, [
        "env", f"WINEPREFIX={prefix}", f"TMPDIR={server}", "WINEDEBUG=-all", "WINEDLLOVERRIDES=mscoree,mshtml=d", wine
    ]  # fmt: skip


@pytest.mark.parametrize("build", list(WINDOWS_BUILDS))
def test_the_windows_build_computes_the_harness_builds_logits_and_gguf_products(
    build: str,
    x86_logits: Logits,
    windows_tools: tuple[str, list[str]],
    harness_builds: Path,
    x86_harness: Path,
    x86_kernel_builds: dict[str, Path],
) -> None:
    """Windows' libm rounds some expf/sinf results another way than glibc's (measured: 1e-7 of the largest
    logit), so the bound is ARM's, not bit equality."""
    compiler, wine = windows_tools
    flags, logits, products, activation = run_harness([*wine, str(windows_build(build, compiler, harness_builds))])
    assert flags == {"simd": 1, "openmp": 1, "dotprod": 0, "q4": X86_BUILDS[build][2]}
    assert logits.keys() == x86_logits.keys()
    worst = within_bound(logits, x86_logits, f"Windows {build}, step")
    print(f"Windows {build}: max |Windows - Linux| / max |logit| = {worst:.3g} over {len(logits)} steps")
    # no libm in a block product: every GGUF type, both layouts, the Linux build's bits
    linux = linux_run(build, x86_harness, x86_kernel_builds)
    assert products == linux.products
    assert [a.hex() for a in activation] == [a.hex() for a in linux.activation]  # no libm in it either


LOADER = r"""
#include <windows.h>
#include <stdio.h>
typedef int (*probe)(void);
int main(int argc, char **argv) { /* what ctypes.CDLL does on Windows: LoadLibrary, then the exports */
    HMODULE lib = argc > 1 ? LoadLibraryA(argv[1]) : NULL;
    if (!lib) {
        printf("error %lu\n", (unsigned long)GetLastError());
        return 1;
    }
    probe simd = (probe)GetProcAddress(lib, "hearth_simd"), openmp = (probe)GetProcAddress(lib, "hearth_openmp");
    probe q4 = (probe)GetProcAddress(lib, "hearth_q4_kernel");
    if (!simd || !openmp || !q4) return 3;
    printf("simd %d openmp %d q4 %d\n", simd(), openmp(), q4());
    return 0;
}
"""


def test_the_windows_prebuilt_library_loads_on_a_pc_without_mingw(
    windows_tools: tuple[str, list[str]], tmp_path: Path
) -> None:
    """packaging/build_kernels.py --platform win32 (what the Windows package's runner builds): the DLL carries its
    OpenMP runtime, so Windows loads it where no libgomp-1.dll exists. Built as before (libgomp linked as a DLL),
    LoadLibrary failed with error 126, module not found: the package's kernels never loaded."""
    compiler, wine = windows_tools
    skip_unless_this_cpu_runs(X86_BUILDS["avx2"][1], "Windows avx2")  # Wine runs it on this CPU
    out = tmp_path / "win32"
    manifest = load_build_kernels().build(out, ["x86-64-avx2"], platform_name="win32")
    (entry,) = manifest["libraries"]
    assert entry["platform"] == "win32" and entry["file"] == "hearth_decode-x86-64-avx2.dll" and entry["openmp"]
    objdump = shutil.which("x86_64-w64-mingw32-objdump")  # mingw-w64's binutils, beside its gcc
    if objdump is not None:
        listing = subprocess.run([objdump, "-p", str(out / entry["file"])], capture_output=True, text=True, check=True)
        imports = {line.split(":", 1)[1].strip().lower() for line in listing.stdout.splitlines() if "DLL Name:" in line}
        assert imports <= {"kernel32.dll", "msvcrt.dll"}, imports  # system DLLs only
    (tmp_path / "loader.c").write_text(LOADER)
    subprocess.run(
        [compiler, "-O1", "-o", str(out / "loader.exe"), str(tmp_path / "loader.c")], check=True, capture_output=True
    )
    result = subprocess.run(
        [*wine, str(out / "loader.exe"), entry["file"]], capture_output=True, text=True, timeout=120, cwd=out
    )
    assert result.stdout.split() == ["simd", "1", "openmp", "1", "q4", "3"], (result.stdout, result.stderr[-500:])
