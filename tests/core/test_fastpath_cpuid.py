"""CPU flags from the CPUID instruction (app/core/fastpath/cpuid.py): the way Windows picks its kernel library.

The generated code runs for real wherever this is an x86-64 process; on Linux its answer is checked against the
kernel's own /proc/cpuinfo. The Windows page allocator runs here too, on a stand-in for kernel32 that hands out the
same kind of pages through libc, so the bytes that run on Windows are the ones tested.
"""

from __future__ import annotations

import mmap
import platform
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from app.core.fastpath import cpu, cpuid

X86_64 = platform.machine().lower() in ("x86_64", "amd64")
LINUX = sys.platform.startswith("linux")
needs_x86 = pytest.mark.skipif(not X86_64, reason="CPUID is an x86-64 instruction")

# the flags the prebuilt manifest's targets require, and AMX (the AVX-512 build's prefill)
SELECTION_FLAGS = {
    "avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "abm", "movbe", "avx512f", "avx512bw", "avx512vl", "avx512dq",
    "avx512cd", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16",
}  # fmt: skip


def bits(*positions: int) -> int:
    return sum(1 << position for position in positions)


# CPUID answers of three CPU classes (only the bits FLAGS reads; leaf 1 ECX bit 27: OSXSAVE)
HASWELL_LIKE = {
    (1, 0): (0, 0, bits(9, 12, 19, 20, 22, 23, 27, 28, 29), bits(25, 26)),
    (7, 0): (0, bits(3, 5, 8), 0, 0),
    (0x80000001, 0): (0, 0, bits(5), 0),
}
ALDER_LAKE_LIKE = HASWELL_LIKE | {(7, 1): (bits(4), 0, 0, 0)}
ZEN4_LIKE = HASWELL_LIKE | {
    (7, 0): (0, bits(3, 5, 8, 16, 17, 21, 28, 30, 31), bits(1, 6, 11, 12, 14), 0),
    (7, 1): (bits(5), 0, 0, 0),
}
SAPPHIRE_RAPIDS_LIKE = ZEN4_LIKE | {
    (7, 0): (0, ZEN4_LIKE[(7, 0)][1], ZEN4_LIKE[(7, 0)][2], bits(22, 23, 24, 25)),
    (7, 1): (bits(4, 5), 0, 0, 0),
}
XCR0_AVX, XCR0_AVX512, XCR0_AMX = 0x7, 0xE7, 0x600E7

AVX2_TARGET = {"avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "abm", "movbe"}
AVX512_TARGET = AVX2_TARGET | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd", "avx512_vnni", "avx512_bf16"}


@pytest.mark.parametrize(
    ("registers", "xcr0", "has", "lacks"),
    [
        (HASWELL_LIKE, XCR0_AVX, AVX2_TARGET, {"avx_vnni", "avx512f"}),
        (ALDER_LAKE_LIKE, XCR0_AVX, AVX2_TARGET | {"avx_vnni"}, {"avx512f", "avx512_vnni"}),
        (ZEN4_LIKE, XCR0_AVX512, AVX512_TARGET, {"avx_vnni", "amx_tile"}),
        (SAPPHIRE_RAPIDS_LIKE, XCR0_AMX, AVX512_TARGET | {"avx_vnni", "amx_tile", "amx_int8", "amx_bf16"}, set()),
        # the OS saves no AVX-512 state: the CPU has it, the library must not use it
        (ZEN4_LIKE, XCR0_AVX, AVX2_TARGET, {"avx512f", "avx512_vnni", "avx512_bf16"}),
        (SAPPHIRE_RAPIDS_LIKE, XCR0_AVX512, AVX512_TARGET | {"avx_vnni"}, {"amx_tile", "amx_int8"}),
        # no OSXSAVE: no AVX at all, the plain integer flags stay
        (HASWELL_LIKE, None, {"bmi1", "bmi2", "movbe", "abm", "sse2"}, {"avx", "avx2", "fma", "f16c"}),
    ],
    ids=["avx2", "avx-vnni", "avx512", "amx", "os-without-avx512", "os-without-amx", "no-osxsave"],
)
def test_flags_follow_the_cpu_bits_and_the_state_the_os_enabled(
    registers: cpuid.Registers, xcr0: int | None, has: set[str], lacks: set[str]
) -> None:
    flags = cpuid.flags_from_registers(registers, xcr0)
    assert has <= flags, has - flags
    assert not lacks & flags, lacks & flags


def test_each_flag_is_one_bit_of_one_register() -> None:
    for flag in cpuid.FLAGS:
        registers = {(flag.leaf, flag.subleaf): tuple(bits(flag.bit) if r == flag.register else 0 for r in range(4))}
        assert cpuid.flags_from_registers(registers, XCR0_AMX) == {flag.name}, flag  # type: ignore[arg-type]
    assert len({flag.name for flag in cpuid.FLAGS}) == len(cpuid.FLAGS)


@needs_x86
def test_the_cpu_answers_as_the_linux_kernel_lists_it() -> None:
    found = cpuid.cpuid_flags()
    assert not isinstance(found, str), found
    assert {"sse2"} <= found  # every x86-64 CPU
    if not LINUX:
        pytest.skip("no /proc/cpuinfo to compare with")
    listed = re.search(r"^flags\s*:(.*)$", Path("/proc/cpuinfo").read_text(), re.MULTILINE)
    assert listed is not None
    wanted = SELECTION_FLAGS
    assert found & wanted == frozenset(listed.group(1).split()) & wanted


@needs_x86
def test_xcr0_is_read_only_where_the_os_enabled_xsave() -> None:
    registers, xcr0 = cpuid.read_registers()
    osxsave = registers[(1, 0)][cpuid.ECX] >> cpuid.OSXSAVE_BIT & 1
    assert (xcr0 is not None) == bool(osxsave)
    if xcr0 is not None:
        assert xcr0 & 0x3 == 0x3  # x87 and SSE state are always on
    assert registers[(0, 0)][cpuid.EAX] >= 1  # the highest leaf


class LibcAsKernel32:
    """VirtualAlloc, VirtualProtect and VirtualFree, as Windows defines them, on libc's mmap, mprotect and munmap."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.protections: list[int] = []
        self.libc = cpuid.posix_memory()
        self.VirtualAlloc = self._function(self._alloc)
        self.VirtualProtect = self._function(self._protect)
        self.VirtualFree = self._function(self._free)

    @staticmethod
    def _function(body: Any) -> Any:
        class Function:  # takes restype/argtypes as a ctypes function does
            def __call__(self, *args: Any) -> Any:
                return body(*args)

        return Function()

    def _alloc(self, address: Any, size: int, kind: int, protection: int) -> int:
        assert (address, kind, protection) == (None, 0x3000, 0x04)  # commit + reserve, read-write
        self.calls.append("alloc")
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
        return int(self.libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, flags, -1, 0))

    def _protect(self, address: int, size: int, protection: int, old: Any) -> int:
        self.calls.append("protect")
        self.protections.append(protection)
        native = {0x20: mmap.PROT_READ | mmap.PROT_EXEC}[protection]
        return int(self.libc.mprotect(address, size, native) == 0)

    def _free(self, address: int, size: int, kind: int) -> int:
        assert (size, kind) == (0, 0x8000)  # MEM_RELEASE takes size 0
        self.calls.append("free")
        return int(self.libc.munmap(address, 4096) == 0)


@needs_x86
@pytest.mark.skipif(sys.platform == "win32", reason="the stand-in is built on libc")
def test_the_windows_page_runs_the_same_code_with_the_same_answers() -> None:
    fake = LibcAsKernel32()
    on_windows = cpuid.read_registers(lambda code: cpuid._windows_code(code, fake))
    assert on_windows == cpuid.read_registers()
    assert fake.calls == ["alloc", "protect", "free"] and fake.protections == [0x20]  # never writable and executable


@needs_x86
def test_a_page_the_system_refuses_is_reported_not_run() -> None:
    class Refused(LibcAsKernel32):
        def _protect(self, address: int, size: int, protection: int, old: Any) -> int:
            self.calls.append("protect")
            return 0

    fake = Refused()
    with pytest.raises(cpuid.CpuidUnavailable, match="refused to run generated code"):
        cpuid.read_registers(lambda code: cpuid._windows_code(code, fake))
    assert fake.calls == ["alloc", "protect", "free"]  # the page goes back


def test_a_process_that_is_not_x86_64_never_runs_the_code(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpuid, "_is_x86_64", lambda: False)
    with pytest.raises(cpuid.CpuidUnavailable, match="not an x86-64 process"):
        cpuid.read_registers()


# -- cpu.cpu_flags on a system without a flag list ------------------------------------------------------------
def test_windows_takes_the_flags_from_cpuid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu.sys, "platform", "win32")
    monkeypatch.setattr(cpu, "machine_arch", lambda: "x86_64")
    flags = cpuid.flags_from_registers(ALDER_LAKE_LIKE, XCR0_AVX)
    monkeypatch.setattr(cpu.cpuid, "cpuid_flags", lambda: flags)
    assert cpu.cpu_flags() == flags and "avx_vnni" in flags  # torch's probe could not name it


def test_without_cpuid_windows_falls_back_to_torchs_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(cpu.sys, "platform", "win32")
    monkeypatch.setattr(cpu, "machine_arch", lambda: "x86_64")
    monkeypatch.setattr(cpu.cpuid, "cpuid_flags", lambda: "CPUID could not run: VirtualAlloc refused a page")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert cpu.cpu_flags() == frozenset(cpu._TORCH_LEVELS["AVX2"])


def test_a_compiled_kernel_is_keyed_to_the_cpu_flags_where_there_is_no_proc_cpuinfo(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_open = open

    def no_proc(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path) == "/proc/cpuinfo":
            raise FileNotFoundError(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(cpu, "open", no_proc, raising=False)
    identities = []
    for registers in (HASWELL_LIKE, ALDER_LAKE_LIKE):
        flags = cpuid.flags_from_registers(registers, XCR0_AVX)
        monkeypatch.setattr(cpu, "cpu_flags", lambda flags=flags: flags)
        identities.append(cpu.machine_identity())
    assert "avx_vnni" in identities[1] and identities[0] != identities[1]  # a -march=native build is not shared
