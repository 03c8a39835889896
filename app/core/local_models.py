"""Models available on this machine without a download: the embedded default, the Hub cache, converted GGUFs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app.core import paths
from app.core.errors import HearthError
from app.core.model_source import DEFAULT_MODEL_NAME, default_model_gguf


@dataclass(frozen=True)
class LocalModel:
    name: str
    kind: str  # default, hub, converted
    path: Path
    size_bytes: int


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink()) + sum(
        p.resolve().stat().st_size for p in path.rglob("*") if p.is_symlink() and p.resolve().is_file()
    )


def list_local_models() -> list[LocalModel]:
    found: list[LocalModel] = []
    try:
        gguf = default_model_gguf()
        found.append(LocalModel(f"{DEFAULT_MODEL_NAME} (default)", "default", gguf, gguf.stat().st_size))
    except HearthError:
        pass
    try:
        from huggingface_hub import scan_cache_dir

        for repo in scan_cache_dir().repos:
            if repo.repo_type == "model":
                found.append(LocalModel(repo.repo_id, "hub", Path(repo.repo_path), repo.size_on_disk))
    except Exception:  # no Hub cache yet (CacheNotFound) or an unreadable one: nothing to list
        pass
    converted = paths.converted_models_dir()
    for folder in sorted(converted.iterdir()):
        if folder.is_dir() and not folder.name.startswith("."):
            found.append(LocalModel(folder.name, "converted", folder, _size(folder)))
    return found
