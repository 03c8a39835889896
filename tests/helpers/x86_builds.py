"""The kernel built as each shipped x86-64 target this CPU runs, at -O1, once per test run: the block tests load these
libraries, and the native harness (tests/core/native_harness/harness.c, built with -DHARNESS_LIBRARY) runs on them,
instead of each module compiling the same kernel again (~14 s a target on 2 cores)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from app.core.fastpath import cpu

REPO_ROOT = Path(__file__).resolve().parents[2]
KERNEL_DIR = REPO_ROOT / "app" / "core" / "fastpath" / "native"
# As native.py compiles the kernel with gcc: C11, OpenMP. -ffp-contract=off is gcc's default under -std=c11; said
# outright so a clang (which fuses a * b + c within an expression by default) builds the same floats too. The test
# builds take -O1, not native.py's -O3: the same bits (the float order is fixed by the contraction rule and the
# intrinsics, never by the optimiser; tests/core/test_fastpath_blocks.py checks it on the run's own -O3 library) in a
# third of the compile time.
FLAGS = ["-O1", "-std=c11", "-ffp-contract=off", "-fopenmp"]
# The x86-64 builds a user's CPU may get (packaging/build_kernels.py's targets; -march=native picks one of these
# kernels too): flags, the CPU flags the build needs to run, and the Q4_1 kernel it reports (hearth_q4_kernel).
X86_BUILDS = {
    "avx512-vnni": (["-march=x86-64-v4", "-mavx512vnni"], {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"}, 4),
    "avx-vnni": (["-march=x86-64-v3", "-mavxvnni"], {"avx2", "fma", "f16c", "avx_vnni"}, 3),
    "avx2": (["-march=x86-64-v3"], {"avx2", "fma", "f16c"}, 3),
    "scalar": (["-march=x86-64"], set(), 0),
}


def x86_compiler() -> str | None:
    """gcc first (the cross compilers' family), else cc; None on a machine that is not x86-64 or has neither."""
    if cpu.machine_arch() != "x86_64":
        return None
    return shutil.which("gcc") or shutil.which("cc")


def build_x86_libraries(compiler: str, folder: Path) -> dict[str, Path]:
    """Each X86_BUILDS target this CPU runs, as a shared library in `folder`, compiled side by side (a core each)."""
    compiles: dict[str, tuple[Path, subprocess.Popen[str]]] = {}
    for name, (flags, needs, _) in X86_BUILDS.items():
        if needs - cpu.cpu_flags():
            continue
        target = folder / f"hearth-{name}.so"
        command = [compiler, *FLAGS, *flags, "-shared", "-fPIC", "-o", str(target), str(KERNEL_DIR / "hearth_decode.c")]
        compiles[name] = (target, subprocess.Popen([*command, "-lm"], stderr=subprocess.PIPE, text=True))
    built: dict[str, Path] = {}
    for name, (target, process) in compiles.items():
        _, errors = process.communicate(timeout=300)
        assert process.returncode == 0, f"the {name} build failed:\n{errors}"
        built[name] = target
    return built
