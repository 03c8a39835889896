"""Where Hearth keeps its data, settings and caches (platformdirs; HEARTH_HOME overrides all three)."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

from app import APP_ID


def _root_override() -> Path | None:
    home = os.environ.get("HEARTH_HOME")
    return Path(home).expanduser() if home else None


def _ensure(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def data_dir() -> Path:
    """Conversations database and other user data."""
    root = _root_override()
    return _ensure(root / "data" if root else Path(platformdirs.user_data_dir(APP_ID, appauthor=False)))


def config_dir() -> Path:
    """settings.json."""
    root = _root_override()
    return _ensure(root / "config" if root else Path(platformdirs.user_config_dir(APP_ID, appauthor=False)))


def cache_dir() -> Path:
    """Converted GGUF models, response cache: safe to delete, rebuilt on demand (HEARTH_CACHE_DIR overrides)."""
    if override := os.environ.get("HEARTH_CACHE_DIR"):
        return _ensure(Path(override).expanduser())
    root = _root_override()
    return _ensure(root / "cache" if root else Path(platformdirs.user_cache_dir(APP_ID, appauthor=False)))


def log_dir() -> Path:
    root = _root_override()
    return _ensure(root / "logs" if root else Path(platformdirs.user_log_dir(APP_ID, appauthor=False)))


def converted_models_dir() -> Path:
    return _ensure(cache_dir() / "converted")
