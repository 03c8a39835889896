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
