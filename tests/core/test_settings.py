from __future__ import annotations

from pathlib import Path

import pytest

from app.core.chat.sampling import SamplingParams
from app.core.errors import InvalidSettingError
from app.core.settings import Settings, load_settings, save_settings, settings_path


def test_defaults_round_trip_through_disk() -> None:
    settings = Settings(model="/models/x", quantization="int8", sampling=SamplingParams(temperature=0, seed=3))
    save_settings(settings)
    assert load_settings() == settings
    assert settings_path().is_file()


def test_missing_file_gives_defaults() -> None:
    assert load_settings() == Settings()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"quantization": "q9"}, "quantization must be one of"),
        ({"device": "tpu"}, "device must be one of"),
        ({"theme": "neon"}, "theme must be one of"),
        ({"context_length": 4}, "at least 16 tokens"),
        ({"server_port": 70000}, "server port.*0 to 65535"),
        ({"server_parallel": 0}, "replies decoded together must be 1 to 16"),
        ({"server_parallel": 17}, "replies decoded together must be 1 to 16"),
    ],
)
def test_bad_values_are_named(changes: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidSettingError, match=message):
        Settings(**changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top-p"),
        ({"top_k": -2}, "top-k"),
        ({"min_p": 1.5}, "min-p"),
        ({"repetition_penalty": 0}, "repetition penalty"),
        ({"max_new_tokens": 0}, "max new tokens"),
    ],
)
def test_bad_sampling_values_are_named(changes: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidSettingError, match=message):
        SamplingParams(**changes)  # type: ignore[arg-type]


def test_broken_settings_file_is_reported_not_overwritten(hearth_home: Path) -> None:
    path = settings_path()
    path.write_text("{not json")
    with pytest.raises(InvalidSettingError, match="is not valid JSON"):
        load_settings()
    assert path.read_text() == "{not json"
    path.write_text('{"quantization": "q9"}')
    with pytest.raises(InvalidSettingError, match="quantization"):
        load_settings()


def test_a_failed_write_leaves_the_old_file(monkeypatch: pytest.MonkeyPatch) -> None:
    save_settings(Settings(system_prompt="old"))
    import os

    def boom(*args: object, **kwargs: object) -> None:  # the new text written, its sync refused: a full disk
        raise OSError("disk full")

    with monkeypatch.context() as patch:
        patch.setattr(os, "fsync", boom)
        with pytest.raises(OSError, match="disk full"):
            save_settings(Settings(system_prompt="new"))
    assert load_settings().system_prompt == "old"
    assert [p.name for p in settings_path().parent.iterdir()] == ["settings.json"]


def test_sampling_edges_are_inside_their_ranges() -> None:
    edges = SamplingParams(temperature=0, top_p=1, top_k=0, min_p=0, repetition_penalty=1e-6, max_new_tokens=1)
    assert edges.greedy and edges.top_p == 1.0 and isinstance(edges.top_p, float) and edges.max_new_tokens == 1
    assert not SamplingParams(temperature=1e-6).greedy
    for changes, message in (
        ({"top_p": 1.0000001}, r"top-p must be in \(0, 1\] \(got 1.0000001\)"),
        ({"min_p": 1}, r"min-p must be in \[0, 1\) \(got 1\)"),
        ({"temperature": -1e-9}, "temperature must be 0 or more"),
        ({"top_k": -1}, r"top-k must be 0 \(off\) to 2147483647 \(got -1\)"),
        ({"repetition_penalty": 0.0}, "repetition penalty must be above 0"),
        ({"max_new_tokens": 0}, r"max new tokens must be at least 1 \(got 0\)"),
    ):
        with pytest.raises(InvalidSettingError, match=message):
            SamplingParams(**changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"temperature": "0.7"}, r'temperature must be a finite number \(got "0.7"\)'),
        ({"seed": True}, "seed must be"),
        ({"top_k": 2.5}, "top-k must be"),
        ({"temperature": float("inf")}, "temperature must be"),
        ({"top_p": float("nan")}, "top-p must be"),
    ],
)
def test_sampling_is_strict_about_types(changes: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidSettingError, match=message):
        SamplingParams(**changes)  # type: ignore[arg-type]


def test_sampling_from_a_dict_ignores_unknown_keys_and_refuses_bad_values() -> None:
    params = SamplingParams.from_dict({"temperature": 0.2, "seed": 9, "beam_width": 4})
    assert params == SamplingParams(temperature=0.2, seed=9)
    assert SamplingParams.from_dict(params.to_dict()) == params
    with pytest.raises(InvalidSettingError, match="temperature"):
        SamplingParams.from_dict({"temperature": -3})
