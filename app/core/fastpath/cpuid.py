"""This x86-64 CPU's feature flags read from the CPUID instruction itself, for systems that publish no flag list
(Windows, the BSDs, a Linux whose /proc is hidden): a few bytes of machine code run through ctypes, the flags named as
Linux's /proc/cpuinfo names them (the prebuilt manifest's vocabulary).

The code takes no arguments and returns in RAX, so the same bytes run under the Windows and the System V calling
conventions; RBX, which CPUID overwrites and both conventions make the callee keep, is saved and restored. A flag whose
register state the operating system has not enabled (XCR0, read with XGETBV) is left out, as Linux leaves it out: a
CPU with AVX-512 under an OS that does not save its registers cannot run the AVX-512 library.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import struct
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

# (leaf, subleaf) -> (eax, ebx, ecx, edx)
Registers = Mapping[tuple[int, int], tuple[int, int, int, int]]
CodePage = Callable[[bytes], AbstractContextManager[int]]  # code -> its address, runnable while open

EAX, EBX, ECX, EDX = range(4)
_AVX_STATE = 0x6  # XCR0: SSE and the upper halves of the YMM registers
_AVX512_STATE = 0xE0  # opmask, upper halves of ZMM0-15, ZMM16-31
_AMX_STATE = 0x60000  # tile configuration and tile data


@dataclass(frozen=True)
class Flag:
    name: str  # as /proc/cpuinfo names it
    leaf: int
    subleaf: int
    register: int
    bit: int
    state: int = 0  # XCR0 bits the OS must have enabled for it


def _avx(name: str, leaf: int, subleaf: int, register: int, bit: int) -> Flag:
    return Flag(name, leaf, subleaf, register, bit, _AVX_STATE)


def _avx512(name: str, leaf: int, subleaf: int, register: int, bit: int) -> Flag:
    return Flag(name, leaf, subleaf, register, bit, _AVX_STATE | _AVX512_STATE)


FLAGS: tuple[Flag, ...] = (
    Flag("sse", 1, 0, EDX, 25), Flag("sse2", 1, 0, EDX, 26),
    Flag("ssse3", 1, 0, ECX, 9), Flag("fma", 1, 0, ECX, 12, _AVX_STATE), Flag("sse4_1", 1, 0, ECX, 19),
    Flag("sse4_2", 1, 0, ECX, 20), Flag("movbe", 1, 0, ECX, 22), Flag("popcnt", 1, 0, ECX, 23),
    _avx("avx", 1, 0, ECX, 28), _avx("f16c", 1, 0, ECX, 29),
    Flag("bmi1", 7, 0, EBX, 3), _avx("avx2", 7, 0, EBX, 5), Flag("bmi2", 7, 0, EBX, 8),
    _avx512("avx512f", 7, 0, EBX, 16), _avx512("avx512dq", 7, 0, EBX, 17), _avx512("avx512ifma", 7, 0, EBX, 21),
    _avx512("avx512cd", 7, 0, EBX, 28), _avx512("avx512bw", 7, 0, EBX, 30), _avx512("avx512vl", 7, 0, EBX, 31),
    _avx512("avx512vbmi", 7, 0, ECX, 1), _avx512("avx512_vbmi2", 7, 0, ECX, 6),
    _avx512("avx512_vnni", 7, 0, ECX, 11), _avx512("avx512_bitalg", 7, 0, ECX, 12),
    _avx512("avx512_vpopcntdq", 7, 0, ECX, 14), _avx512("avx512_fp16", 7, 0, EDX, 23),
    Flag("amx_bf16", 7, 0, EDX, 22, _AMX_STATE), Flag("amx_tile", 7, 0, EDX, 24, _AMX_STATE),
    Flag("amx_int8", 7, 0, EDX, 25, _AMX_STATE),
    _avx("avx_vnni", 7, 1, EAX, 4), _avx512("avx512_bf16", 7, 1, EAX, 5),
    Flag("abm", 0x80000001, 0, ECX, 5),
)  # fmt: skip
LEAVES = tuple(sorted({(flag.leaf, flag.subleaf) for flag in FLAGS}))
OSXSAVE_BIT = 27  # leaf 1 ECX: the OS enabled XSAVE, so XGETBV may run


def flags_from_registers(registers: Registers, xcr0: int | None) -> frozenset[str]:
    """The flags `registers` (CPUID's answers per leaf; a leaf left out reads as zeros) and `xcr0` (None: the OS has
    not enabled XSAVE, so no AVX state) name."""
    found: set[str] = set()
    for flag in FLAGS:
        value = registers.get((flag.leaf, flag.subleaf), (0, 0, 0, 0))[flag.register]
        if not value >> flag.bit & 1:
            continue
        if flag.state and (xcr0 is None or xcr0 & flag.state != flag.state):
            continue
        found.add(flag.name)
    return frozenset(found)


# -- the machine code --------------------------------------------------------------------------------------------
def _cpuid_code(leaf: int, subleaf: int, high: bool) -> bytes:
    """A function of no arguments returning EAX | EBX << 32 of CPUID(leaf, subleaf), or with `high` ECX | EDX << 32."""
    code = b"\x53" + b"\xb8" + struct.pack("<I", leaf) + b"\xb9" + struct.pack("<I", subleaf) + b"\x0f\xa2"
    if high:
        code += b"\x48\xc1\xe2\x20" + b"\x89\xc8" + b"\x48\x09\xd0"  # shl rdx, 32; mov eax, ecx; or rax, rdx
    else:
        code += b"\x48\xc1\xe3\x20" + b"\x48\x09\xd8"  # shl rbx, 32; or rax, rbx
    return code + b"\x5b\xc3"  # pop rbx; ret


# xor ecx, ecx; xgetbv; shl rdx, 32; mov eax, eax; or rax, rdx; ret: XCR0 as one 64-bit value
_XGETBV_CODE = b"\x31\xc9\x0f\x01\xd0\x48\xc1\xe2\x20\x89\xc0\x48\x09\xd0\xc3"
_SLOT = 32  # bytes per function in the page (each is at most 24)
_PAGE = 4096


class CpuidUnavailable(Exception):
    """Executable memory was refused (a hardened kernel, a sandbox) or this is not an x86-64 process."""


@functools.cache
def posix_memory() -> ctypes.CDLL:
    """libc with mmap, mprotect and munmap declared (POSIX systems)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    return libc


@contextmanager
def _posix_code(code: bytes) -> Iterator[int]:
    """`code` in a private page made read-and-execute after it is written (never writable and executable at once)."""
    libc = posix_memory()
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS  # absent on Windows only
    address = libc.mmap(None, _PAGE, mmap.PROT_READ | mmap.PROT_WRITE, flags, -1, 0)
    if address in (None, ctypes.c_void_p(-1).value):
        raise CpuidUnavailable(f"mmap refused a page (errno {ctypes.get_errno()})")
    try:
        ctypes.memmove(address, code, len(code))
        if libc.mprotect(address, _PAGE, mmap.PROT_READ | mmap.PROT_EXEC) != 0:
            raise CpuidUnavailable(f"the system refused to run generated code (mprotect errno {ctypes.get_errno()})")
        yield address
    finally:
        libc.munmap(address, _PAGE)


@contextmanager
def _windows_code(code: bytes, kernel32: Any = None) -> Iterator[int]:
    """`code` in a page from VirtualAlloc, made execute-read with VirtualProtect after it is written."""
    k32 = kernel32 if kernel32 is not None else ctypes.windll.kernel32  # type: ignore[attr-defined]
    virtual_alloc = k32.VirtualAlloc
    virtual_alloc.restype = ctypes.c_void_p
    virtual_alloc.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint32, ctypes.c_uint32)
    virtual_protect = k32.VirtualProtect
    virtual_protect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint32))
    virtual_free = k32.VirtualFree
    virtual_free.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint32)
    mem_commit_reserve, mem_release, page_readwrite, page_execute_read = 0x3000, 0x8000, 0x04, 0x20
    address = virtual_alloc(None, _PAGE, mem_commit_reserve, page_readwrite)
    if not address:
        raise CpuidUnavailable("VirtualAlloc refused a page")
    try:
        ctypes.memmove(address, code, len(code))
        old = ctypes.c_uint32(0)
        if not virtual_protect(address, _PAGE, page_execute_read, ctypes.byref(old)):
            raise CpuidUnavailable("the system refused to run generated code (VirtualProtect)")
        yield address
    finally:
        virtual_free(address, 0, mem_release)


def _page(leaves: tuple[tuple[int, int], ...]) -> bytes:
    """Slot 0: XGETBV; then two functions per leaf (low: EAX, EBX; high: ECX, EDX)."""
    functions = [_XGETBV_CODE] + [_cpuid_code(leaf, sub, high) for leaf, sub in leaves for high in (False, True)]
    return b"".join(function.ljust(_SLOT, b"\xcc") for function in functions)  # int3 between them


def _call(address: int) -> int:
    return int(ctypes.CFUNCTYPE(ctypes.c_uint64)(address)())


def read_registers(code_page: CodePage | None = None) -> tuple[Registers, int | None]:
    """CPUID's answers for LEAVES (a leaf above the CPU's highest is left out, as zeros) and XCR0 (None without
    OSXSAVE). CpuidUnavailable where generated code cannot run."""
    if not _is_x86_64():
        raise CpuidUnavailable("not an x86-64 process")
    wanted = ((0, 0), (0x80000000, 0), *LEAVES)
    runner = code_page or (_windows_code if sys.platform == "win32" else _posix_code)
    with runner(_page(wanted)) as address:
        raw: dict[tuple[int, int], tuple[int, int, int, int]] = {}
        for index, key in enumerate(wanted):
            low, high = _call(address + _SLOT * (1 + 2 * index)), _call(address + _SLOT * (2 + 2 * index))
            raw[key] = (low & 0xFFFFFFFF, low >> 32, high & 0xFFFFFFFF, high >> 32)
        highest, highest_extended = raw[(0, 0)][EAX], raw[(0x80000000, 0)][EAX]
        highest_seven = raw[(7, 0)][EAX] if highest >= 7 else -1  # leaf 7's subleaves
        registers = {
            key: value
            for key, value in raw.items()
            if (key[0] < 0x80000000 and key[0] <= highest and (key[0] != 7 or key[1] <= highest_seven))
            or (key[0] >= 0x80000000 and key[0] <= highest_extended)
        }
        osxsave = bool(registers.get((1, 0), (0, 0, 0, 0))[ECX] >> OSXSAVE_BIT & 1)
        xcr0 = _call(address) if osxsave else None  # XGETBV faults without OSXSAVE
    return registers, xcr0


@functools.cache
def cpuid_flags() -> frozenset[str] | str:
    """This CPU's flags from CPUID, or why they could not be read."""
    try:
        registers, xcr0 = read_registers()
    except (CpuidUnavailable, OSError, AttributeError) as exc:
        return f"CPUID could not run: {exc}"
    return flags_from_registers(registers, xcr0)


def _is_x86_64() -> bool:
    import platform

    return platform.machine().lower() in ("x86_64", "amd64", "x64") and ctypes.sizeof(ctypes.c_void_p) == 8
