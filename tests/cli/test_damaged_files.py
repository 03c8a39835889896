"""Fault suite, command line: a damaged file Hearth owns gives one `hearth:` line and exit 2, or a recovery with a
note; user files stay byte-identical and the safety opt-ins stay off."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.cli import main
from app.core.models.model_source import default_model_gguf
from app.core.settings import settings_path
from app.core.storage.paths import cache_dir
from tests.helpers.damage import SETTINGS_FAULTS, random_bytes


def one_error_line(err: str) -> str:
    """The one error line (progress lines, which start with '·', aside)."""
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("· ")]
    assert len(lines) == 1, err
    assert lines[0].startswith("hearth: ") and "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize(("case", "data", "names"), SETTINGS_FAULTS, ids=[case for case, _, _ in SETTINGS_FAULTS])
def test_a_damaged_settings_file_stops_the_command_in_one_line_and_is_left_alone(
    case: str, data: bytes, names: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    assert main(["chat", "hi"]) == 2  # before any model is loaded
    line = one_error_line(capsys.readouterr().err)
    assert str(path) in line and names in line
    assert path.read_bytes() == data


def test_an_opt_in_written_as_a_string_says_it_stays_off(capsys: pytest.CaptureFixture[str]) -> None:
    settings_path().parent.mkdir(parents=True, exist_ok=True)
    settings_path().write_text('{"trust_remote_code": "true"}')
    assert main(["chat", "hi"]) == 2
    assert 'trust_remote_code must be true or false (got "true"), so it stays off' in capsys.readouterr().err


def test_unknown_settings_are_reported_not_fatal(capsys: pytest.CaptureFixture[str]) -> None:
    settings_path().parent.mkdir(parents=True, exist_ok=True)
    settings_path().write_text('{"theme": "dark", "colour": "red", "sampling": {"heat": 1}}')
    assert main(["models"]) == 0
    err = capsys.readouterr().err
    assert "hearth: warning:" in err and "unknown settings colour, sampling.heat ignored" in err


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("-t", "inf", "temperature must be a finite number (got Infinity)"),
        ("--top-p", "nan", "top-p must be a finite number (got NaN)"),
        ("--min-p=-inf", None, "min-p must be a finite number (got -Infinity)"),
        ("--repeat-penalty", "inf", "repetition penalty must be a finite number (got Infinity)"),
    ],
)
def test_non_finite_sampling_values_are_refused(
    flag: str, value: str | None, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["chat", flag, *([value] if value else []), "hi"]) == 2
    assert message in one_error_line(capsys.readouterr().err)


def test_a_truncated_gguf_is_named_as_incomplete(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    whole = default_model_gguf().read_bytes()
    cut = tmp_path / "SmolLM2-cut.gguf"
    cut.write_bytes(whole[: len(whole) - 4096])
    assert main(["chat", "--model", str(cut), "hi"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "SmolLM2-cut.gguf is an incomplete GGUF file" in line
    assert f"{len(whole) - 4096:,} bytes but its tensors need {len(whole):,}" in line


def test_a_damaged_response_cache_is_rebuilt_with_a_note(
    isolated_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    damaged = random_bytes(64 * 1024)
    (cache_dir() / "responses.sqlite").write_bytes(damaged)
    code = main(["chat", "-t", "0", "--max-tokens", "3", "Hi"])  # the torch-free runtime reads the same cache
    err = capsys.readouterr().err
    assert code == 0, err
    assert "hearth: note: The response cache" in err and "moved to responses.sqlite.damaged and rebuilt" in err
    assert (cache_dir() / "responses.sqlite.damaged").read_bytes() == damaged
