"""packaging/build_kernels.py as a module, for the tests that build prebuilt kernels."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO_ROOT = Path(__file__).resolve().parents[2]


def load_build_kernels() -> ModuleType:
    spec = importlib.util.spec_from_file_location("hearth_build_kernels", REPO_ROOT / "packaging" / "build_kernels.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["hearth_build_kernels"] = module
    spec.loader.exec_module(module)
    # These tests are about the manifest, the checks, the fallbacks and the links: -O1 builds the same floats in a
    # third of -O3's time (see test_native_integrity's compiled_only); the packaging test builds the real thing.
    module.COMMON_FLAGS = tuple("-O1" if flag == "-O3" else flag for flag in module.COMMON_FLAGS)
    return module
