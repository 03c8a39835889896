"""Shared fixtures: an isolated Hearth home per test, and the real default model loaded once per run."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.core.fastpath import kernel
from app.core.fastpath.openmp import prefer_short_spin

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
prefer_short_spin()  # libgomp's spin count as the app's entry points set it, before any test imports torch

REPO_ROOT = Path(__file__).resolve().parent.parent
# Hearth's derived files (packed copies, compiled kernels) survive between runs here (gitignored).
MODEL_CACHE = Path(os.environ.get("HEARTH_TEST_CACHE", REPO_ROOT / ".cache" / "test-models"))


def pytest_configure(config: pytest.Config) -> None:
    MODEL_CACHE.mkdir(parents=True, exist_ok=True)
    os.environ["HEARTH_CACHE_DIR"] = str(MODEL_CACHE)


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Which kernel variant each path chose on this machine, so that a failure report names it."""
    return kernel_report()


# CPU flags that decide a kernel variant somewhere (the fused step, oneDNN, torch), in the header's order.
VARIANT_FLAGS = (
    "amx_bf16", "amx_int8", "avx512_bf16", "avx512_vnni", "avx512f", "avx_vnni", "avx2", "fma", "asimddp", "asimd"
)  # fmt: skip
VARIANT_SWITCHES = ("HEARTH_KERNEL", "HEARTH_KERNEL_TARGET", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")


def kernel_report() -> list[str]:
    import platform

    import torch
    from threadpoolctl import threadpool_info

    from app.core.fastpath import cpu, prefill

    flags = cpu.cpu_flags()
    model = next(
        (line.split(":", 1)[1].strip() for line in _cpuinfo_lines() if line.startswith(("model name", "Model"))),
        platform.processor() or platform.machine(),
    )
    library = kernel.load_library()
    if isinstance(library, str):
        fused = f"fused step unavailable ({library})"
    else:
        q4 = kernel.q4_kernel_name(library.lib)
        tiles = ", GGUF prefill on AMX tiles" if library.lib.hearth_amx(-1) else ""
        threads = "OpenMP" if library.threaded else "1 thread"
        fused = f"fused step {library.origin or 'C kernel'} ({q4}{tiles}, {threads})"
    blas = [
        f"{pool.get('internal_api')} {pool.get('version')} ({pool.get('architecture') or '?'})"
        for pool in threadpool_info()
        if pool.get("user_api") == "blas"
    ]
    mkl = next(
        (line.split("Version", 1)[1].split("-")[0].strip() for line in _torch_config() if "Math Kernel" in line), ""
    )
    switches = [f"{name}={os.environ[name]}" for name in VARIANT_SWITCHES if os.environ.get(name)]
    return [
        f"cpu: {model}; {cpu.machine_arch()} {' '.join(f for f in VARIANT_FLAGS if f in flags) or 'no SIMD flags'}; "
        f"{torch.get_num_threads()} torch threads; switches: {' '.join(switches) or 'none'}",
        f"kernels: {fused}; lite runtime: the same library, numpy BLAS {', '.join(blas) or 'none found'}",
        f"kernels: torch {torch.__version__} cpu capability {torch.backends.cpu.get_cpu_capability()}, "
        f"{_onednn_line(prefill.native_bf16_gemm())}, BLAS {'MKL ' + mkl if mkl else 'not MKL'}",
    ]


def _cpuinfo_lines() -> list[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            return handle.read().split("\n\n", 1)[0].splitlines()
    except OSError:
        return []


def _torch_config() -> list[str]:
    import torch

    return str(torch.__config__.show()).splitlines()


def _onednn_line(native_bf16: bool) -> str:
    """oneDNN's version and ISA, and the kernel a bf16 linear layer runs, from oneDNN's own verbose lines (captured
    from the process's stdout once, before any test)."""
    import tempfile

    import torch

    if not torch.backends.mkldnn.is_available():
        return "no oneDNN"
    with tempfile.TemporaryFile() as sink:
        sys.stdout.flush()
        saved = os.dup(1)
        os.dup2(sink.fileno(), 1)
        try:
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON), torch.inference_mode():
                rows = torch.ones(16, 256, dtype=torch.bfloat16)
                torch.nn.functional.linear(rows, torch.ones(256, 256, dtype=torch.bfloat16))
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        sink.seek(0)
        lines = sink.read().decode(errors="replace").splitlines()
    version = next((line.split("info,", 1)[1].split(" (")[0] for line in lines if ",info,oneDNN" in line), "")
    isa = next((line.split("isa:", 1)[1] for line in lines if ",isa:" in line), "")
    gemm = next((line.split(",")[6] for line in lines if ",exec,cpu,matmul," in line), "")
    if not (native_bf16 and gemm):
        return "oneDNN unused for bf16 GEMMs (torch's own kernel; prefill upcasts them to fp32)"
    return f"{version} ({isa}), bf16 GEMM {gemm}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if not has_cuda:
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


def pytest_collection_finish(session: pytest.Session) -> None:
    # The packaging build runs beside the rest of the suite when this session tests it (tests/helpers/package_build).
    if session.config.option.collectonly:
        return
    if any(item.nodeid.startswith("tests/packaging/test_package.py") for item in session.items):
        from tests.helpers import package_build

        package_build.start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    from tests.helpers import package_build

    package_build.stop()


_RUN_LIBRARY: list[kernel.NativeLibrary | str] = []  # the library this run loaded first (the header loads it)


@pytest.fixture(autouse=True)
def run_kernel_library() -> Iterator[None]:
    """Every test starts and ends with the run's kernel library. A test or fixture that swaps it (compiling one of
    its own, capping its target, a module fixture forgetting it) hands it back: left unset, the next load would
    resolve it again in whatever cache that test isolated, and compile one (24-40 s at -O3) where the run has one."""
    _hold_the_run_s_library()
    yield
    _hold_the_run_s_library()


def _hold_the_run_s_library() -> None:
    held = kernel.held_library_for_tests()
    if not _RUN_LIBRARY and held is not None:
        _RUN_LIBRARY.append(held)
    if _RUN_LIBRARY and held is not _RUN_LIBRARY[0]:
        kernel.reset_library_for_tests(_RUN_LIBRARY[0])


@pytest.fixture(autouse=True)
def hearth_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test gets fresh data and config dirs; the cache of derived files is shared."""
    home = tmp_path / "hearth-home"
    monkeypatch.setenv("HEARTH_HOME", str(home))
    return home


@pytest.fixture
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private cache dir, for tests of the cache itself."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("HEARTH_CACHE_DIR", str(cache))
    return cache


@pytest.fixture(scope="session")
def run_library() -> kernel.NativeLibrary:
    """The kernel library this test run loaded (compiled here at -O3 -march=native, or prebuilt); a skip where there
    is none."""
    library = kernel.load_library()
    if isinstance(library, str):
        pytest.skip(f"no kernel library here: {library}")
    return library


@pytest.fixture
def first_compile_by_copy(
    run_library: kernel.NativeLibrary, isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[list[list[str]]]:
    """A process's first use of the kernel with nothing cached and nothing prebuilt (a private cache,
    HEARTH_KERNEL=compile), each compile publishing a copy of the run's library instead of running the compiler
    (tests.helpers.kernel_cache.compile_by_copy): for tests about what happens around a compile. Yields the flags of
    each compile asked for; the run's library is held again afterwards."""
    from tests.helpers.kernel_cache import compile_by_copy

    if kernel._compiler() is None:
        pytest.skip("no C compiler: a first use here would not compile")
    monkeypatch.setenv(kernel.KERNEL_ENV, "compile")
    asked = compile_by_copy(monkeypatch, run_library.path)
    kernel.reset_library_for_tests()
    yield asked
    kernel.reset_library_for_tests(run_library)


@pytest.fixture(scope="session")
def x86_kernel_builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The kernel as each shipped x86-64 target this CPU runs, at -O1, compiled once for the run
    (tests/helpers/x86_builds.py); a skip on a machine that is not x86-64 or has no gcc."""
    from tests.helpers.x86_builds import build_x86_libraries, x86_compiler

    compiler = x86_compiler()
    if compiler is None:
        pytest.skip("the x86 builds need an x86-64 CPU and gcc")
    return build_x86_libraries(compiler, tmp_path_factory.mktemp("x86-builds"))


@pytest.fixture(scope="session")
def default_loaded() -> Iterator[object]:
    """The embedded SmolLM2-135M-Instruct in bf16 on the CPU, loaded once for the whole run (the CPU default, q4, has
    its own tests: tests/core/test_fastpath_packed.py)."""
    from app.core.engines.loader import load_model

    yield load_model(None, quantization="bf16", device="cpu")


@pytest.fixture(scope="session")
def default_loaded_fp32() -> Iterator[object]:
    """The default model in fp32, for greedy-equality tests.

    In bf16 a token's KV computed in a one-token decode step and in a many-token prefill round differently
    (different kernels), which can flip a near-tie in greedy decoding; in fp32 both paths agree.
    """
    from app.core.engines.loader import load_model

    yield load_model(None, quantization="fp32", device="cpu")


@pytest.fixture(scope="session")
def default_tokenizer_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default model's tokenizer (tokenizer.json, tokenizer_config.json, chat template), written once per run from
    its GGUF: the tokenizer of the tiny models."""
    from app.core.models.gguf_tokenizer import build_with_transformers
    from app.core.models.model_source import default_model_gguf

    folder = tmp_path_factory.mktemp("default-tokenizer")
    build_with_transformers(default_model_gguf()).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def default_model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default model as a Hugging Face folder (fp32 safetensors, config, tokenizer), written once per run from its
    GGUF, for what needs a folder: the folder planner, the torch-free runtime's packed copy, transformers serve."""
    from tests.helpers.tiny_models import write_default_model_folder

    return write_default_model_folder(tmp_path_factory.mktemp("default-model"))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, default_tokenizer_folder: Path):  # type: ignore[no-untyped-def]
    """Factory: build_tiny(arch, **overrides) -> folder, cached per (arch, overrides) for the run."""
    from tests.helpers.tiny_models import build_tiny_model

    built: dict[str, Path] = {}

    def build(arch: str, **overrides: object) -> Path:
        key = arch + repr(sorted(overrides.items()))
        if key not in built:
            folder = tmp_path_factory.mktemp(f"tiny-{arch}")
            built[key] = build_tiny_model(arch, folder, default_tokenizer_folder, **overrides)
        return built[key]

    return build
