"""Convert a GGUF file once to a safetensors folder in the user cache, keyed by the file's hash.

transformers dequantizes GGUF on every load (20-30 s for the default model on a 2-core CPU) and
cannot combine `gguf_file=` with a quantization config, so Hearth loads the converted folder instead.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.core.errors import CorruptModelError, UnsupportedModelError
from app.core.models.gguf_meta import check_gguf_complete
from app.core.models.model_source import check_gguf_header
from app.core.storage import paths

log = logging.getLogger(__name__)

ProgressCallback = Callable[[str, float | None], None]
_MARKER = "hearth-conversion.json"


def file_sha256(path: Path, chunk: int = 4 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _hash_memo_path() -> Path:
    return paths.cache_dir() / "gguf-hashes.json"


def gguf_hash(path: Path) -> str:
    """sha256 of the file, memoised by (path, size, mtime) so a launch does not re-read 100s of MB."""
    stat = path.stat()
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    memo_path = _hash_memo_path()
    try:
        memo: dict[str, str] = json.loads(memo_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        memo = {}
    if key in memo:
        return memo[key]
    digest = file_sha256(path)
    memo[key] = digest
    tmp = memo_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(memo), encoding="utf-8")
    tmp.replace(memo_path)
    return digest


def converted_folder_for(gguf_path: Path) -> Path:
    return paths.converted_models_dir() / f"{gguf_path.stem}-{gguf_hash(gguf_path)[:16]}"


def is_converted(folder: Path) -> bool:
    return (folder / _MARKER).is_file()


def _file_record(path: Path) -> dict[str, Any]:
    stat = path.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": file_sha256(path)}


def converted_damage(folder: Path) -> str | None:
    """Why a converted folder cannot be trusted, or None. Each file's size is checked on every load; a file whose
    modification time changed is hashed again against the sha256 recorded at conversion (re-hashing every
    launch would cost ~0.5 s for the default model, ~30 s for an 8B one)."""
    marker = folder / _MARKER
    try:
        record = json.loads(marker.read_text(encoding="utf-8"))
        files: dict[str, dict[str, Any]] | None = record.get("files")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as exc:
        return f"its record {marker.name} is unreadable ({exc})"
    if files is None:  # converted by an older Hearth: record what is there now
        record["files"] = {p.name: _file_record(p) for p in sorted(folder.iterdir()) if p.name != _MARKER}
        _write_json(marker, record)
        return None
    changed = False
    for name, expected in files.items():
        path = folder / name
        try:
            stat = path.stat()
        except OSError:
            return f"{name} is missing"
        if stat.st_size != expected.get("size"):
            return f"{name} has {stat.st_size:,} bytes, not the {expected.get('size'):,} written"
        if stat.st_mtime_ns != expected.get("mtime_ns"):
            if file_sha256(path) != expected.get("sha256"):
                return f"{name} was changed after conversion (its content hash differs)"
            expected["mtime_ns"], changed = stat.st_mtime_ns, True  # touched or copied, not changed
    if changed:
        _write_json(marker, record)
    return None


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    tmp.replace(path)


def quarantine(path: Path) -> Path:
    """Move a damaged derived artifact to `NAME.damaged` (replacing an older one) so it is rebuilt, never trusted."""
    damaged = path.with_name(path.name + ".damaged")
    if damaged.is_dir():
        shutil.rmtree(damaged)
    elif damaged.exists():
        damaged.unlink()
    path.rename(damaged)
    return damaged


def ensure_converted(
    gguf_path: Path, progress: ProgressCallback | None = None, notices: list[str] | None = None
) -> Path:
    """The converted folder for this GGUF, converting it first if needed (atomic: a crash leaves no half folder).
    A damaged converted folder is quarantined and converted again, with a line in `notices`."""
    check_gguf_header(gguf_path)
    check_gguf_complete(gguf_path)
    target = converted_folder_for(gguf_path)
    if is_converted(target):
        damage = converted_damage(target)
        if damage is None:
            return target
        moved = quarantine(target)
        log.warning("converted model %s damaged (%s); moved to %s", target, damage, moved)
        if notices is not None:
            notices.append(
                f"The converted copy of {gguf_path.name} was damaged ({damage}); it was moved to {moved.name} "
                "and converted again."
            )
    if progress:
        progress(f"Converting {gguf_path.name} once (cached for next time)…", None)
    staging = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        _convert(gguf_path, staging)
        files = {p.name: _file_record(p) for p in sorted(staging.iterdir())}
        (staging / _MARKER).write_text(
            json.dumps({"source": str(gguf_path), "sha256": gguf_hash(gguf_path), "files": files}), encoding="utf-8"
        )
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log.info("converted %s -> %s", gguf_path, target)
    return target


def _convert(gguf_path: Path, out_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = gguf_path.parent, gguf_path.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except ValueError as exc:
        if "architecture" in str(exc).lower() or "not supported" in str(exc).lower():
            raise UnsupportedModelError(f"{gguf_path}: {exc}") from exc
        raise CorruptModelError(f"{gguf_path} could not be read as a GGUF model: {exc}") from exc
    except (OSError, EOFError, IndexError, KeyError, struct_error()) as exc:
        raise CorruptModelError(
            f"{gguf_path} could not be read ({type(exc).__name__}: {exc}); the file may be truncated."
        ) from exc
    # save_pretrained on a GGUF-loaded model fails: rebuild plainly from its config, then copy the weights.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fresh.load_state_dict(loaded.state_dict())
    fresh.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    del loaded, fresh


def struct_error() -> type[Exception]:
    import struct

    return struct.error
