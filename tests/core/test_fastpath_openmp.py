"""libgomp's spin count for the whole process: set by the app's entry points before torch loads the runtime, never
over the user's own choice."""

from __future__ import annotations

import os

import pytest

from app import cli, gui
from app.core.fastpath import openmp


@pytest.fixture
def unset(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv(openmp.SPIN_ENV, raising=False)
    monkeypatch.delenv(openmp.WAIT_POLICY_ENV, raising=False)
    return monkeypatch


def test_a_process_without_a_setting_gets_the_short_spin() -> None:
    environ: dict[str, str] = {}
    assert openmp.prefer_short_spin(environ)
    assert environ == {openmp.SPIN_ENV: openmp.OPENMP_SPIN_COUNT}


@pytest.mark.parametrize(("name", "value"), [("GOMP_SPINCOUNT", "300000"), ("OMP_WAIT_POLICY", "ACTIVE")])
def test_the_users_own_setting_stands(name: str, value: str) -> None:
    environ = {name: value}
    assert not openmp.prefer_short_spin(environ)
    assert environ == {name: value}


def test_the_command_line_sets_it_before_anything_else(unset: pytest.MonkeyPatch) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--version"])  # argparse exits here: nothing has imported torch yet

    assert os.environ[openmp.SPIN_ENV] == openmp.OPENMP_SPIN_COUNT


def test_the_window_sets_it_before_anything_else(unset: pytest.MonkeyPatch) -> None:
    unset.setenv(openmp.WAIT_POLICY_ENV, "PASSIVE")  # a user's choice: left as it is
    with pytest.raises(SystemExit):
        gui.main(["--help"])

    assert openmp.SPIN_ENV not in os.environ and os.environ[openmp.WAIT_POLICY_ENV] == "PASSIVE"
    unset.delenv(openmp.WAIT_POLICY_ENV)
    with pytest.raises(SystemExit):
        gui.main(["--help"])
    assert os.environ[openmp.SPIN_ENV] == openmp.OPENMP_SPIN_COUNT
