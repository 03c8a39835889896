"""The engines registry: named remote endpoints in `engines.json` under the config dir; their keys in the keyring.

Same rules as settings.json: typed and strict, a damaged file is explained and never rewritten behind the user's
back. The file holds a key's *name* (the keyring username), never the key: keys live only in the OS keyring,
service "hearth", and every key read or saved is registered with the log redactor.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import keyring
import keyring.errors

from app.core.errors import HearthError, InvalidSettingError
from app.core.storage import paths, secrets
from app.core.storage.schema import Rule, check_fields, from_mapping, read_json_file, write_json_file

EngineKind = Literal["openai-compatible", "anthropic"]
ENGINE_KINDS: tuple[str, ...] = get_args(EngineKind)
ENGINES_VERSION = 1
KEY_USERNAME_PREFIX = "engine-key:"  # keyring username = prefix + engine name
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class EnginesFileError(HearthError):
    """engines.json could not be used; it was left as it is."""


@dataclass(frozen=True)
class EngineConfig:
    name: Annotated[str, Rule("name")]
    kind: Annotated[EngineKind, Rule("kind")] = "openai-compatible"
    base_url: Annotated[str, Rule("base URL")] = "http://127.0.0.1:8000/v1"
    # The keyring username of this engine's key; None = the server takes no key (local servers).
    key_name: Annotated[str | None, Rule("key name")] = None
    # Ask for `stream_options.include_usage` (token counts in the last chunk); some providers reject it.
    include_usage: Annotated[bool, Rule("include usage")] = True
    # Replay identical greedy replies from the response cache. Off for hosted models: a paid reply is
    # usually asked again on purpose, and a provider's model behind one name changes over time.
    response_cache: Annotated[bool, Rule("response cache")] = False
    default_model: Annotated[str | None, Rule("default model")] = None
    # What genai-prices calls the provider ("openai", "anthropic"); None = not priced (a local server).
    price_provider: Annotated[str | None, Rule("price provider")] = None

    def __post_init__(self) -> None:
        check_fields(self)
        if not _NAME.match(self.name):
            raise InvalidSettingError(
                f"engine name must be letters, digits, '.', '_' or '-' (at most 64, got {json.dumps(self.name)})"
            )
        if not re.match(r"^https?://[^/\s]+", self.base_url):
            raise InvalidSettingError(
                f"base URL must start with http:// or https:// and name a host (got {json.dumps(self.base_url)})"
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Preset:
    label: str
    kind: EngineKind
    base_url: str
    needs_key: bool
    include_usage: bool
    response_cache: bool
    price_provider: str | None
    hint: str


PRESETS: dict[str, Preset] = {
    "openai": Preset(
        "OpenAI",
        "openai-compatible",
        "https://api.openai.com/v1",
        True,
        True,
        False,
        "openai",
        "Hosted: an API key from platform.openai.com.",
    ),
    "anthropic": Preset(
        "Anthropic",
        "anthropic",
        "https://api.anthropic.com",
        True,
        False,
        False,
        "anthropic",
        "Hosted: the Messages API, an API key from console.anthropic.com.",
    ),
    "vllm": Preset(
        "vLLM",
        "openai-compatible",
        "http://127.0.0.1:8000/v1",
        False,
        True,
        True,
        None,
        "`vllm serve MODEL` (add --api-key to require one).",
    ),
    "tgi": Preset(
        "Text Generation Inference",
        "openai-compatible",
        "http://127.0.0.1:8080/v1",
        False,
        True,
        True,
        None,
        "TGI's Messages API; older versions send no usage in streams.",
    ),
    "sglang": Preset(
        "SGLang",
        "openai-compatible",
        "http://127.0.0.1:30000/v1",
        False,
        True,
        True,
        None,
        "`python -m sglang.launch_server --model-path MODEL`.",
    ),
    "ollama": Preset(
        "Ollama",
        "openai-compatible",
        "http://127.0.0.1:11434/v1",
        False,
        True,
        True,
        None,
        "Ollama's OpenAI-compatible /v1 (no key locally).",
    ),
    "llama-server": Preset(
        "llama.cpp llama-server",
        "openai-compatible",
        "http://127.0.0.1:8080/v1",
        False,
        True,
        True,
        None,
        "`llama-server -m model.gguf` (--api-key to require one).",
    ),
    "hearth": Preset(
        "Another Hearth",
        "openai-compatible",
        "http://127.0.0.1:8765/v1",
        False,
        True,
        True,
        None,
        "Hearth's own server on another machine.",
    ),
    "custom": Preset(
        "Any OpenAI-compatible URL",
        "openai-compatible",
        "http://127.0.0.1:8000/v1",
        False,
        True,
        False,
        None,
        "Any server with /v1/chat/completions.",
    ),
}


def engines_path() -> Path:
    return paths.config_dir() / "engines.json"


@dataclass(frozen=True)
class EnginesFile:
    """What reading engines.json found; never raises."""

    path: Path
    engines: tuple[EngineConfig, ...]
    problems: tuple[str, ...] = ()
    unreadable: bool = False  # a file that did not parse, or held a bad entry: never saved over

    @property
    def ok(self) -> bool:
        return not self.problems

    def get(self, name: str) -> EngineConfig | None:
        return next((e for e in self.engines if e.name == name), None)


def read_engines(path: Path | None = None) -> EnginesFile:
    path = path or engines_path()
    if not path.exists():
        return EnginesFile(path, ())

    def unreadable(why: str) -> EnginesFile:
        return EnginesFile(path, (), (f"Engines file {path} {why}; it was left as it is: fix or delete it.",), True)

    data, why = read_json_file(path)
    if why:
        return unreadable(why)
    if not isinstance(data, dict) or not isinstance(data.get("engines"), list):
        return unreadable('does not hold a JSON object with an "engines" list')
    engines: list[EngineConfig] = []
    problems: list[str] = []
    for index, entry in enumerate(data["engines"]):
        where = f"engines[{index}]"
        if not isinstance(entry, dict):
            problems.append(f"{where} must be a JSON object")
            continue
        if not isinstance(entry.get("name"), str):
            problems.append(f"{where}.name must be text")
            continue
        parsed = from_mapping(EngineConfig, entry, prefix=f"{where}.")
        if parsed.problems or parsed.unknown_keys:
            problems.extend(p.message for p in parsed.problems)
            problems.extend(f"{key} is not a known engine field" for key in parsed.unknown_keys)
            continue
        engines.append(parsed.value)
    names = [e.name for e in engines]
    problems.extend(f"engine {n!r} is listed twice" for n in sorted({n for n in names if names.count(n) > 1}))
    if problems:
        line = f"Engines file {path}: {'; '.join(problems)}. It was left as it is: fix or delete it."
        return EnginesFile(path, tuple(engines), (line,), unreadable=True)
    return EnginesFile(path, tuple(engines))


def load_engines(path: Path | None = None) -> EnginesFile:
    """For commands: a damaged file is an error (one line), never run on half of it."""
    found = read_engines(path)
    if not found.ok:
        raise EnginesFileError(found.problems[0])
    return found


def save_engines(engines: tuple[EngineConfig, ...] | list[EngineConfig], path: Path | None = None) -> None:
    """Atomic write. Refuses to overwrite a file that could not be read (the user's to fix)."""
    path = path or engines_path()
    found = read_engines(path)
    if found.unreadable:
        raise EnginesFileError(found.problems[0])
    write_json_file(path, {"version": ENGINES_VERSION, "engines": [e.to_dict() for e in engines]})


def get_engine(name: str, path: Path | None = None) -> EngineConfig:
    found = load_engines(path)
    engine = found.get(name)
    if engine is None:
        known = ", ".join(e.name for e in found.engines) or "none yet"
        raise HearthError(f"There is no engine named {name!r} (known: {known}); add one with `hearth engines add`.")
    return engine


def add_engine(engine: EngineConfig, *, replace: bool = False, path: Path | None = None) -> None:
    found = load_engines(path)
    if found.get(engine.name) is not None and not replace:
        raise HearthError(f"An engine named {engine.name!r} exists; remove it first or choose another name.")
    save_engines([*(e for e in found.engines if e.name != engine.name), engine], path)


def remove_engine(name: str, path: Path | None = None) -> bool:
    """Remove the engine and its key; False if there was no such engine."""
    found = load_engines(path)
    engine = found.get(name)
    if engine is None:
        return False
    save_engines([e for e in found.engines if e.name != name], path)
    if engine.key_name:
        delete_key(engine.key_name)
    return True


# --- keys: the OS keyring only -------------------------------------------------------------------------------------


def key_name_for(engine_name: str) -> str:
    return KEY_USERNAME_PREFIX + engine_name


def save_key(key_name: str, key: str) -> None:
    key = key.strip()
    if not key or any(ch.isspace() for ch in key):
        raise HearthError("An API key is one word without spaces.")
    secrets.register_secret(key)
    if not secrets.keyring_available():
        raise secrets.KeyringUnavailableError(
            "No system keyring is available on this machine, so the API key cannot be saved "
            "(Hearth never writes keys to files)."
        )
    try:
        keyring.set_password(secrets.SERVICE, key_name, key)
    except keyring.errors.KeyringError as exc:
        raise secrets.SecretStoreError(
            f"The system keyring refused to store the key ({type(exc).__name__}); unlock it and try again."
        ) from None


def read_key(key_name: str) -> str | None:
    if not secrets.keyring_available():
        return None
    try:
        key = keyring.get_password(secrets.SERVICE, key_name)
    except keyring.errors.KeyringError:
        return None
    if key:
        secrets.register_secret(key)
    return key or None


def delete_key(key_name: str) -> None:
    if not secrets.keyring_available():
        return
    try:
        keyring.delete_password(secrets.SERVICE, key_name)
    except keyring.errors.PasswordDeleteError:
        pass
    except keyring.errors.KeyringError as exc:
        raise secrets.SecretStoreError(
            f"The system keyring refused to remove the key ({type(exc).__name__}); unlock it and try again."
        ) from None


def key_for(engine: EngineConfig) -> str | None:
    """The engine's key, or an error naming what to do when it needs one the keyring lacks."""
    if engine.key_name is None:
        return None
    key = read_key(engine.key_name)
    if key is None:
        raise HearthError(
            f"Engine {engine.name!r} needs an API key, but the system keyring has none for it; "
            f"set it with `hearth engines add {engine.name} --url {engine.base_url} --key --replace`."
        )
    return key
