"""Download models from the Hugging Face Hub through huggingface_hub, into its normal cache.

The order is: repo listing, then config.json (so the memory planner's verdict shows before any weights),
then a disk-space check, then the weights. Only safetensors or GGUF weights and the small files a model needs
(config, tokenizer, chat template) are fetched; pickle weights never are.

Weights go through huggingface_hub's `http_get` into a partial file with a stable name next to the cache's
blobs, so a paused, cancelled or crashed download resumes from where it stopped (a Range request) in this run
or after a restart; hf_hub_download alone restarts from zero. Each finished file is checked against the sha256
the Hub lists for it, then handed to hf_hub_download, which files it in the cache like any other download.

Torch-free: the GUI shows plans and progress without importing torch.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal
from urllib.parse import urlsplit

from app.core.errors import HearthError
from app.core.models.hub_repo import (
    CorruptDownloadError,
    DiskFullError,
    DownloadCancelled,
    DownloadPlan,
    DownloadProgress,
    GatedModelError,
    HubError,
    HubFileNotFoundError,
    HubUnreachableError,
    InvalidHubTokenError,
    ProgressCallback,
    RepoFile,
    RepoNotFoundError,
    RepoRef,
    format_bytes,
    gguf_files,
    parse_repo_reference,
    select_files,
)
from app.core.storage import paths, secrets
from app.core.storage.schema import write_json_file

log = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "https://huggingface.co"
SHARD_INDEX = "model.safetensors.index.json"
PARTIAL_SUFFIX = ".hearth-partial"
DISK_MARGIN_BYTES = 64 * 2**20  # keep some room so the system never ends up with a full disk
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


# --- where things go -----------------------------------------------------------------------------------------------


def hub_cache_dir() -> Path:
    """huggingface_hub's cache (HF_HUB_CACHE / HF_HOME), read when asked so tests and users can move it."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE).expanduser()


def hub_endpoint() -> str:
    """HF_ENDPOINT as it is now (huggingface_hub reads it once, at import)."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def default_token() -> str | None:
    """The keyring's token (or this run's), else HF_TOKEN from the environment (the headless way)."""
    token = secrets.hub_token()
    if token is None and (env_token := os.environ.get("HF_TOKEN", "").strip()):
        secrets.register_secret(env_token)
        token = env_token
    return token


# --- pending downloads (for "resume" after a restart) --------------------------------------------------------------


@dataclass(frozen=True)
class PendingDownload:
    repo_id: str
    file: str | None
    revision: str
    total_bytes: int


def _pending_path() -> Path:
    return paths.data_dir() / "downloads.json"


def pending_downloads() -> list[PendingDownload]:
    try:
        raw = json.loads(_pending_path().read_text(encoding="utf-8"))
        return [PendingDownload(**item) for item in raw]
    except (OSError, json.JSONDecodeError, TypeError):
        return []


def _save_pending(items: list[PendingDownload]) -> None:
    write_json_file(_pending_path(), [item.__dict__ for item in items])


def _remember_pending(item: PendingDownload) -> None:
    items = [p for p in pending_downloads() if (p.repo_id, p.file) != (item.repo_id, item.file)]
    _save_pending([*items, item])


def forget_pending(repo_id: str, file: str | None) -> None:
    items = pending_downloads()
    kept = [p for p in items if (p.repo_id, p.file) != (repo_id, file)]
    if len(kept) != len(items):
        _save_pending(kept)


# --- progress ------------------------------------------------------------------------------------------------------


@dataclass
class _Tracker:
    plan: DownloadPlan
    callback: ProgressCallback | None
    cancel: threading.Event
    done_before_file: int = 0
    file_bytes: int = 0
    file_name: str = ""
    file_index: int = 0
    session_bytes: int = 0  # fetched in this run: the speed is measured on these only
    _samples: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=64))
    _last_emit: float = 0.0

    def start_file(self, index: int, name: str, present: int) -> None:
        self.file_index, self.file_name, self.file_bytes = index, name, present
        self.emit(force=True)

    def file_position(self, position: int) -> None:
        self.session_bytes += max(0, position - self.file_bytes)
        self.file_bytes = position
        self.emit()

    def finish_file(self, size: int) -> None:
        self.done_before_file += size
        self.file_bytes = 0

    def speed(self) -> float | None:
        now = time.monotonic()
        self._samples.append((now, self.session_bytes))
        while len(self._samples) > 2 and now - self._samples[0][0] > 5.0:
            self._samples.popleft()
        first_t, first_b = self._samples[0]
        if now - first_t < 0.05 or self.session_bytes == first_b:
            return None
        return (self.session_bytes - first_b) / (now - first_t)

    def emit(self, *, force: bool = False, stage: Literal["downloading", "verifying", "done"] = "downloading") -> None:
        if self.callback is None:
            return
        now = time.monotonic()
        if not force and now - self._last_emit < 0.1:
            return
        self._last_emit = now
        done = self.done_before_file + self.file_bytes
        total = self.plan.total_bytes
        speed = self.speed()
        eta = (total - done) / speed if speed else None
        self.callback(
            DownloadProgress(
                repo_id=self.plan.repo_id,
                file=self.file_name,
                file_index=self.file_index,
                file_count=len(self.plan.files),
                done_bytes=min(done, total) if total else done,
                total_bytes=total,
                bytes_per_s=speed,
                eta_s=0.0 if stage == "done" else eta,
                stage=stage,
            )
        )


class _PartialFile:
    """The file object http_get writes to: hashes what is written (no second read of a multi-GB file), reports
    the position, and stops at the next chunk once cancelled. A resumed file's existing bytes are hashed first."""

    def __init__(self, handle: IO[bytes], tracker: _Tracker) -> None:
        self._handle = handle
        self._tracker = tracker
        self._digest = hashlib.sha256()
        self._rehash()

    def _rehash(self) -> None:
        """Hash the file from its start up to the current position (after opening, or after a truncate)."""
        position = self._handle.tell()
        self._digest = hashlib.sha256()
        self._handle.seek(0)
        remaining = position
        while remaining > 0:
            block = self._handle.read(min(4 << 20, remaining))
            if not block:
                break
            self._digest.update(block)
            remaining -= len(block)
        self._handle.seek(position)

    def hexdigest(self) -> str:
        return self._digest.hexdigest()

    def write(self, data: bytes) -> int:
        written = self._handle.write(data)
        self._digest.update(data[:written])
        self._handle.flush()
        self._tracker.file_position(self._handle.tell())
        if self._tracker.cancel.is_set():
            raise DownloadCancelled("The download was paused.")
        return written

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._handle.seek(offset, whence)

    def tell(self) -> int:
        return self._handle.tell()

    def truncate(self, size: int | None = None) -> int:
        """http_get truncates when the server ignored a Range request and resends the whole file."""
        result = self._handle.truncate(size)
        self._rehash()
        self._tracker.file_bytes = self._handle.tell()
        return result


class _QuietBar:
    """Stands in for tqdm inside huggingface_hub: Hearth draws its own progress."""

    def __init__(self, **kwargs: Any) -> None:
        del kwargs

    def __enter__(self) -> _QuietBar:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, n: int | float = 1) -> None:
        del n

    def close(self) -> None:
        return None


# --- the client ----------------------------------------------------------------------------------------------------


class HubClient:
    """One Hub endpoint, one token (or none), one cache folder."""

    def __init__(self, *, endpoint: str | None = None, token: str | None = None, cache_dir: Path | None = None) -> None:
        self.endpoint = (endpoint or hub_endpoint()).rstrip("/")
        self.token = token
        self.cache_dir = cache_dir or hub_cache_dir()
        if token:
            secrets.register_secret(token)

    @classmethod
    def default(cls) -> HubClient:
        return cls(token=default_token())

    # huggingface_hub falls back to its own stored login for token=None: Hearth's tokens live only in the keyring.
    @property
    def _hf_token(self) -> str | bool:
        return self.token or False

    @contextmanager
    def _translated(self, repo_id: str, what: str = "") -> Iterator[None]:
        try:
            yield
        except HearthError:
            raise
        except Exception as exc:
            raise self._translate(exc, repo_id, what) from exc

    def _translate(self, exc: BaseException, repo_id: str, what: str) -> HearthError:
        import httpx2
        from huggingface_hub.errors import (
            GatedRepoError,
            HfHubHTTPError,
            LocalEntryNotFoundError,
            OfflineModeIsEnabled,
            RemoteEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        page = f"{DEFAULT_ENDPOINT}/{repo_id}"
        if isinstance(exc, OfflineModeIsEnabled) or (
            isinstance(exc, LocalEntryNotFoundError) and isinstance(exc.__cause__, OfflineModeIsEnabled)
        ):
            return HubUnreachableError(
                "Hugging Face offline mode is on (HF_HUB_OFFLINE=1): unset it to download models."
            )
        if isinstance(exc, GatedRepoError):
            if self.token:
                return GatedModelError(
                    f"{repo_id} is gated and your Hub token has no access to it: accept its licence at {page} "
                    "while logged in to the account that owns the token, then try again."
                )
            return GatedModelError(
                f"{repo_id} is gated: accept its licence at {page}, then add a Hub token "
                "(Settings → Hub token, or `hearth token set`) and try again."
            )
        if isinstance(exc, RevisionNotFoundError):
            return RepoNotFoundError(f"{repo_id} has no branch or revision named in the request.")
        if isinstance(exc, RemoteEntryNotFoundError):
            return HubFileNotFoundError(f"{repo_id} has no file {what or 'by that name'}.")
        if isinstance(exc, RepositoryNotFoundError):
            hint = " (or your Hub token cannot see it)" if self.token else " (if it is private, add a Hub token)"
            return RepoNotFoundError(f"There is no model {repo_id} on the Hugging Face Hub{hint}: check the name.")
        if isinstance(exc, HfHubHTTPError):
            status = exc.response.status_code if exc.response is not None else 0
            if status == 401:
                return InvalidHubTokenError(
                    "The Hub rejected your token (invalid credentials): create a read token at "
                    f"{DEFAULT_ENDPOINT}/settings/tokens and save it again "
                    "(Settings → Hub token, or `hearth token set`)."
                )
            if status == 403:
                return GatedModelError(f"Your Hub token is not allowed to read {repo_id}: check its permissions.")
            return HubUnreachableError(f"The Hugging Face Hub answered HTTP {status} for {repo_id}; try again later.")
        if isinstance(exc, httpx2.TransportError | LocalEntryNotFoundError | ConnectionError | TimeoutError):
            return HubUnreachableError(
                f"Cannot reach the Hugging Face Hub ({self.endpoint}): check your internet connection. "
                "What was already downloaded is kept; run the download again to resume."
            )
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            return DiskFullError(
                f"The disk holding {self.cache_dir} is full: free some space, then run the download again to resume."
            )
        return HubError(f"Downloading {repo_id} failed: {secrets.redact(str(exc)) or type(exc).__name__}.")

    # -- listing --------------------------------------------------------------------------------------------------

    def _repo_info(self, ref: RepoRef) -> tuple[str, list[RepoFile], bool, str | None]:
        from huggingface_hub import HfApi

        with self._translated(ref.repo_id):
            info = HfApi(endpoint=self.endpoint).model_info(
                ref.repo_id, revision=ref.revision, files_metadata=True, token=self._hf_token
            )
        files = [
            RepoFile(
                name=s.rfilename,
                size=s.lfs.size if s.lfs is not None else s.size,
                sha256=s.lfs.sha256 if s.lfs is not None else None,
            )
            for s in info.siblings or []
        ]
        license_name = None
        card = info.card_data
        if card is not None:
            license_name = getattr(card, "license", None)
        if not info.sha:
            raise HubError(f"The Hub did not say which commit {ref.repo_id} is at; try again later.")
        return info.sha, files, bool(info.gated), license_name if isinstance(license_name, str) else None

    def _fetch_small(self, repo_id: str, commit: str, name: str) -> Path:
        from huggingface_hub import hf_hub_download

        with self._translated(repo_id, name):
            return Path(
                hf_hub_download(
                    repo_id,
                    name,
                    revision=commit,
                    cache_dir=self.cache_dir,
                    endpoint=self.endpoint,
                    token=self._hf_token,
                    tqdm_class=_QuietBar,
                )
            )

    def prepare(self, reference: str, file: str | None = None) -> DownloadPlan:
        """List the repo, fetch config.json (and the shard index), choose the files: no weights yet."""
        ref = parse_repo_reference(reference)
        choice = file or ref.filename
        commit, files, gated, license_name = self._repo_info(ref)
        names = {f.name for f in files}
        config: dict[str, Any] | None = None
        if "config.json" in names:
            config = _read_json(self._fetch_small(ref.repo_id, commit, "config.json"))
        shard_names: set[str] | None = None
        wants_safetensors = choice is None or not choice.lower().endswith(".gguf")
        if SHARD_INDEX in names and wants_safetensors:
            index = _read_json(self._fetch_small(ref.repo_id, commit, SHARD_INDEX)) or {}
            weight_map = index.get("weight_map")
            if isinstance(weight_map, dict):
                shard_names = {str(v) for v in weight_map.values()}
        selected = select_files(files, ref.repo_id, choice, shard_names)
        plan = DownloadPlan(
            repo_id=ref.repo_id,
            revision=ref.revision,
            commit=commit,
            files=tuple(selected),
            gated=gated,
            license=license_name,
            config=config,
            gguf_files=tuple(gguf_files(files)),
            choice=choice,
        )
        return _with_present_bytes(plan, self._storage(ref.repo_id))

    # -- downloading ----------------------------------------------------------------------------------------------

    def _storage(self, repo_id: str) -> Path:
        from huggingface_hub.file_download import repo_folder_name

        return self.cache_dir / repo_folder_name(repo_id=repo_id, repo_type="model")

    def check_disk_space(self, plan: DownloadPlan) -> None:
        needed = plan.remaining_bytes
        free = _free_bytes(self.cache_dir)
        if free < needed + DISK_MARGIN_BYTES:
            raise DiskFullError(
                f"Not enough disk space for {plan.label}: it needs {format_bytes(needed)} more but only "
                f"{format_bytes(free)} is free where models are stored ({self.cache_dir}). "
                "Free some space or delete models in the library; nothing was downloaded.",
                needed_bytes=needed,
                free_bytes=free,
            )

    def download(
        self,
        plan: DownloadPlan,
        *,
        progress: ProgressCallback | None = None,
        cancel: threading.Event | None = None,
    ) -> Path:
        """Fetch every file of the plan (resuming partial ones); returns the snapshot folder."""
        cancel = cancel or threading.Event()
        self.check_disk_space(plan)
        _remember_pending(PendingDownload(plan.repo_id, plan.choice, plan.revision, plan.total_bytes))
        tracker = _Tracker(plan=plan, callback=progress, cancel=cancel)
        storage = self._storage(plan.repo_id)
        snapshot: Path | None = None
        # Small files first: the folder is usable for the planner and the tokenizer as early as possible.
        ordered = sorted(plan.files, key=lambda f: (f.is_weight, f.name))
        try:
            for index, repo_file in enumerate(ordered, start=1):
                if cancel.is_set():
                    raise DownloadCancelled("The download was paused.")
                if repo_file.is_weight:
                    path = self._download_weight(plan, repo_file, storage, index, tracker)
                else:
                    tracker.start_file(index, repo_file.name, 0)
                    path = self._fetch_small(plan.repo_id, plan.commit, repo_file.name)
                tracker.finish_file(repo_file.size or path.stat().st_size)
                snapshot = path.parent if "/" not in repo_file.name else None
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise self._translate(exc, plan.repo_id, "") from exc
            raise
        _write_ref(storage, plan.revision, plan.commit)
        forget_pending(plan.repo_id, plan.choice)
        tracker.file_name = ordered[-1].name if ordered else ""
        tracker.emit(force=True, stage="done")
        return snapshot or storage / "snapshots" / plan.commit

    def _download_weight(
        self, plan: DownloadPlan, repo_file: RepoFile, storage: Path, index: int, tracker: _Tracker
    ) -> Path:
        from huggingface_hub import get_hf_file_metadata, hf_hub_url
        from huggingface_hub.file_download import http_get
        from huggingface_hub.utils import build_hf_headers

        url = hf_hub_url(plan.repo_id, repo_file.name, revision=plan.commit, endpoint=self.endpoint)
        with self._translated(plan.repo_id, repo_file.name):
            meta = get_hf_file_metadata(url, token=self._hf_token, endpoint=self.endpoint)
        if not meta.etag:
            raise HubError(f"The Hub sent no checksum for {repo_file.name}; try again later.")
        blobs = storage / "blobs"
        blobs.mkdir(parents=True, exist_ok=True)
        blob = blobs / meta.etag
        partial = blobs / f"{meta.etag}{PARTIAL_SUFFIX}"
        size = meta.size if meta.size is not None else repo_file.size
        if not blob.exists():
            present = partial.stat().st_size if partial.exists() else 0
            if size is not None and present > size:  # not a prefix of this file: start over
                partial.unlink()
                present = 0
            tracker.start_file(index, repo_file.name, present)
            headers = build_hf_headers(token=self._hf_token)
            if urlsplit(meta.location).netloc != urlsplit(self.endpoint).netloc:
                headers.pop("authorization", None)  # signed CDN links must not receive the token
            with partial.open("r+b" if present else "w+b") as handle:
                handle.seek(0, os.SEEK_END)
                writer = _PartialFile(handle, tracker)
                with self._translated(plan.repo_id, repo_file.name):
                    http_get(
                        meta.location,
                        writer,  # type: ignore[arg-type]
                        resume_size=present,
                        headers=headers,
                        expected_size=size,
                        tqdm_class=_QuietBar,
                    )
            tracker.emit(force=True, stage="verifying")
            expected = repo_file.sha256 or (meta.etag if _SHA256.match(meta.etag) else None)
            if expected is not None and writer.hexdigest() != expected:
                partial.unlink(missing_ok=True)
                raise CorruptDownloadError(
                    f"The download of {repo_file.name} from {plan.repo_id} is corrupted (checksum mismatch); "
                    "the damaged file was deleted: run the download again."
                )
            partial.replace(blob)
        # The blob is in place: hf_hub_download only links it into the snapshot (no second download).
        return self._fetch_small(plan.repo_id, plan.commit, repo_file.name)

    def discard(self, plan: DownloadPlan) -> None:
        """Cancel for good: delete the partial files of this plan and forget it."""
        blobs = self._storage(plan.repo_id) / "blobs"
        if blobs.is_dir():
            for partial in blobs.glob(f"*{PARTIAL_SUFFIX}"):
                partial.unlink(missing_ok=True)
        forget_pending(plan.repo_id, plan.choice)


def _with_present_bytes(plan: DownloadPlan, storage: Path) -> DownloadPlan:
    from dataclasses import replace

    present = 0
    snapshot = storage / "snapshots" / plan.commit
    partials = (
        {p.name: p.stat().st_size for p in (storage / "blobs").glob(f"*{PARTIAL_SUFFIX}")} if storage.is_dir() else {}
    )
    for f in plan.files:
        if (snapshot / f.name).exists():
            present += f.size or 0
        elif f.sha256 and f"{f.sha256}{PARTIAL_SUFFIX}" in partials:
            present += partials[f"{f.sha256}{PARTIAL_SUFFIX}"]
    return replace(plan, present_bytes=present)


def _write_ref(storage: Path, revision: str, commit: str) -> None:
    """refs/<branch> -> commit, so `--model org/name` finds the snapshot offline."""
    if revision == commit:
        return
    ref = storage / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    if not ref.exists() or ref.read_text(encoding="utf-8").strip() != commit:
        ref.write_text(commit, encoding="utf-8")


def _free_bytes(folder: Path) -> int:
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            return shutil.disk_usage(candidate).free
    return shutil.disk_usage(Path.cwd()).free


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None
