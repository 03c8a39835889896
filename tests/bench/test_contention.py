"""bench/contention.py's competitors: where they run, and the scheduler setting the bench names."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench import contention


@pytest.mark.skipif(not hasattr(os, "getsid"), reason="sessions are POSIX")
@pytest.mark.parametrize("apart", [False, True])
def test_competitors_share_the_bench_s_session_unless_apart(apart: bool) -> None:
    busy = contention.competitors(1, apart)
    try:
        assert busy[0].poll() is None  # still spinning
        assert (os.getsid(busy[0].pid) != os.getsid(0)) == apart
    finally:
        contention.stop(busy)
    assert busy[0].returncode is not None


def test_the_autogroup_setting_is_named_or_said_to_be_absent(tmp_path: Path) -> None:
    setting = tmp_path / "sched_autogroup_enabled"
    for text, named in (("1\n", "on"), ("0\n", "off"), ("2\n", "?")):
        setting.write_text(text)
        assert contention.autogroup(setting) == named
    assert contention.autogroup(tmp_path / "missing") == "none"


def test_the_table_has_a_row_per_runtime_and_level_with_ratios_paired_per_trial() -> None:
    speed = {
        ("hearth:auto", 0): [300.0, 200.0], ("hearth:auto", 1): [150.0, 50.0],
        ("hearth:torch", 0): [400.0, 100.0], ("hearth:torch", 1): [100.0, 100.0],
        ("llama", 0): [100.0, 100.0], ("llama", 1): [10.0, 20.0],
    }  # fmt: skip
    lines = contention.table(speed, [0, 1], ["auto", "torch"], "Q4_1 file")
    assert "Hearth / llama.cpp (Q4_1 file)" in lines[0]
    assert lines[2:] == [
        "| auto | 0 | 250.0 | 100.0 | 2.50× | 100% | 100% |",
        "| auto | 1 | 100.0 | 15.0 | 8.75× | 38% | 15% |",  # pairs 15× and 2.5×; shares 50 % and 25 %
        "| torch | 0 | 250.0 | 100.0 | 2.50× | 100% | 100% |",
        "| torch | 1 | 100.0 | 15.0 | 7.50× | 62% | 15% |",  # shares 25 % and 100 %: paired, not medians' ratio
    ]


def test_a_runtime_it_does_not_know_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert contention.main(["--runtime", "auto,lite"]) == 2
    assert "--runtime takes auto, torch, comma-separated (got 'auto,lite')" in capsys.readouterr().err
