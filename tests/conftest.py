"""Shared fixtures: an isolated Hearth home per test, and the real default model loaded once per run."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO_ROOT = Path(__file__).resolve().parent.parent
# Converted models survive between runs here (gitignored): converting the default GGUF takes ~30 s.
MODEL_CACHE = Path(os.environ.get("HEARTH_TEST_CACHE", REPO_ROOT / ".cache" / "test-models"))


def pytest_configure(config: pytest.Config) -> None:
    MODEL_CACHE.mkdir(parents=True, exist_ok=True)
    os.environ["HEARTH_CACHE_DIR"] = str(MODEL_CACHE)


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


@pytest.fixture(autouse=True)
def hearth_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test gets fresh data and config dirs; the converted-model cache is shared."""
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
def default_folder(default_loaded: object) -> Path:
    """The converted (safetensors) folder of the default model: source of the tokenizer for tiny models."""
    return default_loaded.folder  # type: ignore[attr-defined,no-any-return]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, default_folder: Path):  # type: ignore[no-untyped-def]
    """Factory: build_tiny(arch, **overrides) -> folder, cached per (arch, overrides) for the run."""
    from tests.helpers.tiny_models import build_tiny_model

    built: dict[str, Path] = {}

    def build(arch: str, **overrides: object) -> Path:
        key = arch + repr(sorted(overrides.items()))
        if key not in built:
            folder = tmp_path_factory.mktemp(f"tiny-{arch}")
            built[key] = build_tiny_model(arch, folder, default_folder, **overrides)
        return built[key]

    return build
