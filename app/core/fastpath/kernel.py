"""The kernel library (native/hearth_decode.c): prebuilt per CPU target at package time
(packaging/build_kernels.py) or compiled on first use and cached; either way checked against its sha256 before it is
loaded. Torch-free, so that the torch-free runtime (app.core.engines.lite) loads the same library the same way.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from app.core.fastpath import blocks, compile_notice, compile_parts, cpu, integrity
from app.core.fastpath.openmp import SPIN_ENV, prefer_short_spin
from app.core.fastpath.team import TeamChooser
from app.core.storage.paths import cache_dir

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("native") / "hearth_decode.c"
ABI = 15  # hearth_decode.c's HEARTH_ABI: its calls and its numerics (the prompt and response caches key on it)
COMPILE_TIMEOUT_S = 180
EXTRA_FLAGS: tuple[str, ...] = ()  # appended to the compiler flags (tests build a scalar-only kernel with it)
# A DLL built by mingw-w64's gcc links libgomp and winpthreads into itself: Python loads a library's dependencies only
# from beside it and the system folders, where a user's PC has neither (packaging/build_kernels.py's, the same).
WINDOWS_LINK = ("-static",)
# Order of the C side's enums (checked against hearth_layout at load).
CFG_FIELDS = (
    "layers", "hidden", "heads", "kv_heads", "head_dim", "inter", "vocab", "embed_bf16", "kv_bf16", "threads", "q4",
)  # fmt: skip
# The packed layouts hearth_decode.c reads (app.core.fastpath.packed builds them).
Q4_GROUP = 16  # rows per interleaved Q4_1 group (hearth_decode.c's GROUP)
Q4_RECORD = 320  # bytes per group per block of 32 columns: 256 of nibbles, 16 fp16 d, 16 fp16 m (RECORD)
HEAD_RECORD = 512  # the int8 lm_head: bytes per group of 16 rows per block of 32 columns (hearth_decode.c's LM_RECORD)
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")  # the decoders hearth_step implements
SLAB_STEP = 256  # KV slab capacity grows in whole multiples of this many positions


def grown_capacity(capacity: int, needed: int, limit: int) -> int:
    """A KV slab's next capacity for `needed` positions: a quarter more (at least two steps), in whole steps, capped
    at the model's context window `limit` but never below `needed`."""
    grown = max(needed, capacity + max(2 * SLAB_STEP, capacity // 4))
    grown = -(-grown // SLAB_STEP) * SLAB_STEP
    return max(needed, min(grown, limit))


WEIGHT_FORMATS = ("int8", "q4")  # decoder matrices: int8 rows (fp32 scale per row), or Q4_1 in groups of 16 rows
# hearth_q4_kernel's answer: which code runs the Q4_1 matrices in this build.
Q4_KERNELS = {0: "scalar", 1: "NEON", 2: "NEON DotProd", 3: "AVX2", 4: "AVX-512 VNNI"}
LAYER_FIELDS = (
    "attn_norm", "mlp_norm", "qkv_q", "qkv_s", "qkv_b", "o_q", "o_s", "o_b",
    "gu_q", "gu_s", "gu_b", "down_q", "down_s", "down_b", "k", "v",
)  # fmt: skip
GLOBAL_FIELDS = ("embed", "final_norm", "lm_q", "lm_s", "inv_freq")


# -- the library ----------------------------------------------------------------------------------------------------
# Libraries built at package time (packaging/build_kernels.py), one per CPU target, with a manifest of their sha256s.
PREBUILT_DIR = SOURCE.parent / "prebuilt"
MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1
# "auto": a prebuilt library for this CPU, else compile from source; "compile": always compile (development, bench);
# "prebuilt": never compile (the packaging test proves the bundle needs no compiler).
KERNEL_ENV = "HEARTH_KERNEL"
KERNEL_CHOICES = ("auto", "compile", "prebuilt")
# The most the kernel may use, best first per architecture: prebuilt libraries above it are skipped and a compile
# here adds its flags. Tests run every variant a CPU can (tests/core/test_prefix_reuse.py); a user can rule out one
# that misbehaves. "amx" is the AVX-512 build with its prefill on AMX tiles where the CPU has them; "avx512" the same
# build without them. "scalar" builds the plain C code, which the fused step refuses (slower than torch's kernels).
TARGET_ENV = "HEARTH_KERNEL_TARGET"
TARGETS: dict[str, tuple[str, ...]] = {
    "x86_64": ("amx", "avx512", "avxvnni", "avx2", "scalar"),
    "aarch64": ("dotprod", "neon"),
}
NO_SIMD = "this CPU lacks AVX2+FMA: the fused decode kernel would be slower than the plain path"
TARGET_FLAGS = {
    "avxvnni": ("-mno-avx512f",),
    "avx2": ("-mno-avx512f", "-DHEARTH_NO_AVXVNNI"),  # a define, not -mno-avxvnni: compilers before it don't know it
    "scalar": ("-mno-avx2", "-mno-fma"),
    "neon": ("-march=armv8-a",),
}
# Which caps each prebuilt target (packaging/build_kernels.py) fits under.
PREBUILT_TARGET_CAPS = {
    "x86-64-avx512": ("amx", "avx512"),
    "x86-64-avxvnni": ("amx", "avx512", "avxvnni"),
    "x86-64-avx2": ("amx", "avx512", "avxvnni", "avx2"),
    "arm64-dotprod": ("dotprod",),
    "arm64": ("dotprod", "neon"),
}
NO_AMX_FLAG = "-DHEARTH_NO_AMX"  # the kernel built without its AMX code
CACHE_TAG = "hashed-1"  # part of the compiled library's cache name: files from before sidecars are never looked at


@dataclass(frozen=True)
class NativeLibrary:
    lib: ctypes.CDLL
    path: Path
    threaded: bool  # built with OpenMP
    build_seconds: float  # 0.0 when it came from the cache or was prebuilt
    compiler: str  # "" for a prebuilt library
    sha256: str = ""  # of the file that was loaded, checked before loading it
    origin: str = ""  # "prebuilt x86-64-avx512", "compiled here (-march=native)"
    fallback: str = ""  # why no prebuilt library was used (empty when one was)


def q4_kernel_name(lib: Any) -> str:
    """What a kernel library's quantized products run on, as notes name it: "AVX-512 VNNI", "AVX2 with AVX-VNNI",
    "AVX2", "NEON DotProd", ..."""
    name = Q4_KERNELS.get(int(lib.hearth_q4_kernel()), "?")
    return f"{name} with AVX-VNNI" if lib.hearth_avx_vnni() else name


def describe_step(library: NativeLibrary, weight_format: str, team: TeamChooser) -> tuple[str, str]:
    """How a reply's note names the fused step: what its matrices are ("Q4_1 x16, AVX-512 VNNI (lm_head int8)") and
    what runs them ("C kernel <where it came from>[; why no prebuilt one]; up to N threads, as many as ...")."""
    described = {"int8": "int8", "q4": f"Q4_1 x16, {q4_kernel_name(library.lib)} (lm_head int8)"}[weight_format]
    return described, f"{library_origin(library)}; {team.description()}"


def library_origin(library: NativeLibrary) -> str:
    """Where the kernel library came from, for a reply's note: "C kernel prebuilt x86-64-avx512", or compiled here
    and why no prebuilt one was used."""
    origin = library.origin or "C kernel"
    if library.fallback:  # compiled here although kernels may ship prebuilt: say why none was used
        origin = f"{origin}; {library.fallback}"
    return f"C kernel {origin}"


def q4_prefill(
    lib: Any, records: int, rows: int, cols: int, x: int, x_bf16: bool, n: int, y: int, y_bf16: bool, threads: int
) -> None:
    """hearth_q4_prefill: y [n, rows] = x [n, cols] times the Q4_1 records (pointers), or the error its code means."""
    code = lib.hearth_q4_prefill(records, rows, cols, x, int(x_bf16), n, y, int(y_bf16), threads)
    if code == -3:
        raise MemoryError(f"the Q4_1 kernel could not allocate its buffers for a {n}-row input")
    if code != 0:
        raise RuntimeError(f"the Q4_1 kernel refused a {n}-row input (code {code})")


def lm_head(lib: Any, q: int, scale: int, vocab: int, cols: int, x: int, n: int, out: int, threads: int) -> None:
    """hearth_lm_head: out [n, vocab] from fp32 rows x [n, cols] through the int8 head rows (pointers)."""
    if lib.hearth_lm_head(q, scale, vocab, cols, x, n, out, threads) != 0:
        raise MemoryError("the lm_head kernel could not allocate its activation buffers")


class StepArguments:
    """hearth_step's argument arrays for one model: its sizes (CFG_FIELDS), eps / attention scale / RoPE scaling, the
    global pointers (GLOBAL_FIELDS) and each layer's (LAYER_FIELDS; the last two, its K/V slabs, bound per cache by
    `bind_kv`), and the scratch buffer the bound capacity needs. Whoever builds it keeps every array its pointers
    point into alive (the torch path's tensors, the torch-free runtime's numpy arrays)."""

    def __init__(
        self,
        lib: Any,
        sizes: Mapping[str, int],
        eps: float,
        rope_scaling: float,
        glob: Mapping[str, int],
        layers: Sequence[Mapping[str, int | None]],
    ) -> None:
        self.lib = lib
        self.cfg = (ctypes.c_int64 * len(CFG_FIELDS))(*(sizes[name] for name in CFG_FIELDS))
        self.cfgf = (ctypes.c_float * 3)(eps, sizes["head_dim"] ** -0.5, rope_scaling)
        self.glob = (ctypes.c_void_p * len(GLOBAL_FIELDS))(*(glob[name] for name in GLOBAL_FIELDS))
        self.layer_args = (ctypes.c_void_p * (len(LAYER_FIELDS) * len(layers)))()
        for index, fields in enumerate(layers):
            for offset, name in enumerate(LAYER_FIELDS[:-2]):
                self.layer_args[index * len(LAYER_FIELDS) + offset] = fields.get(name)
        self.capacity = 0  # of the slabs bound last
        self.scratch = np.empty(0, dtype=np.float32)
        self.most_threads = max(1, int(sizes["threads"]))  # the scratch is sized for this team, whatever runs next
        self._threads_at = CFG_FIELDS.index("threads")

    def bind_kv(self, keys: Sequence[int], values: Sequence[int], capacity: int) -> None:
        """Point every layer at its K and V slabs (all of `capacity` positions) and size the scratch for them."""
        stride = len(LAYER_FIELDS)
        for index, (key, value) in enumerate(zip(keys, values, strict=True)):
            self.layer_args[index * stride + stride - 2] = key
            self.layer_args[index * stride + stride - 1] = value
        running = self.cfg[self._threads_at]
        self.cfg[self._threads_at] = self.most_threads  # a step on a smaller team ran last: size for the largest anyway
        needed = int(self.lib.hearth_scratch_floats(ctypes.addressof(self.cfg), capacity))
        self.cfg[self._threads_at] = running
        if self.scratch.size < needed:
            self.scratch = np.empty(needed, dtype=np.float32)
        self.capacity = capacity

    def set_threads(self, threads: int) -> None:
        """The team size of the next `run`: at most the team the scratch is sized for (the one it was built with)."""
        self.cfg[self._threads_at] = max(1, min(threads, self.most_threads))

    def run(self, row: int, position: int, logits: int) -> int:
        """One token through the whole decoder: embedding row `row` at `position`, its logits into `logits` (fp32
        [vocab]); hearth_step's code (0: done)."""
        return int(
            self.lib.hearth_step(
                ctypes.addressof(self.cfg),
                ctypes.addressof(self.cfgf),
                ctypes.addressof(self.glob),
                ctypes.addressof(self.layer_args),
                row,
                position,
                self.capacity,
                logits,
                self.scratch.ctypes.data,
            )
        )


_library_lock = threading.Lock()
_library: NativeLibrary | str | None = None  # the loaded library, or why there is none; per process
_notices: list[str] = []  # damaged files found while getting the library, until someone shows them


_Result = TypeVar("_Result")


def on_a_passing_thread(work: Callable[[], _Result]) -> _Result:
    """`work` run on a thread that ends with it, for the kernel's multi-threaded calls made once (laying a model out
    at load). OpenMP (libgomp) keeps a pool of threads for every thread that ever ran a parallel region, for good;
    once there are more of them than cores, every barrier of every later step sleeps in the kernel instead of
    spinning. A model loaded on one thread and decoded on another (the server's queue) then decoded 4.7x slower on 2
    cores (77 against 354 tok/s for the default model). A finished thread's pool goes with it."""
    results: list[_Result] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(work())
        except BaseException as exc:  # re-raised on the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=run, name="hearth-kernel-once", daemon=True)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return results[0]


def load_library() -> NativeLibrary | str:
    """The kernel library: prebuilt for this CPU, or compiled once per source/compiler/CPU; a string says why there
    is none. Every file is checked against its sha256 before it is loaded."""
    global _library
    with _library_lock:
        if _library is None:
            _library = _build_and_load()
        return _library


def take_library_notices() -> list[str]:
    """Lines for the user about damaged kernel files moved aside and rebuilt (given once, then forgotten)."""
    with _library_lock:
        taken = list(_notices)
        _notices.clear()
        return taken


def reset_library_for_tests(library: NativeLibrary | str | None = None) -> None:
    """Forget the process's library (the next use resolves it again), or hold `library` instead."""
    global _library
    with _library_lock:
        _library = library
        _notices.clear()


def held_library_for_tests() -> NativeLibrary | str | None:
    """The library the process holds, None before its first use."""
    with _library_lock:
        return _library


def library_from_file_for_tests(path: Path) -> NativeLibrary | str:
    """A kernel library the tests built (tests/helpers/x86_builds.py), loaded as the app loads its own."""
    return _load(path, True, 0.0, "", integrity.sha256_file(path), f"test build {path.name}")


def _compiler() -> str | None:
    for candidate in (os.environ.get("CC", ""), "cc", "gcc", "clang"):
        if candidate and (found := shutil.which(candidate)):
            return found
    return None


def kernel_target() -> str:
    """The HEARTH_KERNEL_TARGET cap in force ("" for none: the best this CPU runs), or raise ValueError naming the
    choices when it names none of this architecture's."""
    target = os.environ.get(TARGET_ENV, "").strip().lower()
    choices = TARGETS.get(cpu.machine_arch(), ())
    if target and target not in choices:
        raise ValueError(f"{TARGET_ENV}={target} is not one of {', '.join(choices) or 'nothing on this CPU'}")
    return target


def _build_and_load() -> NativeLibrary | str:
    mode = os.environ.get(KERNEL_ENV, "") or "auto"
    if mode not in KERNEL_CHOICES:
        return f"{KERNEL_ENV}={mode} is not one of {', '.join(KERNEL_CHOICES)}"
    try:
        kernel_target()
    except ValueError as exc:
        return str(exc)
    fallback = f"{KERNEL_ENV}=compile" if mode == "compile" else ""
    if mode != "compile":
        found = _load_prebuilt()
        if isinstance(found, NativeLibrary):
            return found
        fallback = found
        if mode == "prebuilt":
            return f"no usable prebuilt kernel ({fallback})"
    if _plain_build_only():  # what a compile would give is refused on load: no 10-second build to throw away
        return f"{NO_SIMD}; no prebuilt kernel either ({fallback})" if fallback else NO_SIMD
    compiled = _compile_and_load()
    if isinstance(compiled, str):
        return f"{compiled}; no prebuilt kernel either ({fallback})"
    return dataclasses.replace(compiled, fallback=fallback)


def _plain_build_only() -> bool:
    """Whether a compile here could only build the plain C kernel (x86-64 without AVX2+FMA, or capped to `scalar`),
    which is refused. Unknown flags (an OS without a flag list and no torch) are left to the compile to find out."""
    if cpu.machine_arch() != "x86_64":
        return False
    flags = cpu.cpu_flags()
    return kernel_target() == "scalar" or (bool(flags) and not {"avx2", "fma"} <= flags)


def read_manifest(folder: Path | None = None) -> dict[str, Any] | str:
    """The prebuilt libraries' manifest, or why there is none to use."""
    path = (folder or PREBUILT_DIR) / MANIFEST_NAME
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return "none shipped with this install"
    except (OSError, ValueError) as exc:
        return f"its manifest {path} is unreadable ({type(exc).__name__})"
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        return f"its manifest {path} is not in format {MANIFEST_FORMAT}"
    return manifest


def _load_prebuilt() -> NativeLibrary | str:
    """The best prebuilt library this CPU runs, verified against the manifest before ctypes sees it; else why not."""
    folder = PREBUILT_DIR
    manifest = read_manifest(folder)
    if isinstance(manifest, str):
        return f"prebuilt kernels: {manifest}"
    try:
        source_digest = integrity.sha256_file(SOURCE)
    except OSError as exc:
        return f"prebuilt kernels: the kernel source is unreadable ({exc})"
    if manifest.get("source_sha256") != source_digest or manifest.get("abi") != ABI:
        return "prebuilt kernels: built from another version of hearth_decode.c"
    arch, flags = cpu.machine_arch(), cpu.cpu_flags()
    reasons: list[str] = []
    entries = [e for e in manifest.get("libraries", []) if isinstance(e, dict)]
    mine = [e for e in entries if e.get("arch") == arch and e.get("platform") == sys.platform]
    if not mine:
        return f"prebuilt kernels: none for {arch} on {sys.platform}"
    cap = kernel_target()
    for entry in mine:  # best first, as the build script wrote them
        target = str(entry.get("target", "?"))
        if cap and cap not in PREBUILT_TARGET_CAPS.get(target, ()):
            reasons.append(f"{target} is above {TARGET_ENV}={cap}")
            continue
        missing = sorted(set(entry.get("requires", [])) - flags)
        if missing:
            reasons.append(f"{target} needs {', '.join(missing)}")
            continue
        path = folder / str(entry.get("file", ""))
        checked, damage = _verify_prebuilt(path, entry)
        if damage:
            message = f"The prebuilt kernel library {path} is damaged ({damage}); it was not loaded. Reinstall Hearth."
            log.info(message)  # shown once as a notice; the log keeps it for reports
            _notices.append(message)
            reasons.append(f"{target} is damaged")
            continue
        loaded = _load(path, bool(entry.get("openmp")), 0.0, "", checked, f"prebuilt {target}")
        if isinstance(loaded, str):
            reasons.append(f"{target}: {loaded}")
            continue
        return loaded
    return f"prebuilt kernels: {'; '.join(reasons)}"


def _verify_prebuilt(path: Path, entry: Mapping[str, Any]) -> tuple[str, str]:
    """(the file's sha256, "") when it matches the manifest, else ("", what is wrong): never loaded unchecked."""
    try:
        if path.stat().st_size != entry.get("bytes"):
            return "", f"it has {path.stat().st_size} bytes where the manifest says {entry.get('bytes')}"
        digest = integrity.sha256_file(path)
    except OSError as exc:
        return "", f"it could not be read ({exc.strerror or exc})"
    if digest != entry.get("sha256"):
        return "", "its sha256 does not match the manifest"
    return digest, ""


def _compile_and_load() -> NativeLibrary | str:
    if cpu.machine_arch() not in ("x86_64", "aarch64"):
        return f"the fused decode kernel is for x86-64 (AVX2) and AArch64 (NEON); this CPU is {platform.machine()}"
    compiler = _compiler()
    if compiler is None:
        return "no C compiler found (cc, gcc or clang; set CC) to build the fused decode kernel"
    try:
        version = subprocess.run(
            [compiler, "--version"], capture_output=True, text=True, timeout=30, check=False
        ).stdout.splitlines()[:1]
    except (OSError, subprocess.SubprocessError) as exc:
        return f"the C compiler {compiler} does not run ({exc})"
    source = SOURCE.read_bytes()
    failures: list[str] = []
    # AArch64 compilers spell "this CPU" -mcpu=native (Apple's clang may refuse it: plain Armv8-A still has NEON).
    cpu_choices = [["-march=native"]] if cpu.machine_arch() == "x86_64" else [["-mcpu=native"], []]
    cap = kernel_target()
    if cap == "neon":  # -mcpu=native would bring DotProd back
        cpu_choices = [[]]
    capped = [*TARGET_FLAGS.get(cap, ())]
    # OpenMP first; a compiler without it still gets a single-threaded kernel. On x86-64 a compile that fails is tried
    # again without the AMX code (an assembler before binutils 2.36 does not know its instructions).
    attempts = [(march, threaded, True) for march in cpu_choices for threaded in (True, False)]
    announced = False  # said once, however many attempts it takes
    while attempts:
        march, threaded, amx = attempts.pop(0)
        flags = [
            "-O3",
            *march,
            "-shared",
            "-fPIC",
            "-std=c11",
            "-ffp-contract=off",  # the float order the qemu-checked builds use (clang would fuse a*b+c)
            *(["-fopenmp"] if threaded else []),
            *(WINDOWS_LINK if sys.platform == "win32" else ()),
            *([] if amx else [NO_AMX_FLAG]),
            *capped,
            *EXTRA_FLAGS,
        ]
        identity = "\n".join(
            [str(ABI), CACHE_TAG, compiler, *version, " ".join(flags), cpu.machine_identity(), sys.platform]
        )
        digest = hashlib.sha256(source + identity.encode()).hexdigest()[:20]
        target = cache_dir() / "native" / f"hearth_decode-{digest}{_suffix()}"
        built = 0.0
        # Checked before ctypes ever sees it: a cut-short or overwritten library is moved aside and compiled again.
        checked = integrity.check_or_quarantine(target, "compiled kernel library", "compiled again", _notices)
        if checked is None:
            if not announced:
                compile_notice.say_compiling()
                announced = True
            started = time.perf_counter()
            error = _compile(compiler, flags, target)
            if error:
                failures.append(error)
                if amx and cpu.machine_arch() == "x86_64":
                    attempts.insert(0, (march, threaded, False))
                continue
            built = time.perf_counter() - started
            checked = integrity.check_or_quarantine(target, "compiled kernel library", "compiled again", _notices)
            if checked is None:  # changed between writing and loading: never load it
                failures.append(f"the compiled kernel library {target} changed before it could be loaded")
                continue
        origin = f"compiled here ({' '.join([*march, *capped]) or 'plain'}{'' if amx else ', without AMX'})"
        loaded = _load(target, threaded, built, compiler, checked.sha256, origin)
        if isinstance(loaded, str):
            failures.append(loaded)
            continue
        return loaded
    return failures[0] if failures else "the fused decode kernel could not be built"


def _suffix() -> str:
    return ".dll" if sys.platform == "win32" else ".dylib" if sys.platform == "darwin" else ".so"


def _compile(compiler: str, flags: list[str], target: Path) -> str:
    """The kernel's source compiled into `target` (in parts side by side: compile_parts); "" or why not."""
    return compile_parts.compile_library(compiler, flags, SOURCE, target, COMPILE_TIMEOUT_S)


def _open_with_spin_count(path: Path) -> ctypes.CDLL:
    """ctypes.CDLL, with GOMP_SPINCOUNT set while the library (and with it GCC's OpenMP runtime, which reads the
    variable once, as it loads) comes in, unless the user set it or OMP_WAIT_POLICY. libgomp's default, 300,000
    spins, keeps an idle thread busy for a millisecond or more: between the torch-free prefill's kernel calls that took
    a core from numpy's attention threads (a 135M prefill took 1.5-2.7 s from run to run; 1.42-1.46 s with 30,000).
    3,000: beside one busy process a waiting thread that spins holds the core its late partner needs (on Intel a
    spin's PAUSE takes ~140 cycles): two threads decoded the default model at 20 tok/s with 30,000 and 50 with 3,000,
    while a quiet machine's decode and prefill (135M and 1B) measured the same with 30,000, 10,000 and 3,000 (1,000
    lost ~5 % at 1B). The app's entry points set it for the whole process before torch loads (app.core.fastpath.openmp);
    here it is set only for a process that did not (a library user, a test)."""
    added = prefer_short_spin()
    try:
        return ctypes.CDLL(str(path))
    finally:
        if added:
            os.environ.pop(SPIN_ENV, None)


def _load(path: Path, threaded: bool, built: float, compiler: str, sha256: str, origin: str) -> NativeLibrary | str:
    """ctypes-load a file whose sha256 was just checked (the only place a library enters the process)."""
    try:
        lib = _open_with_spin_count(path)
    except OSError as exc:
        return f"the fused decode kernel did not load ({exc})"
    lib.hearth_abi.restype = ctypes.c_int
    if lib.hearth_abi() != ABI:  # before any symbol another version may lack
        return f"the fused decode kernel at {path} is from another version"
    lib.hearth_simd.restype = ctypes.c_int
    lib.hearth_openmp.restype = ctypes.c_int
    lib.hearth_layout.restype = ctypes.c_int
    lib.hearth_layout.argtypes = [ctypes.c_int]
    lib.hearth_scratch_floats.restype = ctypes.c_int64
    lib.hearth_scratch_floats.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.hearth_step.restype = ctypes.c_int
    lib.hearth_step.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [ctypes.c_void_p] * 2
    pointer, size, flag = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.hearth_dequant_q4.restype = None  # prefill from the one packed copy (app.core.fastpath.packed)
    lib.hearth_dequant_q4.argtypes = [pointer, size, size, pointer, flag, flag]
    lib.hearth_lm_head.restype = ctypes.c_int  # prefill's lm_head from the step's int8 rows
    lib.hearth_lm_head.argtypes = [pointer, pointer, size, size, pointer, size, pointer, flag]
    lib.hearth_q4_kernel.restype = ctypes.c_int
    lib.hearth_q4_prefill.restype = ctypes.c_int  # prompts' rows with the step's int8 activations
    lib.hearth_q4_prefill.argtypes = [pointer, size, size, pointer, flag, size, pointer, flag, flag]
    layout = tuple(lib.hearth_layout(i) for i in range(4))
    if layout != (len(CFG_FIELDS), 3, len(GLOBAL_FIELDS), len(LAYER_FIELDS)):
        return f"the fused decode kernel's layout {layout} does not match this Hearth"
    mismatch = blocks.declare(lib)
    if mismatch:
        return f"the fused decode kernel at {path}: {mismatch}"
    if not lib.hearth_simd():
        return NO_SIMD
    lib.hearth_amx(1 if kernel_target() in ("", "amx") else 0)  # on where the CPU and the OS give the tiles
    return NativeLibrary(
        lib, path, threaded and bool(lib.hearth_openmp()), built, compiler, sha256=sha256, origin=origin
    )
