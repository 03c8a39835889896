"""The engines registry: strict like settings, a damaged file explained and never rewritten; keys in the keyring."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.core.engines.remote import engines as reg
from app.core.errors import HearthError, InvalidSettingError
from app.core.storage import secrets
from tests.helpers import memory_keyring


@pytest.fixture
def keys() -> Iterator[memory_keyring.MemoryKeyring]:
    with memory_keyring.installed(memory_keyring.MemoryKeyring()) as backend:
        yield backend  # type: ignore[misc]


def test_add_list_and_remove_round_trip(keys: memory_keyring.MemoryKeyring) -> None:
    engine = reg.EngineConfig("box", base_url="http://gpu-box:8000/v1", key_name=reg.key_name_for("box"))
    reg.add_engine(engine)
    reg.save_key(engine.key_name or "", "sk-box-secret-123456")
    assert reg.load_engines().engines == (engine,)
    assert reg.key_for(engine) == "sk-box-secret-123456"
    assert keys.store[("hearth", "engine-key:box")] == "sk-box-secret-123456"
    assert "sk-box-secret" not in reg.engines_path().read_text()
    with pytest.raises(HearthError, match="An engine named 'box' exists"):
        reg.add_engine(engine)
    assert reg.remove_engine("box") and reg.load_engines().engines == ()
    assert ("hearth", "engine-key:box") not in keys.store  # the key went with it
    assert not reg.remove_engine("box")


def test_strict_values_name_the_field() -> None:
    with pytest.raises(InvalidSettingError, match="kind must be one of openai-compatible, anthropic"):
        reg.EngineConfig("x", kind="grpc")  # type: ignore[arg-type]
    with pytest.raises(InvalidSettingError, match=r"base URL must start with http:// or https://"):
        reg.EngineConfig("x", base_url="gpu-box:8000")
    with pytest.raises(InvalidSettingError, match="engine name must be letters, digits"):
        reg.EngineConfig("my box")


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"\xff\xfe{", "is not UTF-8 text"),
        (b'{"engines": [', "is not valid JSON"),
        (b"[1, 2]", 'does not hold a JSON object with an "engines" list'),
        (
            b'{"engines": [{"name": "a", "include_usage": "false"}]}',
            'include_usage must be true or false \\(got "false"\\)',
        ),
        (b'{"engines": [{"name": "a", "api_key": "sk-x"}]}', "engines\\[0\\].api_key is not a known engine field"),
        (b'{"engines": [{"name": "a"}, {"name": "a"}]}', "engine 'a' is listed twice"),
    ],
)
def test_a_damaged_file_is_explained_and_never_rewritten(content: bytes, why: str) -> None:
    path = reg.engines_path()
    path.write_bytes(content)
    found = reg.read_engines()
    assert found.unreadable and not found.ok
    with pytest.raises(reg.EnginesFileError, match=why):
        reg.load_engines()
    with pytest.raises(reg.EnginesFileError, match="left as it is: fix or delete it"):
        reg.add_engine(reg.EngineConfig("b"))
    assert path.read_bytes() == content


def test_a_key_the_keyring_lost_is_a_clear_error(keys: memory_keyring.MemoryKeyring) -> None:
    engine = reg.EngineConfig("openai", base_url="https://api.openai.com/v1", key_name=reg.key_name_for("openai"))
    with pytest.raises(HearthError, match="needs an API key, but the system keyring has none for it"):
        reg.key_for(engine)


def test_no_keyring_means_no_key_is_saved(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(secrets, "keyring_available", lambda: False)
    with pytest.raises(secrets.KeyringUnavailableError, match="Hearth never writes keys to files"):
        reg.save_key("engine-key:x", "sk-abcdefgh12345")


def test_keys_with_spaces_are_refused(keys: memory_keyring.MemoryKeyring) -> None:
    with pytest.raises(HearthError, match="An API key is one word without spaces"):
        reg.save_key("engine-key:x", "sk abc")


def test_unknown_engine_lists_the_known_ones() -> None:
    reg.add_engine(reg.EngineConfig("alpha"))
    with pytest.raises(HearthError, match=r"no engine named 'beta' \(known: alpha\)"):
        reg.get_engine("beta")


def test_presets_are_valid_engines() -> None:
    for name, preset in reg.PRESETS.items():
        engine = reg.EngineConfig(name, kind=preset.kind, base_url=preset.base_url)
        assert engine.kind in reg.ENGINE_KINDS
    assert reg.PRESETS["anthropic"].kind == "anthropic" and not reg.PRESETS["openai"].response_cache
    assert reg.PRESETS["ollama"].base_url.endswith(":11434/v1")


def test_the_file_is_written_atomically_as_json(tmp_path: Path) -> None:
    path = tmp_path / "engines.json"
    reg.save_engines([reg.EngineConfig("a")], path)
    data = json.loads(path.read_text())
    assert data["version"] == 1 and data["engines"][0]["name"] == "a"
    assert [p.name for p in tmp_path.iterdir()] == ["engines.json"]
