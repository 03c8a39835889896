"""The kernel library and the packed decode copies are verified before use; prebuilt kernels are picked per CPU.

Fault cases (issue 12): a compiled library cut short (a Bus error on every later run before), replaced by random
bytes (a second, single-threaded kernel was compiled silently) or with a same-size byte flip, and a packed copy with
the same damage (a garbage reply, then replayed by the response cache): each is moved to NAME.damaged, rebuilt, named
in a notice, never passed to ctypes, and the reply equals a clean run's.

Prebuilt kernels (issue 16): packaging/build_kernels.py builds them here into a temporary folder; the CPU's flags go
through a seam (cpu.cpu_flags) so both the AVX-512 and the AVX2 choice are covered on any x86-64 machine, and the
ones this CPU can run are loaded and decode for real.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from app.core.chat.events import ChatMessage, DoneEvent
from app.core.chat.sampling import SamplingParams
from app.core.engines.backend import ReplyRequest
from app.core.engines.engine import Engine
from app.core.fastpath import cpu, integrity, kernel
from app.core.fastpath import select as fastpath
from tests.helpers.build_kernels import load_build_kernels
from tests.helpers.damage import flipped, random_bytes, truncated
from tests.helpers.kernel_cache import compile_by_copy
from tests.helpers.x86_builds import X86_BUILDS

REPO_ROOT = Path(__file__).resolve().parents[2]
GREEDY = SamplingParams(temperature=0, max_new_tokens=6)
MESSAGES = [ChatMessage("user", "What is the capital of France?")]
IS_X86 = platform.machine().lower() in ("x86_64", "amd64")
HAS_CC = kernel._compiler() is not None
AVX2_CPU = frozenset(("avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "abm", "movbe"))
AVXVNNI_CPU = AVX2_CPU | {"avx_vnni"}  # Intel Alder Lake and later client cores: no AVX-512
AVX512_CPU = AVX2_CPU | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd", "avx512_vnni", "avx512_bf16"}
# AVX-512 VNNI without BF16: Cascade Lake and Ice Lake servers, Ice Lake, Tiger Lake and Rocket Lake laptops
AVX512_NO_BF16_CPU = AVX512_CPU - {"avx512_bf16"}
LIBRARY_DAMAGE = {
    "truncated": lambda data: truncated(data, len(data) // 3),
    "random bytes": lambda data: random_bytes(len(data)),
    "same-size flip": lambda data: flipped(data, len(data) // 2),
}
REAL_FLAGS = cpu.cpu_flags()  # read before any test replaces the seam
needs_kernel = pytest.mark.skipif(not (IS_X86 and HAS_CC), reason="needs an x86-64 machine with a C compiler")


def damage(path: Path, data: bytes) -> None:
    """Put damaged bytes under `path` as a new file: this process may have the old one mapped (a library), and
    writing into a mapped file kills the writer with SIGBUS, which is the very fault under test, for the next run."""
    fresh = path.with_name(path.name + ".test-damage")
    fresh.write_bytes(data)
    os.replace(fresh, path)


def reply(engine: Engine) -> str:
    done = list(engine.generate(ReplyRequest(MESSAGES, GREEDY)))[-1]
    assert isinstance(done, DoneEvent) and done.finish_reason in ("stop", "length"), done
    return done.text


@pytest.fixture
def dlopened(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Path, str]]:
    """Every hearth library ctypes is asked to load, with the sha256 its file had at that moment."""
    seen: list[tuple[Path, str]] = []
    real = ctypes.CDLL

    def spy(name: Any, *args: Any, **kwargs: Any) -> Any:
        if "hearth_decode" in str(name):
            seen.append((Path(name), integrity.sha256_file(Path(name))))
        return real(name, *args, **kwargs)

    monkeypatch.setattr(kernel.ctypes, "CDLL", spy)
    return seen


@pytest.fixture
def compiled_only(monkeypatch: pytest.MonkeyPatch, isolated_cache: Path) -> Any:
    """A fresh process's view with no prebuilt kernels: the library is compiled into the isolated cache."""
    monkeypatch.setenv(kernel.KERNEL_ENV, "compile")
    # These tests are about the cache, not speed: -O1 compiles in a third of -O3's time (same results: the float
    # order is fixed by -ffp-contract=off and the intrinsics, never by the optimiser).
    monkeypatch.setattr(kernel, "EXTRA_FLAGS", ("-O1",))
    kernel.reset_library_for_tests()
    yield isolated_cache
    kernel.reset_library_for_tests()


@pytest.fixture(scope="module")
def compiled_once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache folder holding the library as compiled_only builds it, compiled once for the module."""
    cache = tmp_path_factory.mktemp("compiled-once")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(kernel.KERNEL_ENV, "compile")
        patch.setenv("HEARTH_CACHE_DIR", str(cache))
        patch.setattr(kernel, "EXTRA_FLAGS", ("-O1",))
        kernel.reset_library_for_tests()
        assert isinstance(kernel.load_library(), kernel.NativeLibrary)
    kernel.reset_library_for_tests()
    return cache / "native"


@pytest.fixture
def compiled_before(compiled_only: Path, compiled_once: Path) -> Path:
    """compiled_only with the library already in its cache, as an earlier run left it (each test then compiles only
    what it damages)."""
    shutil.copytree(compiled_once, compiled_only / "native")
    return compiled_only


@pytest.fixture
def compiles_by_copy(monkeypatch: pytest.MonkeyPatch, compiled_once: Path) -> list[list[str]]:
    """Each compile publishes a copy of compiled_once's library (tests.helpers.kernel_cache.compile_by_copy): these
    tests are about what happens around a compile. Returns the flags of every compile asked for."""
    (library,) = compiled_once.glob("hearth_decode-*.so")
    return compile_by_copy(monkeypatch, library)


@pytest.fixture(scope="module")
def prebuilt_dir(tmp_path_factory: pytest.TempPathFactory, x86_kernel_builds: dict[str, Path]) -> Path:
    """packaging/build_kernels.py's folder for three x86 targets. These tests are about the manifest, the checks and
    the choice of a target; a compile whose target the run already built (tests/helpers/x86_builds.py: the same
    -march flags, OpenMP, -O1) is a copy of that build (two of the three here: ~25 s of compiling), the rest compile."""
    if not (IS_X86 and HAS_CC):
        pytest.skip("needs an x86-64 machine with a C compiler")
    out = tmp_path_factory.mktemp("prebuilt")
    targets = ["x86-64-avx512", "x86-64-avxvnni", "x86-64-avx2"]
    build_kernels = load_build_kernels()
    compile_command = build_kernels.subprocess.run

    def compile_or_copy(command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        march = [flag for flag in command if flag.startswith("-m")]
        for name, (flags, _, _) in X86_BUILDS.items():
            if (
                name in x86_kernel_builds
                and march == flags
                and "-fopenmp" in command
                and "-DHEARTH_NO_AMX" not in command
            ):
                shutil.copy(x86_kernel_builds[name], command[command.index("-o") + 1])
                return subprocess.CompletedProcess(command, 0, "", "")
        return compile_command(command, **kwargs)

    build_kernels.subprocess = SimpleNamespace(run=compile_or_copy)
    manifest = build_kernels.build(out, targets)
    assert [entry["target"] for entry in manifest["libraries"]] == targets
    return out


@pytest.fixture
def prebuilt(prebuilt_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated_cache: Path) -> Path:
    """A private copy of the prebuilt folder (tests damage it) that native.py ships with."""
    folder = tmp_path / "prebuilt"
    shutil.copytree(prebuilt_dir, folder)
    monkeypatch.setattr(kernel, "PREBUILT_DIR", folder)
    monkeypatch.delenv(kernel.KERNEL_ENV, raising=False)
    monkeypatch.setattr(kernel, "EXTRA_FLAGS", ("-O1",))  # a fallback compile here: quick (see compiled_only)
    kernel.reset_library_for_tests()
    yield folder
    kernel.reset_library_for_tests()


def with_flags(monkeypatch: pytest.MonkeyPatch, flags: frozenset[str]) -> None:
    monkeypatch.setattr(cpu, "cpu_flags", lambda: flags)


# -- the compiled library --------------------------------------------------------------------------------------------
@needs_kernel
@pytest.mark.parametrize("case", list(LIBRARY_DAMAGE))
def test_a_damaged_compiled_library_is_moved_aside_rebuilt_and_never_loaded(
    case: str,
    default_loaded: Any,
    compiled_before: Path,
    dlopened: list[tuple[Path, str]],
    compiles_by_copy: list[list[str]],
) -> None:
    clean = Engine(default_loaded)
    assert clean.decode_path == "fused-q4", clean.decode_path_note
    clean_text = reply(clean)
    (library,) = (compiled_before / "native").glob("hearth_decode-*.so")
    good = library.read_bytes()
    damaged = LIBRARY_DAMAGE[case](good)
    damage(library, damaged)
    kernel.reset_library_for_tests()  # as in the next run

    engine = Engine(default_loaded)
    assert engine.decode_path == "fused-q4" and "kernel compiled in" in engine.decode_path_note
    assert reply(engine) == clean_text
    (notice,) = engine.recovery_notices()
    assert f"compiled kernel library {library.name} was damaged" in notice
    assert f"{library.name}.damaged" in notice and "compiled again" in notice
    assert (library.parent / f"{library.name}.damaged").read_bytes() == damaged
    assert library.read_bytes() != damaged and integrity.verify(library) is not None
    assert hashlib.sha256(damaged).hexdigest() not in {digest for _, digest in dlopened}
    assert kernel.load_library() is not None and engine.path.fused is not None
    assert engine.path.fused.native.threaded  # the same OpenMP kernel again, not a silent single-threaded one
    assert len(compiles_by_copy) == 1 and "-fopenmp" in compiles_by_copy[0]


@needs_kernel
def test_a_cut_short_library_no_longer_crashes_the_next_process(compiled_before: Path, compiled_once: Path) -> None:
    """Before: dlopen mapped the cut-short file and the process died of SIGBUS (exit 135) on every run."""
    (good,) = compiled_once.glob("hearth_decode-*.so")
    script = (  # -O1 as in compiled_only, in each process; a rebuild publishes a copy of the good library
        "import pytest; from app.core.fastpath import kernel; from tests.helpers.kernel_cache import compile_by_copy; "
        f"kernel.EXTRA_FLAGS = ('-O1',); compile_by_copy(pytest.MonkeyPatch(), {str(good)!r}); "
        "lib = kernel.load_library(); print(lib.origin, lib.threaded)"
    )
    env = {**os.environ, kernel.KERNEL_ENV: "compile", "HEARTH_CACHE_DIR": str(compiled_before)}
    first = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    (library,) = (compiled_before / "native").glob("hearth_decode-*.so")
    damage(library, truncated(library.read_bytes(), 4096))
    second = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    assert "compiled here" in second.stdout and "True" in second.stdout
    assert (library.parent / f"{library.name}.damaged").stat().st_size == 4096


@needs_kernel
def test_a_library_whose_checksum_file_is_gone_is_rebuilt(
    default_loaded: Any, compiled_before: Path, compiles_by_copy: list[list[str]]
) -> None:
    assert isinstance(kernel.load_library(), kernel.NativeLibrary)
    (library,) = (compiled_before / "native").glob("hearth_decode-*.so")
    integrity.sidecar(library).unlink()
    kernel.reset_library_for_tests()
    assert isinstance(kernel.load_library(), kernel.NativeLibrary)
    (notice,) = kernel.take_library_notices()
    assert "its checksum file is missing" in notice and integrity.verify(library) is not None
    assert len(compiles_by_copy) == 1


@needs_kernel
def test_a_library_that_changes_after_it_was_written_is_not_loaded(
    compiled_only: Path,
    monkeypatch: pytest.MonkeyPatch,
    dlopened: list[tuple[Path, str]],
    compiles_by_copy: list[list[str]],
) -> None:
    real_publish = integrity.publish

    def publish_then_damage(partial: Path, final: Path) -> str:
        digest = real_publish(partial, final)
        damage(final, flipped(final.read_bytes(), 1000))  # between writing and loading
        return digest

    monkeypatch.setattr(integrity, "publish", publish_then_damage)
    found = kernel.load_library()
    assert isinstance(found, str) and "changed before it could be loaded" in found
    assert dlopened == [] and len(compiles_by_copy) == 2  # with OpenMP, then without: neither loaded


# -- packed copies ---------------------------------------------------------------------------------------------------
@needs_kernel
@pytest.mark.parametrize("case", list(LIBRARY_DAMAGE))
def test_a_damaged_packed_copy_is_moved_aside_repacked_and_never_multiplied_into_a_reply(
    case: str, default_loaded: Any, isolated_cache: Path
) -> None:
    clean = Engine(default_loaded)
    assert clean.decode_path == "fused-q4", clean.decode_path_note
    clean_text = reply(clean)
    (copy,) = (isolated_cache / "decode-fused-q4").glob("*.safetensors")
    assert clean.path.weights_digest == f"sha256:{integrity.digest_file(copy)}"
    damaged = LIBRARY_DAMAGE[case](copy.read_bytes())
    damage(copy, damaged)

    engine = Engine(default_loaded)
    assert engine.decode_path == "fused-q4" and "packed in" in engine.decode_path_note
    assert reply(engine) == clean_text
    notices = engine.recovery_notices()
    assert [n for n in notices if "packed decode copy" in n] == [
        next(n for n in notices if f"{copy.name} was damaged" in n and f"{copy.name}.damaged" in n)
    ]
    assert "packed again" in notices[-1]
    assert (copy.parent / f"{copy.name}.damaged").read_bytes() == damaged
    # Packing is deterministic: the rebuilt copy is byte for byte the clean one, so replies keyed by it still match.
    assert engine.path.weights_digest == clean.path.weights_digest
    again = Engine(default_loaded)
    assert "loaded from the cache" in again.decode_path_note and again.recovery_notices() == ()


def test_the_plain_path_names_the_dense_weights(default_loaded: Any) -> None:
    eager = fastpath.apply_decode_path(default_loaded.model, "cpu", "bf16", "eager", folder=default_loaded.folder)
    assert eager.weights_digest.startswith("dense:") and len(eager.weights_digest) == len("dense:") + 20
    assert fastpath.apply_decode_path(default_loaded.model, "cpu", "bf16", "eager").weights_digest == ""


# -- prebuilt kernels ------------------------------------------------------------------------------------------------
def test_cpu_flags_are_read_from_this_machine() -> None:
    flags = cpu.cpu_flags()
    if sys.platform.startswith("linux"):
        text = Path("/proc/cpuinfo").read_text()
        listed = re.search(r"^(?:flags|Features)\s*:(.*)$", text, re.MULTILINE)
        assert listed is not None and flags == frozenset(listed.group(1).split())  # whole names, the first CPU's
    if IS_X86:
        import torch

        level = torch.backends.cpu.get_cpu_capability()
        assert ("avx2" in flags) == (level in ("AVX2", "AVX512")) or not sys.platform.startswith("linux")


@pytest.mark.parametrize(
    ("cpuinfo", "expected"),
    [
        ("processor\t: 0\nmodel name\t: Some x86\nflags\t\t: fpu sse2 avx2 fma\nbugs\t\t: spectre\n\n"
         "processor\t: 1\nflags\t\t: fpu sse2\n", {"fpu", "sse2", "avx2", "fma"}),
        ("processor\t: 0\nFeatures\t: fp asimd asimddp\nCPU part\t: 0xd0b\n", {"fp", "asimd", "asimddp"}),
        ("processor\t: 0\nmodel name\t: flagless\n", set()),
    ],
    ids=["x86", "arm", "none"],
)  # fmt: skip
def test_cpu_flags_are_the_first_cpus_flag_names_on_linux(
    cpuinfo: str, expected: set[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = tmp_path / "cpuinfo"
    fake.write_text(cpuinfo, encoding="utf-8")
    real_open = open

    def fake_open(path: str, *args: Any, **kwargs: Any) -> Any:
        return real_open(fake if path == "/proc/cpuinfo" else path, *args, **kwargs)

    monkeypatch.setattr(cpu.sys, "platform", "linux")
    monkeypatch.setattr(cpu, "machine_arch", lambda: "aarch64")  # no torch fallback: the file alone
    monkeypatch.setattr(cpu, "open", fake_open, raising=False)
    assert cpu.cpu_flags() == expected


@pytest.mark.parametrize(
    ("flags", "target"),
    [(AVX512_CPU, "x86-64-avx512"), (AVXVNNI_CPU, "x86-64-avxvnni"), (AVX2_CPU, "x86-64-avx2")],
    ids=["avx512", "avx-vnni", "avx2"],
)
def test_the_best_prebuilt_target_for_the_cpu_is_verified_loaded_and_decodes(
    flags: frozenset[str],
    target: str,
    prebuilt: Path,
    monkeypatch: pytest.MonkeyPatch,
    dlopened: list[tuple[Path, str]],
    default_loaded: Any,
) -> None:
    with_flags(monkeypatch, flags)
    monkeypatch.setenv("PATH", "/nonexistent")  # no compiler: prebuilt or nothing
    monkeypatch.delenv("CC", raising=False)
    manifest = json.loads((prebuilt / "manifest.json").read_text())
    entry = next(e for e in manifest["libraries"] if e["target"] == target)
    if not set(entry["requires"]) <= REAL_FLAGS:
        pytest.skip(f"this CPU can't run {target} (selection covered by the next test)")
    engine = Engine(default_loaded)
    assert engine.decode_path == "fused-q4", engine.decode_path_note
    assert f"C kernel prebuilt {target};" in engine.decode_path_note and "compiled" not in engine.decode_path_note
    # the note names the instructions the Q4_1 records run on
    assert ("Q4_1 x16, AVX2 with AVX-VNNI (" in engine.decode_path_note) == (target == "x86-64-avxvnni")
    assert dlopened == [(prebuilt / entry["file"], entry["sha256"])]
    assert "Paris" in reply(engine)


@pytest.mark.parametrize(
    ("flags", "target"),
    [
        (AVX512_CPU, "x86-64-avx512"),
        (AVX512_NO_BF16_CPU, "x86-64-avx512"),
        (AVXVNNI_CPU, "x86-64-avxvnni"),
        (AVX2_CPU, "x86-64-avx2"),
    ],
    ids=["avx512", "avx512-without-bf16", "avx-vnni", "avx2"],
)
def test_the_choice_follows_the_cpu_flags_not_the_build_machine(
    flags: frozenset[str], target: str, prebuilt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_flags(monkeypatch, flags)
    monkeypatch.setattr(kernel, "_load", lambda path, *args: f"(test) would load {path.name}")
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CC", raising=False)
    found = kernel.load_library()
    assert isinstance(found, str)
    # The first library the flags allow is the one handed to the loader (which this test stubs out), best first.
    assert re.findall(r"would load (\S+?\.so)", found)[0] == f"hearth_decode-{target}.so"


def instruction_flags(library: Path) -> set[str]:
    """The CPU flags the instructions in `library` need, by family (objdump's disassembly); "amx" for tile
    instructions, which the kernel runs only after asking the CPU and the OS for them."""
    listing = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", str(library)], capture_output=True, text=True, check=True
    ).stdout
    needs: set[str] = set()
    for line in listing.splitlines():
        _, tab, instruction = line.partition(":\t")
        if not tab:
            continue
        if "%zmm" in instruction or "{%k" in instruction:
            needs.add("avx512f")
        if re.search(r"\bvpdp(busd|wssd)", instruction):
            needs.add("avx_vnni" if instruction.startswith("{vex}") else "avx512_vnni")
        if "bf16" in instruction.split(" ", 1)[0]:
            needs.add("avx512_bf16")
        if re.match(r"(tdp|tile|ldtilecfg|sttilecfg)", instruction):
            needs.add("amx")
    return needs


@pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump (binutils) is not installed")
def test_each_prebuilt_library_asks_for_exactly_the_instruction_sets_it_uses(prebuilt: Path) -> None:
    """A flag the manifest leaves out would crash a CPU without it (SIGILL); one it asks for needlessly sends CPUs
    without it to a slower library (the AVX-512 library asked for BF16 and used none: Ice Lake ran AVX2)."""
    manifest = json.loads((prebuilt / "manifest.json").read_text())
    distinguishing = {"avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16"}
    for entry in manifest["libraries"]:
        used = instruction_flags(prebuilt / entry["file"])
        requires = set(entry["requires"])
        assert used - {"amx"} <= requires, (entry["target"], used - requires)
        assert requires & distinguishing <= used, (entry["target"], requires & distinguishing - used)
        # tiles only in the AVX-512 library, unless its assembler lacked them (then built without, and flagged so)
        with_tiles = entry["target"] == "x86-64-avx512" and kernel.NO_AMX_FLAG not in entry["flags"]
        assert ("amx" in used) == with_tiles, entry["target"]
    assert "avx512_bf16" not in manifest["libraries"][0]["requires"]  # Cascade Lake, Ice Lake, Tiger Lake run it


def test_a_cpu_without_avx2_is_told_why_and_nothing_is_compiled_for_nothing(
    prebuilt: Path, monkeypatch: pytest.MonkeyPatch, default_loaded: Any
) -> None:
    """No prebuilt kernel fits and a compile here could only build the plain C kernel, which is refused (slower than
    torch's): the reasons, at once, instead of a build thrown away."""
    with_flags(monkeypatch, frozenset({"sse2", "avx"}))
    compiles: list[int] = []
    monkeypatch.setattr(kernel, "_compile_and_load", lambda: compiles.append(1) or "(test) compiled")
    library = kernel.load_library()
    assert isinstance(library, str) and library.startswith(kernel.NO_SIMD), library
    assert "x86-64-avx512 needs " in library and "x86-64-avx2 needs abm, avx2," in library
    assert compiles == []
    choice = fastpath.apply_decode_path(default_loaded.model, "cpu", "bf16")
    assert choice.name == "eager" and "lacks AVX2+FMA" in choice.note
    assert "prebuilt kernels: x86-64-avx512 needs" in choice.note


def test_a_damaged_prebuilt_library_is_never_loaded_and_the_next_target_is(
    prebuilt: Path, monkeypatch: pytest.MonkeyPatch, dlopened: list[tuple[Path, str]]
) -> None:
    with_flags(monkeypatch, AVX512_CPU)
    monkeypatch.setenv("PATH", "/nonexistent")  # no compiler to fall back on: the prebuilt choice alone
    monkeypatch.delenv("CC", raising=False)
    best = prebuilt / "hearth_decode-x86-64-avx512.so"
    damage(best, flipped(best.read_bytes(), 2000))
    monkeypatch.setattr(kernel, "_load", lambda path, *args: f"(test) would load {path.name}")
    found = kernel.load_library()
    assert isinstance(found, str) and "x86-64-avx512 is damaged" in found
    assert "x86-64-avx2: (test) would load hearth_decode-x86-64-avx2.so" in found
    (notice,) = kernel.take_library_notices()
    assert f"prebuilt kernel library {best} is damaged (its sha256 does not match the manifest)" in notice
    assert "Reinstall Hearth" in notice and dlopened == []


def test_a_cut_short_prebuilt_library_is_named_with_both_sizes(prebuilt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with_flags(monkeypatch, AVX2_CPU)
    monkeypatch.setenv(kernel.KERNEL_ENV, "prebuilt")
    library = prebuilt / "hearth_decode-x86-64-avx2.so"
    size = library.stat().st_size
    damage(library, library.read_bytes()[:100])
    found = kernel.load_library()
    assert isinstance(found, str) and found.startswith("no usable prebuilt kernel (prebuilt kernels: ")
    assert f"it has 100 bytes where the manifest says {size}" in kernel.take_library_notices()[0]


@pytest.mark.parametrize(
    ("manifest", "reason"),
    [
        (None, "prebuilt kernels: none shipped with this install"),
        (b"\x00garbage", "is unreadable (JSONDecodeError)"),
        (b'{"format": 99}', "is not in format 1"),
        (b'{"format": 1, "abi": 2, "source_sha256": "0", "libraries": []}', "another version of hearth_decode.c"),
    ],
    ids=["missing", "unreadable", "other format", "other source"],
)
def test_an_unusable_manifest_falls_back_with_the_reason(
    manifest: bytes | None, reason: str, prebuilt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(kernel.KERNEL_ENV, "prebuilt")
    if manifest is None:
        (prebuilt / "manifest.json").unlink()
    else:
        (prebuilt / "manifest.json").write_bytes(manifest)
    found = kernel.load_library()
    assert isinstance(found, str) and reason in found


def test_no_prebuilt_for_this_architecture_says_so(prebuilt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(kernel.KERNEL_ENV, "prebuilt")
    monkeypatch.setattr(cpu, "machine_arch", lambda: "riscv64")
    found = kernel.load_library()
    assert isinstance(found, str) and f"none for riscv64 on {sys.platform}" in found


def test_an_unknown_kernel_choice_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(kernel.KERNEL_ENV, "fastest")
    kernel.reset_library_for_tests()
    try:
        assert kernel.load_library() == "HEARTH_KERNEL=fastest is not one of auto, compile, prebuilt"
    finally:
        kernel.reset_library_for_tests()


def test_the_build_script_builds_arm64_where_a_cross_compiler_exists(tmp_path: Path) -> None:
    build_kernels = load_build_kernels()
    manifest = build_kernels.build(tmp_path, ["arm64-dotprod", "arm64"])
    if shutil.which("aarch64-linux-gnu-gcc") is None or not IS_X86:
        assert set(manifest["skipped"]) == {"arm64-dotprod", "arm64"}
        pytest.skip("no aarch64-linux-gnu-gcc here (make cross-tools)")
    for entry in manifest["libraries"]:
        data = (tmp_path / entry["file"]).read_bytes()
        assert data[:4] == b"\x7fELF" and int.from_bytes(data[18:20], "little") == 183  # EM_AARCH64
        assert hashlib.sha256(data).hexdigest() == entry["sha256"] and entry["arch"] == "aarch64"
    assert [e["requires"] for e in manifest["libraries"]] == [["asimd", "asimddp"], ["asimd"]]


@needs_kernel
def test_a_compiler_without_openmp_still_builds_a_single_threaded_prebuilt_kernel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Apple's clang has no -fopenmp: the Mac library is then built single-threaded, and the manifest says so."""
    compiler = tmp_path / "cc-without-openmp"
    real = kernel._compiler()
    compiler.write_text(
        f'#!/bin/sh\nfor a in "$@"; do [ "$a" = -fopenmp ] && {{ echo "error: unsupported -fopenmp" >&2; exit 1; }}; '
        f'done\nexec {real} "$@"\n'
    )
    compiler.chmod(0o755)
    out = tmp_path / "prebuilt"
    manifest = load_build_kernels().build(out, ["x86-64-avx2"], str(compiler))
    (entry,) = manifest["libraries"]
    assert entry["openmp"] is False and "-fopenmp" not in entry["flags"]
    if not AVX2_CPU <= REAL_FLAGS:
        pytest.skip("built; this CPU can't run an x86-64-v3 library to load it")
    monkeypatch.setattr(kernel, "PREBUILT_DIR", out)
    with_flags(monkeypatch, AVX2_CPU)
    kernel.reset_library_for_tests()
    try:
        library = kernel.load_library()
        assert isinstance(library, kernel.NativeLibrary) and library.origin == "prebuilt x86-64-avx2"
        assert not library.threaded
    finally:
        kernel.reset_library_for_tests()


def test_a_file_is_hashed_in_pieces_and_read_as_it_is_hashed_whole(tmp_path: Path) -> None:
    from app.core.fastpath import integrity

    chunk = integrity.CHUNK
    for size in (0, 5, chunk, chunk + 3, 2 * chunk + 1):
        data = bytes(range(256)) * (size // 256) + bytes(size % 256)
        path = tmp_path / f"f{size}"
        path.write_bytes(data)
        want = integrity.digest_bytes(data)
        assert integrity.digest_file(path) == want
        assert integrity.digest_pieces([data[:7], memoryview(data)[7 : chunk + 9], data[chunk + 9 :]]) == want


def test_packed_copies_are_written_a_tensor_at_a_time_as_safetensors_reads_them(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    from app.core.fastpath import integrity, select

    tensors = {
        "0.qkv.q": torch.randint(0, 255, (3, 640), dtype=torch.uint8),
        "lm.q": torch.randint(-127, 127, (2, 512), dtype=torch.int8),
        "lm.s": torch.rand(17),
        "0.qkv.b": torch.rand(48).to(torch.bfloat16),
    }
    target = tmp_path / "copy.safetensors"
    digest = select._write_cache(target, tensors, [])
    back = load_file(target)
    assert back.keys() == tensors.keys() and all(torch.equal(back[k], v) for k, v in tensors.items())
    assert digest == integrity.digest_file(target) == select._write_cache(None, tensors, [])
    assert integrity.verify(target) and not list(tmp_path.glob("*.partial"))


def test_a_compile_on_windows_links_openmp_in_as_the_prebuilt_dlls_do() -> None:
    """kernel.py compiles on a user's machine with the link packaging/build_kernels.py gives the Windows package's
    DLLs (libgomp inside the DLL: a library whose dependency is missing never loads, error 126)."""
    assert kernel.WINDOWS_LINK == load_build_kernels().WINDOWS_LINK == ("-static",)
