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

from app.core import paths
from app.core.errors import CorruptModelError, UnsupportedModelError
from app.core.gguf_meta import check_gguf_complete
from app.core.model_source import check_gguf_header

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


def ensure_converted(gguf_path: Path, progress: ProgressCallback | None = None) -> Path:
    """The converted folder for this GGUF, converting it first if needed (atomic: a crash leaves no half folder)."""
    check_gguf_header(gguf_path)
    check_gguf_complete(gguf_path)
    target = converted_folder_for(gguf_path)
    if is_converted(target):
        return target
    if progress:
        progress(f"Converting {gguf_path.name} once (cached for next time)…", None)
    staging = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        _convert(gguf_path, staging)
        (staging / _MARKER).write_text(
            json.dumps({"source": str(gguf_path), "sha256": gguf_hash(gguf_path)}), encoding="utf-8"
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
