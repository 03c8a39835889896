"""The one typed settings object, persisted as JSON in the config dir.

Secrets never live here: Hub tokens go to the OS keyring (app.core.secrets).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal, get_args

from app.core import paths
from app.core.errors import InvalidSettingError
from app.core.sampling import SamplingParams

Quantization = Literal["auto", "nf4", "nf4-nodq", "int8", "bf16", "fp16", "fp32"]
DeviceChoice = Literal["auto", "cuda", "cpu", "mps"]
Theme = Literal["system", "light", "dark"]
ContextPolicy = Literal["error", "drop-oldest"]

QUANTIZATIONS: tuple[str, ...] = get_args(Quantization)
DEVICES: tuple[str, ...] = get_args(DeviceChoice)
THEMES: tuple[str, ...] = get_args(Theme)
CONTEXT_POLICIES: tuple[str, ...] = get_args(ContextPolicy)

SETTINGS_VERSION = 1


@dataclass(frozen=True)
class Settings:
    model: str | None = None  # None = the embedded default model
    quantization: Quantization = "auto"
    device: DeviceChoice = "auto"
    context_length: int | None = None  # None = the model's maximum
    system_prompt: str = "You are a helpful assistant."
    sampling: SamplingParams = field(default_factory=SamplingParams)
    context_policy: ContextPolicy = "error"
    theme: Theme = "system"
    response_cache: bool = True
    attachment_limit_mb: int = 50  # largest document file read into a prompt
    allow_pickle: bool = False
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        choices = {
            "quantization": QUANTIZATIONS,
            "device": DEVICES,
            "theme": THEMES,
            "context_policy": CONTEXT_POLICIES,
        }
        for name, allowed in choices.items():
            value = getattr(self, name)
            if value not in allowed:
                raise InvalidSettingError(
                    f"{name.replace('_', ' ')} must be one of {', '.join(allowed)} (got {value!r})"
                )
        if self.attachment_limit_mb < 1:
            raise InvalidSettingError(f"attachment limit must be at least 1 MB (got {self.attachment_limit_mb})")
        if self.context_length is not None and self.context_length < 16:
            raise InvalidSettingError(f"context length must be at least 16 tokens (got {self.context_length})")

    def with_changes(self, **changes: Any) -> Settings:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["version"] = SETTINGS_VERSION
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Settings:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if isinstance(values.get("sampling"), dict):
            values["sampling"] = SamplingParams.from_dict(values["sampling"])
        return cls(**values)


def settings_path() -> Path:
    return paths.config_dir() / "settings.json"


def load_settings(path: Path | None = None) -> Settings:
    """Read settings; a missing file gives the defaults, a broken one a clear error."""
    path = path or settings_path()
    if not path.exists():
        return Settings()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise InvalidSettingError(f"Settings file {path} is unreadable ({exc}); fix or delete it.") from exc
    if not isinstance(data, dict):
        raise InvalidSettingError(f"Settings file {path} does not hold a JSON object; fix or delete it.")
    try:
        return Settings.from_dict(data)
    except (TypeError, InvalidSettingError) as exc:
        raise InvalidSettingError(f"Settings file {path}: {exc}") from exc


def save_settings(settings: Settings, path: Path | None = None) -> None:
    """Write atomically: a crash mid-write never leaves a half-written file."""
    path = path or settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".settings-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(settings.to_dict(), handle, indent=2, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
