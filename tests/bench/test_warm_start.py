"""The warm-start bench times real `hearth chat` processes and names the machine and the file it timed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench import warm_start


def test_it_times_fresh_processes_to_the_first_token(capsys: pytest.CaptureFixture[str]) -> None:
    assert warm_start.main(["--runs", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("machine: ") and "model: SmolLM2-135M-Instruct.Q4_1.gguf (Q4_1" in out
    [line] = [line for line in out.splitlines() if line.startswith("to the first token")]
    first, to_exit = map(float, re.findall(r"median (\d+\.\d+) s", line))
    assert 0 < first <= to_exit


def test_a_failing_command_is_said_with_its_error(tmp_path: Path) -> None:
    env = warm_start.side_environment(warm_start.ROOT, tmp_path / "side")
    with pytest.raises(SystemExit, match=r"hearth chat failed in .* \(exit 2\): hearth: No model at .*gone\.gguf"):
        warm_start.timed_run(warm_start.ROOT, tmp_path / "gone.gguf", env)
