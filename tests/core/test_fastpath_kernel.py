"""How the kernel library enters the process (app/core/fastpath/kernel.py): GCC's OpenMP runtime loads with it and
reads its spin count then, so the count Hearth picks is set around that load and nowhere else."""

from __future__ import annotations

import ctypes
import os
from typing import Any

import pytest

from app.core.fastpath import kernel, openmp


@pytest.fixture
def environment_at_load(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, str | None]]:
    """GOMP_SPINCOUNT and OMP_WAIT_POLICY as each hearth library load saw them; the library loaded afresh."""
    seen: list[dict[str, str | None]] = []
    real = ctypes.CDLL

    def spy(name: Any, *args: Any, **kwargs: Any) -> Any:
        if "hearth_decode" in str(name):
            seen.append({key: os.environ.get(key) for key in (openmp.SPIN_ENV, "OMP_WAIT_POLICY")})
        return real(name, *args, **kwargs)

    monkeypatch.setattr(kernel.ctypes, "CDLL", spy)
    monkeypatch.delenv(openmp.SPIN_ENV, raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    kernel.reset_library_for_tests()
    yield seen
    kernel.reset_library_for_tests()


def test_the_openmp_spin_count_is_set_only_while_the_library_loads(environment_at_load: list[Any]) -> None:
    library = kernel.load_library()
    if isinstance(library, str):
        pytest.skip(f"no kernel library here: {library}")
    assert environment_at_load[-1][openmp.SPIN_ENV] == openmp.OPENMP_SPIN_COUNT
    assert openmp.SPIN_ENV not in os.environ  # a process that did not set it keeps its environment as it was


@pytest.mark.parametrize(("name", "value"), [("GOMP_SPINCOUNT", "5"), ("OMP_WAIT_POLICY", "PASSIVE")])
def test_a_user_s_own_openmp_setting_is_left_alone(
    environment_at_load: list[Any], monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    library = kernel.load_library()
    if isinstance(library, str):
        pytest.skip(f"no kernel library here: {library}")
    assert environment_at_load[-1][name] == value
    if name == "OMP_WAIT_POLICY":
        assert environment_at_load[-1][openmp.SPIN_ENV] is None
    assert os.environ[name] == value
