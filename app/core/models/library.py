"""The model library: every model on this machine and the curated recommendations (verdicts: app.core.memory.verdict).

On disk: the embedded default, repos in the Hugging Face cache, and folders or GGUF files the user added (a JSON list
in the config dir; removing one from the library never deletes the user's files). Copies of GGUF files an older Hearth
converted are no models of their own: `cached_conversions` lists them apart, so that they can be removed.
Torch-free: the library window lists models before torch is imported (the planner may import it lazily).
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from app.core.errors import HearthError, ModelNotFoundError
from app.core.models.model_source import DEFAULT_MODEL_NAME, default_model_gguf
from app.core.storage import paths
from app.core.storage.schema import write_json_file

log = logging.getLogger(__name__)

ModelKind = Literal["default", "hub", "converted", "folder", "gguf"]


class LibraryError(HearthError):
    pass


@dataclass(frozen=True)
class LibraryModel:
    name: str
    kind: ModelKind
    path: Path
    size_bytes: int
    spec: str  # what `--model` (and Settings → Default model) takes
    architecture: str | None = None
    context_length: int | None = None
    parameters: int | None = None  # counted from the weights when that is cheap (GGUF), else from the planner
    complete: bool = True  # False: weights missing (a paused download)
    config: dict[str, Any] | None = field(default=None, compare=False, repr=False)

    @property
    def deletable(self) -> bool:
        return self.kind != "default"

    @property
    def delete_action(self) -> str:
        """What Delete does, in words for a confirmation dialog."""
        if self.kind in ("folder", "gguf"):
            return f"Remove {self.name} from the library (the files at {self.path} are kept)"
        return f"Delete {self.name} from disk ({self.size_bytes / 1e9:.2f} GB)"


@dataclass(frozen=True)
class RecommendedModel:
    repo_id: str
    name: str
    size_class: str
    parameters: int
    licence: str
    gated: bool
    description: str
    config: dict[str, Any]
    gguf_repo: str | None = None
    gguf_file: str | None = None

    @property
    def context_length(self) -> int | None:
        value = self.config.get("max_position_embeddings")
        return int(value) if isinstance(value, int) else None


# --- models on disk ------------------------------------------------------------------------------------------------


def _tree_size(path: Path) -> int:
    """Bytes on disk: symlinks (the Hub cache's snapshots) are not counted twice."""
    if path.is_file():
        return path.stat().st_size
    total = 0
    for item in path.rglob("*"):
        if item.is_file() and not item.is_symlink():
            total += item.stat().st_size
    return total


def read_config(folder: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def describe_config(config: dict[str, Any] | None) -> tuple[str | None, int | None]:
    if not config:
        return None, None
    text = config.get("text_config")
    merged = {**text, **config} if isinstance(text, dict) else config
    arch = merged.get("model_type")
    context = merged.get("max_position_embeddings")
    return (str(arch) if arch else None), (int(context) if isinstance(context, int) else None)


def _gguf_entry(path: Path, *, name: str, kind: ModelKind, spec: str) -> LibraryModel:
    from app.core.models.gguf_meta import gguf_summary

    config: dict[str, Any] | None
    try:
        config, parameters = gguf_summary(path)
    except (HearthError, OSError):
        config, parameters = None, None
    arch, context = describe_config(config)
    return LibraryModel(
        name=name,
        kind=kind,
        path=path,
        size_bytes=path.stat().st_size if path.exists() else 0,
        spec=spec,
        architecture=arch,
        context_length=context,
        parameters=parameters,
        config=config,
    )


def _folder_entry(folder: Path, *, name: str, kind: ModelKind, spec: str, size: int | None = None) -> LibraryModel:
    config = read_config(folder)
    ggufs = sorted(folder.glob("*.gguf")) if folder.is_dir() else []
    has_weights = folder.is_dir() and any(folder.glob("*.safetensors"))
    if config is None and ggufs:
        entry = _gguf_entry(ggufs[0], name=name, kind=kind, spec=spec)
        return LibraryModel(**{**entry.__dict__, "path": folder, "size_bytes": size or _tree_size(folder)})
    arch, context = describe_config(config)
    return LibraryModel(
        name=name,
        kind=kind,
        path=folder,
        size_bytes=size if size is not None else _tree_size(folder),
        spec=spec,
        architecture=arch,
        context_length=context,
        complete=has_weights or bool(ggufs),
        config=config,
    )


def _default_entry() -> LibraryModel | None:
    try:
        gguf = default_model_gguf()
    except HearthError:
        return None
    return _gguf_entry(gguf, name=f"{DEFAULT_MODEL_NAME} (default)", kind="default", spec="default")


def _hub_entries() -> list[LibraryModel]:
    from huggingface_hub import scan_cache_dir

    from app.core.models.hub import hub_cache_dir

    cache = hub_cache_dir()
    if not cache.is_dir():
        return []
    try:
        info = scan_cache_dir(cache)
    except Exception as exc:  # an unreadable cache: list the rest
        log.warning("cannot scan the Hugging Face cache at %s: %s", cache, exc)
        return []
    found = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id.lower()):
        if repo.repo_type != "model" or not repo.revisions:
            continue
        newest = max(repo.revisions, key=lambda r: r.last_modified)
        repo_path = Path(repo.repo_path)
        found.append(
            _folder_entry(
                Path(newest.snapshot_path), name=repo.repo_id, kind="hub", spec=repo.repo_id, size=_tree_size(repo_path)
            )
        )
    return found


def cached_conversions() -> list[LibraryModel]:
    """Copies of GGUF files converted by Hearth before 2026-12 (it now reads a GGUF itself): never listed as models,
    shown apart so that `hearth rm NAME` can free their space."""
    found = []
    for folder in sorted(paths.converted_models_dir().iterdir()):
        if folder.is_dir() and not folder.name.startswith(".") and (folder / "config.json").is_file():
            found.append(_folder_entry(folder, name=folder.name, kind="converted", spec=str(folder)))
    return found


def _user_list_path() -> Path:
    return paths.config_dir() / "library.json"


def user_paths() -> list[Path]:
    try:
        data = json.loads(_user_list_path().read_text(encoding="utf-8"))
        return [Path(p) for p in data.get("paths", []) if isinstance(p, str)]
    except (OSError, json.JSONDecodeError, AttributeError):
        return []


def _save_user_paths(items: list[Path]) -> None:
    write_json_file(_user_list_path(), {"paths": [str(p) for p in items]})


def add_path(path: Path) -> LibraryModel:
    """Add a model folder or .gguf file the user keeps elsewhere; checked now, so a typo is reported at once."""
    path = path.expanduser().resolve()
    if not path.exists():
        raise ModelNotFoundError(f"No model at {path}: the path does not exist.")
    if path.is_file() and path.suffix.lower() != ".gguf":
        raise LibraryError(f"{path} is neither a model folder nor a .gguf file.")
    if path.is_dir() and not (path / "config.json").is_file() and not any(path.glob("*.gguf")):
        raise LibraryError(f"{path} has no config.json or .gguf file: it is not a model folder.")
    items = user_paths()
    if path not in items:
        _save_user_paths([*items, path])
    return _user_entry(path)


def remove_path(path: Path) -> bool:
    items = user_paths()
    kept = [p for p in items if p != path]
    if len(kept) != len(items):
        _save_user_paths(kept)
    return len(kept) != len(items)


def _user_entry(path: Path) -> LibraryModel:
    if path.is_file():
        return _gguf_entry(path, name=path.name, kind="gguf", spec=str(path))
    return _folder_entry(path, name=path.name, kind="folder", spec=str(path))


def list_models() -> list[LibraryModel]:
    """Everything loadable without a download, default first."""
    found: list[LibraryModel] = []
    if (default := _default_entry()) is not None:
        found.append(default)
    found.extend(_hub_entries())
    for path in user_paths():
        if path.exists():
            found.append(_user_entry(path))
    return found


def find_model(query: str) -> LibraryModel:
    """A model by name, spec or path; Hearth's cached conversions too (`hearth rm` deletes one by name)."""
    models = list_models() + cached_conversions()
    for model in models:
        if query in (model.name, model.spec, str(model.path)):
            return model
    names = ", ".join(m.spec for m in models) or "none"
    raise ModelNotFoundError(f"No model named {query!r} in the library (models: {names}).")


def delete_model(model: LibraryModel) -> str:
    """Delete a downloaded or converted model, or forget a user-added path; returns what was done."""
    if model.kind == "default":
        raise LibraryError(
            f"{model.name} is part of the installation and cannot be deleted (it is {model.size_bytes / 1e6:.0f} MB)."
        )
    if model.kind in ("folder", "gguf"):
        remove_path(model.path)
        return f"Removed {model.name} from the library; the files at {model.path} were kept."
    if model.kind == "hub":
        from app.core.models.hub import forget_pending, hub_cache_dir

        target = model.path
        cache = hub_cache_dir().resolve()
        while target.parent.resolve() != cache and target.parent != target:
            target = target.parent  # from the snapshot folder up to models--org--name
        if target.parent.resolve() != cache:
            raise LibraryError(f"{model.path} is not inside the Hugging Face cache; nothing was deleted.")
        for pending in [p for p in _pending() if p.repo_id == model.spec]:
            forget_pending(pending.repo_id, pending.file)
    else:
        target = model.path
        if target.resolve().parent != paths.converted_models_dir().resolve():
            raise LibraryError(f"{model.path} is not inside Hearth's cache; nothing was deleted.")
    try:
        shutil.rmtree(target)
    except OSError as exc:
        raise LibraryError(f"Could not delete {target}: {exc.strerror or exc}.") from exc
    return f"Deleted {model.name} ({model.size_bytes / 1e9:.2f} GB freed)."


def _pending() -> list[Any]:
    from app.core.models.hub import pending_downloads

    return pending_downloads()


# --- the curated list ----------------------------------------------------------------------------------------------


def recommended_models() -> list[RecommendedModel]:
    """resources/models/recommended.json, small to large."""
    from app.resources import resource_path

    path = resource_path("models", "recommended.json")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return [RecommendedModel(**item) for item in data["models"]]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise LibraryError(f"The bundled list of recommended models ({path}) is unreadable: {exc}.") from exc
