"""What this CPU can do, read at run time (never the build machine's): its architecture and feature flags in
/proc/cpuinfo's names, from the OS where it lists them and from the CPUID instruction where it does not (Windows).
The kernel library's choice of build (app.core.fastpath.kernel) and the memory planner ask here."""

from __future__ import annotations

import logging
import platform
import subprocess
import sys

from app.core.fastpath import cpuid

log = logging.getLogger(__name__)


def machine_arch() -> str:
    """x86_64 or aarch64 (the names the manifest uses), or the platform's own name for anything else."""
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


# macOS sysctl names -> /proc/cpuinfo names (the manifest's vocabulary)
_DARWIN_FLAGS = {
    "sse4.2": "sse4_2", "avx1.0": "avx", "avx2": "avx2", "fma": "fma", "f16c": "f16c", "bmi1": "bmi1", "bmi2": "bmi2",
    "movbe": "movbe", "lzcnt": "abm", "avx512f": "avx512f", "avx512bw": "avx512bw", "avx512vl": "avx512vl",
    "avx512dq": "avx512dq", "avx512cd": "avx512cd", "avx512vnni": "avx512_vnni", "avx512bf16": "avx512_bf16",
}  # fmt: skip
# torch's own CPU probe, the last resort where the OS lists no flags and CPUID's generated code may not run. Every
# AVX2 CPU also has FMA, F16C, BMI1/2, LZCNT and MOVBE (Haswell and Zen onwards); torch's AVX512 level means
# F/BW/VL/DQ, not VNNI or BF16 (so that CPU takes the AVX2 library), and it names no AVX-VNNI.
_TORCH_LEVELS = {
    "AVX2": ("avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "abm", "movbe"),
    "AVX512": ("avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "abm", "movbe", "avx512f", "avx512bw", "avx512vl",
               "avx512dq", "avx512cd"),
}  # fmt: skip


def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags, read at run time (never the build machine's), in /proc/cpuinfo's `flags` (x86) or
    `Features` (ARM) names: from that file on Linux, sysctl on macOS, the CPUID instruction elsewhere (Windows)."""
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
                for line in handle:
                    key, _, value = line.partition(":")
                    if key.strip() in ("flags", "Features"):
                        return frozenset(value.split())
        except OSError:
            pass
    elif sys.platform == "darwin":
        return _darwin_flags()
    if machine_arch() == "x86_64":
        found = cpuid.cpuid_flags()  # no flag list from the OS (Windows): ask the CPU
        if not isinstance(found, str):
            return found
        log.info("%s; CPU flags from torch's probe instead", found)
        try:
            import torch  # only where generated code may not run; the torch-free runtime has none there

            level = str(torch.backends.cpu.get_cpu_capability())
        except (ImportError, AttributeError, RuntimeError):
            level = ""
        return frozenset(_TORCH_LEVELS.get(level, ()))
    return frozenset()


def expected_q4_kernel() -> int:
    """The Q4_1 kernel a build here reports (hearth_q4_kernel: 4 AVX-512 VNNI, 3 AVX2, 2 NEON dot product, 1 NEON,
    0 scalar), read from this CPU's flags without building it (the memory planner asks)."""
    flags = cpu_flags()
    if machine_arch() == "x86_64":
        if {"avx2", "fma"} <= flags:
            return 4 if {"avx512f", "avx512bw", "avx512_vnni", "f16c"} <= flags else 3
        return 0
    if machine_arch() == "aarch64":
        return 2 if "asimddp" in flags else 1
    return 0


def _darwin_flags() -> frozenset[str]:
    if machine_arch() == "aarch64":  # NEON is always there; DotProd from M1 on
        flags = {"asimd"}
        names = ["hw.optional.arm.FEAT_DotProd"]
    else:
        flags, names = set(), ["machdep.cpu.features", "machdep.cpu.leaf7_features"]
    try:
        output = subprocess.run(["sysctl", *names], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return frozenset(flags)
    for line in output.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "hw.optional.arm.FEAT_DotProd" and value.strip() == "1":
            flags.add("asimddp")
        elif name.strip().startswith("machdep.cpu"):
            flags.update(_DARWIN_FLAGS[word] for word in value.lower().split() if word in _DARWIN_FLAGS)
    return frozenset(flags)


def machine_identity() -> str:
    """What -march=native depends on: the CPU model and its feature flags."""
    text = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith(("model name", "flags", "Features")):
                    text += line
                if line.strip() == "":
                    break
    except OSError:
        pass
    if not text:  # no /proc/cpuinfo (Windows, macOS): the flags this process reads another way
        text = " ".join(sorted(cpu_flags()))
    return f"{platform.machine()}|{platform.processor()}|{text}"
