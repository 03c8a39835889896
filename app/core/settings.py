"""The one typed settings object, persisted as JSON in the config dir.

Secrets never live here: Hub tokens go to the OS keyring (app.core.storage.secrets).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import Field

from app.core.chat.sampling import SamplingParams
from app.core.errors import InvalidSettingError
from app.core.models.quant import Quantization
from app.core.storage import paths
from app.core.storage.schema import Rule, check_fields, from_mapping, read_json_file, write_json_file

DeviceChoice = Literal["auto", "cuda", "cpu", "mps"]
Theme = Literal["system", "light", "dark"]
ContextPolicy = Literal["error", "drop-oldest"]

DEVICES: tuple[str, ...] = get_args(DeviceChoice)
THEMES: tuple[str, ...] = get_args(Theme)
CONTEXT_POLICIES: tuple[str, ...] = get_args(ContextPolicy)

SETTINGS_VERSION = 1
DEFAULT_PARALLEL = 4  # replies a server decodes together where the model can (llama-server's --parallel)
MAX_PARALLEL = 16  # the most `hearth serve --parallel`, `hearth plan --parallel` and the window's server take


@dataclass(frozen=True)
class Settings:
    # Each annotation is the field's schema (app.core.storage.schema): strict types, ranges, and the name errors use.
    model: Annotated[str | None, Rule("model")] = None  # None = the embedded default model
    quantization: Annotated[Quantization, Rule("quantization")] = "auto"
    device: Annotated[DeviceChoice, Rule("device")] = "auto"
    # None = the model's maximum
    context_length: Annotated[int | None, Field(ge=16), Rule("context length", "at least 16 tokens")] = None
    system_prompt: Annotated[str, Rule("system prompt")] = "You are a helpful assistant."
    sampling: SamplingParams = field(default_factory=SamplingParams)
    context_policy: Annotated[ContextPolicy, Rule("context policy")] = "error"
    theme: Annotated[Theme, Rule("theme")] = "system"
    response_cache: Annotated[bool, Rule("response cache")] = True
    # prompts' KV blocks kept on disk (GiB; 0 = off): a document is prefilled once, across restarts. Never more than
    # a quarter of the disk's free space.
    prompt_cache_gib: Annotated[float, Field(ge=0, le=1024), Rule("prompt cache size", "0 to 1024 GiB")] = 4.0
    # prompt-lookup decoding: guesses copied from the conversation, checked in one forward, used where the model's
    # own picks match (the same tokens as plain decode) and only as many as measure faster (false: never)
    prompt_lookup: Annotated[bool, Rule("prompt lookup")] = True
    # the largest document file read into a prompt
    attachment_limit_mb: Annotated[int, Field(ge=1), Rule("attachment limit", "at least 1 MB")] = 50
    # For local replies, what the same tokens would have cost on this hosted model, as genai-prices names it
    # ("provider/model", e.g. "openai/gpt-4o-mini"); None = off. An estimate from the bundled price list.
    compare_cost_with: Annotated[
        str | None,
        Field(pattern=r"^[A-Za-z0-9_.-]+/\S+$"),
        Rule("compare cost with", "provider/model, e.g. openai/gpt-4o-mini"),
    ] = None
    # the window's Server switch listens on 127.0.0.1 at this port (0 = any free port)
    server_port: Annotated[int, Field(ge=0, le=65535), Rule("server port", "0 to 65535")] = 8080
    # replies that server decodes together where the model can (each with its own KV cache)
    server_parallel: Annotated[
        int, Field(ge=1, le=MAX_PARALLEL), Rule("replies decoded together", f"1 to {MAX_PARALLEL}")
    ] = DEFAULT_PARALLEL
    # Safety opt-ins: only a JSON `true` switches them on (strict bool); anything else is an error.
    allow_pickle: Annotated[bool, Rule("allow pickle")] = False
    trust_remote_code: Annotated[bool, Rule("trust remote code")] = False

    def __post_init__(self) -> None:
        check_fields(self)

    def with_changes(self, **changes: Any) -> Settings:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["version"] = SETTINGS_VERSION
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Settings:
        """Strict: the first bad value raises InvalidSettingError naming its key."""
        parsed = from_mapping(cls, data, ignore=FILE_ONLY_KEYS)
        if parsed.problems:
            raise InvalidSettingError(parsed.problems[0].message)
        settings: Settings = parsed.value
        return settings


SAFETY_OPT_INS: tuple[str, ...] = ("allow_pickle", "trust_remote_code")
FILE_ONLY_KEYS = frozenset({"version"})


@dataclass(frozen=True)
class SettingsFile:
    """What reading settings.json found. Never raises: the front ends decide what to do with the problems."""

    path: Path
    settings: Settings  # the file's valid values, defaults for everything else
    problems: tuple[str, ...] = ()  # values rejected (their defaults kept), or why the file could not be read
    unknown_keys: tuple[str, ...] = ()  # reported, not fatal
    unreadable: bool = False  # the file did not parse at all: run on defaults, never rewrite it

    @property
    def ok(self) -> bool:
        return not self.problems

    def error_line(self) -> str:
        """One line for the command line and the window's banner."""
        if self.unreadable:
            return self.problems[0]
        kept = "The default was kept" if len(self.problems) == 1 else "The defaults were kept"
        return f"Settings file {self.path}: {'; '.join(self.problems)}. {kept}; fix or delete the file."

    def window_line(self) -> str:
        """The banner's text: the window runs anyway, on defaults where the file could not be used."""
        running = "on the default settings" if self.unreadable else "with the defaults in their place"
        return f"{self.error_line()} Hearth is running {running}; saving settings keeps this file as .rejected."

    def unknown_line(self) -> str:
        keys = ", ".join(self.unknown_keys)
        return f"Settings file {self.path}: unknown setting{'s' if len(self.unknown_keys) > 1 else ''} {keys} ignored."


def settings_path() -> Path:
    return paths.config_dir() / "settings.json"


def read_settings(path: Path | None = None) -> SettingsFile:
    """Read settings.json: a missing file gives the defaults, a damaged one a report (the file is left alone)."""
    path = path or settings_path()
    if not path.exists():
        return SettingsFile(path, Settings())

    def unreadable(why: str) -> SettingsFile:
        line = f"Settings file {path} {why}; it was left as it is: fix or delete it."
        return SettingsFile(path, Settings(), (line,), unreadable=True)

    data, why = read_json_file(path)
    if why:
        return unreadable(why)
    if not isinstance(data, dict):
        return unreadable(f"does not hold a JSON object (found {type(data).__name__})")
    parsed = from_mapping(Settings, data, ignore=FILE_ONLY_KEYS)
    problems = tuple(f"{p.message}, so it stays off" if p.key in SAFETY_OPT_INS else p.message for p in parsed.problems)
    return SettingsFile(path, parsed.value, problems, parsed.unknown_keys)


def load_settings(path: Path | None = None) -> Settings:
    """Settings for code that must not run on a half-understood file: any problem raises, naming the key."""
    found = read_settings(path)
    if not found.ok:
        raise InvalidSettingError(found.error_line())
    return found.settings


def keep_rejected_file(path: Path | None = None) -> Path | None:
    """Before settings are saved over a file Hearth could not fully read: keep that file beside, never lose it."""
    path = path or settings_path()
    if not path.exists():
        return None
    kept = path.with_name(f"{path.name}.rejected")
    kept.write_bytes(path.read_bytes())
    return kept


def save_settings(settings: Settings, path: Path | None = None) -> None:
    """Write atomically: a crash mid-write never leaves a half-written file."""
    write_json_file(path or settings_path(), settings.to_dict(), sort_keys=True)
