"""What a Hugging Face repo holds and what Hearth takes from it: the files (RepoFile), a reference typed by the user
(parse_repo_reference), the files a download fetches (select_files: safetensors or one GGUF, never pickle weights), a
download's plan and progress, and the errors a download ends in (each one sentence the user can act on). The network
side is app.core.models.hub; this module needs none.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

from app.core.errors import HearthError, ModelNotFoundError, UnsafeModelError
from app.core.models.model_source import PICKLE_SUFFIXES

WEIGHT_SUFFIXES = (".safetensors", ".gguf")
# The small files a model folder needs besides its weights (top level of the repo only).
SIDE_FILE_SUFFIXES = (".json", ".jinja", ".txt", ".model", ".tiktoken")
_REPO_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*$")


# --- errors (each one sentence the user can act on) ----------------------------------------------------------------


class HubError(HearthError):
    pass


class BadRepoReferenceError(HubError):
    pass


class RepoNotFoundError(HubError, ModelNotFoundError):
    pass


class HubFileNotFoundError(HubError, ModelNotFoundError):
    pass


class FileChoiceNeededError(HubError):
    def __init__(self, message: str, choices: list[str]) -> None:
        self.choices = choices
        super().__init__(message)


class NoSafeWeightsError(HubError, UnsafeModelError):
    pass


class GatedModelError(HubError):
    pass


class InvalidHubTokenError(HubError):
    pass


class HubUnreachableError(HubError):
    pass


class DiskFullError(HubError):
    def __init__(self, message: str, needed_bytes: int = 0, free_bytes: int = 0) -> None:
        self.needed_bytes = needed_bytes
        self.free_bytes = free_bytes
        super().__init__(message)


class CorruptDownloadError(HubError):
    pass


class DownloadCancelled(HubError):
    """Paused or cancelled by the user: what was fetched is kept for a resume unless it was discarded."""


# --- what a repo holds ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RepoFile:
    name: str
    size: int | None
    sha256: str | None = None  # LFS files: the Hub's checksum of the content

    @property
    def is_weight(self) -> bool:
        return self.name.lower().endswith(WEIGHT_SUFFIXES)


@dataclass(frozen=True)
class RepoRef:
    repo_id: str
    filename: str | None = None
    revision: str = "main"


@dataclass(frozen=True)
class DownloadPlan:
    repo_id: str
    revision: str  # the requested branch or tag
    commit: str  # pinned: every file comes from this commit
    files: tuple[RepoFile, ...]
    gated: bool
    license: str | None
    config: dict[str, Any] | None  # config.json, fetched before any weights
    gguf_files: tuple[RepoFile, ...] = ()  # every GGUF in the repo: the choice the UI offers
    choice: str | None = None  # the file the user picked (--file), if any
    present_bytes: int = 0  # already on disk (finished files and partial ones): a resume skips them

    @property
    def total_bytes(self) -> int:
        return sum(f.size or 0 for f in self.files)

    @property
    def remaining_bytes(self) -> int:
        return max(0, self.total_bytes - self.present_bytes)

    @property
    def label(self) -> str:
        return f"{self.repo_id} ({self.choice})" if self.choice else self.repo_id


@dataclass(frozen=True)
class DownloadProgress:
    repo_id: str
    file: str
    file_index: int  # 1-based
    file_count: int
    done_bytes: int
    total_bytes: int
    bytes_per_s: float | None  # measured over the last few seconds of this run; None before there is data
    eta_s: float | None
    stage: Literal["downloading", "verifying", "done"] = "downloading"

    @property
    def fraction(self) -> float:
        return min(1.0, self.done_bytes / self.total_bytes) if self.total_bytes else 1.0


ProgressCallback = Callable[[DownloadProgress], None]


def parse_repo_reference(text: str) -> RepoRef:
    """A repo id (`org/name`), or a Hub URL to a repo, a branch, or a file (`…/blob/main/x.gguf`)."""
    raw = text.strip()
    if not raw:
        raise BadRepoReferenceError("Give a Hugging Face repo id such as HuggingFaceTB/SmolLM2-360M-Instruct.")
    path = raw
    if "://" in raw or raw.startswith(("huggingface.co/", "hf.co/")):
        parsed = urlsplit(raw if "://" in raw else f"https://{raw}")
        path = parsed.path
    parts = [p for p in path.strip("/").split("/") if p]
    if parts and parts[0] == "models":
        parts = parts[1:]
    filename: str | None = None
    revision = "main"
    if len(parts) >= 4 and parts[2] in ("blob", "resolve", "tree"):
        revision = parts[3]
        if parts[2] != "tree" and len(parts) > 4:
            filename = "/".join(parts[4:])
        parts = parts[:2]
    repo_id = "/".join(parts)
    if not _REPO_ID.match(repo_id) or len(parts) > 2:
        raise BadRepoReferenceError(
            f"'{raw}' is not a Hugging Face repo id or model URL (expected e.g. HuggingFaceTB/SmolLM2-360M-Instruct)."
        )
    return RepoRef(repo_id=repo_id, filename=filename, revision=revision)


def select_files(
    files: list[RepoFile], repo_id: str, choice: str | None, shard_names: set[str] | None
) -> list[RepoFile]:
    """The files to fetch: safetensors or one GGUF, plus the side files; pickle weights never."""
    by_name = {f.name: f for f in files}
    top_level = [f for f in files if "/" not in f.name]
    side = [f for f in top_level if f.name.lower().endswith(SIDE_FILE_SUFFIXES)]
    if choice is not None:
        chosen = by_name.get(choice)
        if chosen is None:
            names = ", ".join(sorted(f.name for f in files if f.is_weight)) or "no weight files"
            raise HubFileNotFoundError(f"{repo_id} has no file '{choice}' (its weight files: {names}).")
        if chosen.name.lower().endswith(PICKLE_SUFFIXES):
            raise NoSafeWeightsError(_pickle_only_message(repo_id))
        if chosen.name.lower().endswith(".gguf"):  # a GGUF carries its own tokenizer and config
            return [f for f in side if f.name == "config.json"] + [chosen]
        return _unique([*side, chosen])
    safetensors = [f for f in top_level if f.name.lower().endswith(".safetensors")]
    if shard_names:
        safetensors = [f for f in safetensors if f.name in shard_names]
    elif len(safetensors) > 1:
        # Mistral-style repos ship the same weights twice (consolidated.safetensors and HF shards).
        safetensors = [f for f in safetensors if not f.name.startswith("consolidated")] or safetensors
    if safetensors:
        return _unique([*side, *safetensors])
    ggufs = gguf_files(files)
    if len(ggufs) == 1:
        return [f for f in side if f.name == "config.json"] + ggufs
    if ggufs:
        listing = ", ".join(f"{f.name} ({format_bytes(f.size)})" for f in ggufs)
        raise FileChoiceNeededError(
            f"{repo_id} holds {len(ggufs)} GGUF files; choose one with --file: {listing}.", [f.name for f in ggufs]
        )
    if any(f.name.lower().endswith(PICKLE_SUFFIXES) for f in files):
        raise NoSafeWeightsError(_pickle_only_message(repo_id))
    raise HubFileNotFoundError(f"{repo_id} has no model weights (no .safetensors or .gguf files).")


def gguf_files(files: list[RepoFile]) -> list[RepoFile]:
    return sorted((f for f in files if f.name.lower().endswith(".gguf")), key=lambda f: (f.size or 0, f.name))


def _unique(files: list[RepoFile]) -> list[RepoFile]:
    seen: dict[str, RepoFile] = {}
    for f in files:
        seen.setdefault(f.name, f)
    return list(seen.values())


def _pickle_only_message(repo_id: str) -> str:
    return (
        f"{repo_id} has only pickle weights (.bin/.pt), which can run arbitrary code when loaded; "
        "Hearth downloads safetensors or GGUF only: look for a safetensors or GGUF version of this model."
    )


def format_bytes(size: int | float | None) -> str:
    if size is None:
        return "size unknown"
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit in ("B", "KB") else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"  # pragma: no cover - loop always returns


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    seconds = round(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"
