"""A GGUF file's tokenizer, built from its metadata alone: torch-free, and without transformers' GGUF reader.

`AutoTokenizer.from_pretrained(folder, gguf_file=name)` reads the header with a reader that imports torch (13.6 s
for the default model on the 2-core CI box, most of it importing torch; older transformers turned every string into
Python objects for 40-90 s). Here the one header reader (app.core.models.gguf_meta) reads the vocabulary, merges and
token types (0.2 s at 49k tokens), and transformers' own GGUF tokenizer builders (integrations.gguf.
gguf_tokenizer_mapping, torch-free) turn them into the same `tokenizers` object, adjusted by the class AutoTokenizer
gives these files (TokenizersBackend). The tests hold ids, special tokens, chat template and decoding equal to
AutoTokenizer's on the default model and on tiny GGUFs written in the test run.

A file's first load keeps what it built in the cache (gguf_tokenizer_file's tokenizer.json and the settings
TokenizersBackend resolved, each named by its sha256). Every load then serves the tokenizer from those two through
app.core.chat.standalone_tokenizer: later loads read them (0.1-0.2 s) and never import transformers (~0.45 s: its
import scans every model family it has). The same JSON and settings make the same tokenizer, byte for byte (tested).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from app.core.chat.standalone_tokenizer import StandaloneTokenizer, settings_of, settings_problem
from app.core.errors import CorruptModelError, UnsupportedModelError
from app.core.models.gguf_meta import SkippedArray, read_gguf_arrays, read_gguf_header
from app.core.storage import staging

log = logging.getLogger(__name__)

# llama.cpp's end-of-generation ids beside eos: end of turn and end of message (Llama 3's <|eot_id|>, <|eom_id|>).
_END_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
# transformers' names for the special tokens, and the metadata key of each one's id.
_SPECIAL_TOKENS = {
    "bos_token": "bos_token_id",
    "eos_token": "eos_token_id",
    "unk_token": "unknown_token_id",
    "pad_token": "padding_token_id",
}


def gguf_tokenizer_parts(path: Path) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(architecture, tokenizer dict, tokenizer config) as transformers' get_gguf_tokenizer makes them, from the
    one header reader."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING

    header = read_gguf_header(path)
    long_arrays = [
        key
        for key, value in header.metadata.items()
        if key.startswith("tokenizer.") and isinstance(value, SkippedArray)
    ]
    metadata = {**header.metadata, **read_gguf_arrays(path, long_arrays)}
    grouped = {
        group: {name: metadata[f"tokenizer.{key}"] for key, name in renames.items() if f"tokenizer.{key}" in metadata}
        for group, renames in GGUF_TOKENIZER_MAPPING.items()
    }
    tokenizer, config = grouped["tokenizer"], grouped["tokenizer_config"]
    tokens = tokenizer.get("tokens")
    if not isinstance(tokens, list) or not tokens:
        raise UnsupportedModelError(f"{path.name} holds no tokenizer (no tokenizer.ggml.tokens in its header): {path}")
    tokenizer_type = tokenizer.get("tokenizer_type")
    if tokenizer_type == "llama":
        # As transformers: older files have no flag, and llama.cpp adds BOS to a sentencepiece vocabulary.
        config.setdefault("add_bos_token", True)
    elif tokenizer_type == "gemma4":
        config["add_bos_token"] = False  # the chat template writes <bos> itself (transformers follows the reference)
    for name, key in _SPECIAL_TOKENS.items():
        token_id = metadata.get(f"tokenizer.ggml.{key}")
        if token_id is not None and not (isinstance(token_id, int) and 0 <= token_id < len(tokens)):
            raise CorruptModelError(
                f"{path.name}: its tokenizer's {name} id {token_id!r} is not one of its {len(tokens):,} tokens; "
                f"the file is corrupt. File: {path}"
            )
        config[name] = tokens[token_id] if token_id is not None else None
    return header.architecture, tokenizer, config


def load_gguf_tokenizer(path: Path, notices: list[str] | None = None) -> StandaloneTokenizer:
    """The GGUF's tokenizer (the tokenizer AutoTokenizer gives for these files, served without transformers), without
    importing torch: from the cache's copies where a load before made them, else built from the header through
    transformers (and the copies made). UnsupportedModelError for a tokenizer type transformers cannot build,
    CorruptModelError for a header that does not hold together. A damaged copy is moved aside (a line in `notices`)
    and built again."""
    return load_gguf_tokenizer_and_file(path, notices)[0]


def load_gguf_tokenizer_and_file(
    path: Path, notices: list[str] | None = None
) -> tuple[StandaloneTokenizer, Path | None]:
    """load_gguf_tokenizer, and the cache's tokenizer.json it was read from or kept in (None where the cache could
    not keep it): what gguf_tokenizer_file would find, without reading and hashing it a second time."""
    cached = _cached_tokenizer(path, notices)
    if cached is not None:
        backend, settings, read_from = cached
        return StandaloneTokenizer(backend, settings, name_or_path=str(path.parent)), read_from
    built = build_with_transformers(path)
    settings = settings_of(built)
    kept_in = _keep_copies(path, built, settings, notices)
    return StandaloneTokenizer(built.backend_tokenizer, settings, name_or_path=str(path.parent)), kept_in


def build_with_transformers(path: Path) -> Any:
    """The header's tokenizer as transformers' TokenizersBackend, built by its GGUF converters (imports transformers:
    ~0.45 s)."""
    from transformers import TokenizersBackend
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    architecture, tokenizer_dict, config = gguf_tokenizer_parts(path)
    try:
        backend, extra = convert_gguf_tokenizer(architecture, tokenizer_dict)
    except ValueError as exc:
        raise UnsupportedModelError(f"{path.name}: its tokenizer cannot be built ({exc}) File: {path}") from exc
    except Exception as exc:  # the tokenizers library raises plain Exceptions for a vocabulary it cannot take
        raise CorruptModelError(
            f"{path.name}: its tokenizer could not be built from the header ({type(exc).__name__}: {exc}); the "
            f"file may be damaged. File: {path}"
        ) from exc
    # tokenizer_object= would deep-copy the backend (1.1 s at 128k tokens); __init__ keeps one already set instead.
    tokenizer = TokenizersBackend.__new__(TokenizersBackend)
    tokenizer._tokenizer = backend
    tokenizer.__init__(name_or_path=str(path.parent), **{**config, **extra})
    return tokenizer


def _keep_copies(path: Path, tokenizer: Any, settings: dict[str, Any], notices: list[str] | None) -> Path | None:
    """The tokenizer.json and settings of a tokenizer just built, for the next load; the tokenizer.json's path.
    Best effort (a full or read-only cache, a setting JSON cannot hold: the next load builds it again)."""
    try:
        data = json.dumps(settings, sort_keys=True).encode()
    except (TypeError, ValueError) as exc:
        log.info("tokenizer settings of %s not kept: %s", path, exc)
        return None
    try:
        json_file = gguf_tokenizer_file(path, tokenizer, notices)
        folder, prefix = _copies(path)
        _write_verified(folder, prefix, data, SETTINGS_SUFFIX)
        for older in folder.glob(f"{prefix}*{OLDER_SUFFIX}"):
            older.unlink(missing_ok=True)
    except OSError as exc:
        log.info("tokenizer copies of %s not kept: %s", path, exc)
        return None
    return json_file


SETTINGS_SUFFIX = ".settings"  # the tokenizer's settings beside its tokenizer.json ("*.json" is the tokenizer's alone)
OLDER_SUFFIX = ".config"  # what Hearth kept before 2026-12-07 (transformers' kwargs): removed once settings are kept


def _copies(path: Path) -> tuple[Path, str]:
    """The cache folder of tokenizer copies and this file version's name prefix (path, size and mtime)."""
    from app.core.storage.paths import cache_dir

    stat = path.stat()
    identity = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_dir() / "gguf-tokenizers", f"{path.stem[:60]}-{identity}-"


def tokenizer_kept(path: Path) -> bool:
    """Whether a load before kept this file version's tokenizer copies: a load then never imports transformers."""
    try:
        folder, prefix = _copies(path)
        return any(folder.glob(f"{prefix}*{SETTINGS_SUFFIX}")) and any(folder.glob(f"{prefix}*.json"))
    except OSError:
        return False


def _find_verified(folder: Path, prefix: str, suffix: str, notices: list[str] | None) -> Path | None:
    """The copy named PREFIX<sha256 of its content>SUFFIX; any other under PREFIX*SUFFIX is damaged: moved to
    NAME.damaged, with a line in `notices`."""
    for found in sorted(folder.glob(f"{prefix}*{suffix}")):
        digest = hashlib.sha256(found.read_bytes()).hexdigest()[:16]
        if found.name == f"{prefix}{digest}{suffix}":
            return found
        damaged = found.with_name(found.name + ".damaged")
        os.replace(found, damaged)
        log.warning("tokenizer copy %s damaged; moved to %s", found, damaged)
        if notices is not None:
            notices.append(
                f"The tokenizer copy {found.name} was damaged (its content does not match the sha256 in its name); "
                f"it was moved to {damaged} and written again."
            )
    return None


def _write_verified(folder: Path, prefix: str, data: bytes, suffix: str) -> Path:
    """`data` as PREFIX<its sha256>SUFFIX, atomically (a reader never sees half a file)."""
    target = folder / f"{prefix}{hashlib.sha256(data).hexdigest()[:16]}{suffix}"
    folder.mkdir(parents=True, exist_ok=True)
    staging.write_atomically(target, data)  # a copy a killed process was writing is swept at the next start
    return target


def _cached_tokenizer(path: Path, notices: list[str] | None) -> tuple[Any, dict[str, Any], Path] | None:
    """(the tokenizers backend, its settings, the tokenizer.json) from the cache's verified copies of this file
    version, or None. Settings of another format (another Hearth's) are removed: the tokenizer is built again and
    kept anew."""
    from tokenizers import Tokenizer

    try:
        folder, prefix = _copies(path)
        settings_file = _find_verified(folder, prefix, SETTINGS_SUFFIX, notices)
        if settings_file is None:  # built again: its tokenizer.json is checked once, where the copies are kept
            return None
        tokenizer_file = _find_verified(folder, prefix, ".json", notices)
        if tokenizer_file is None:
            return None
        settings = json.loads(settings_file.read_bytes())
        problem = settings_problem(settings)
        if problem:
            log.info("tokenizer settings %s not used (%s); building them again", settings_file, problem)
            settings_file.unlink()
            return None
        backend = Tokenizer.from_file(str(tokenizer_file))
    except Exception as exc:  # OSError, bad JSON, or tokenizers' plain Exception: build from the header instead
        log.info("tokenizer copies of %s not used: %s", path, exc)
        return None
    return backend, settings, tokenizer_file


def gguf_eos_ids(path: Path) -> set[int]:
    """The ids that end a reply: the header's eos, and its end-of-turn and end-of-message ids where it states them
    (llama.cpp stops on all three). For the default model {2} (<|im_end|>), as its converted folder's
    generation_config, config and tokenizer said."""
    metadata = read_gguf_header(path).metadata
    return {value for key in _END_KEYS if isinstance(value := metadata.get(key), int) and not isinstance(value, bool)}


def gguf_tokenizer_file(path: Path, tokenizer: Any | None = None, notices: list[str] | None = None) -> Path:
    """A tokenizer.json of the GGUF's tokenizer in the cache (a few MB, written once per file version), for what reads
    a tokenizer.json alone: the window's torch-free token counts (app.core.chat.token_counter). Its name ends with
    the sha256 of its content, checked at each use: a damaged copy is moved to NAME.damaged (with a line in
    `notices`) and written again."""
    folder, prefix = _copies(path)
    found = _find_verified(folder, prefix, ".json", notices)
    if found is not None:
        return found
    data = (tokenizer if tokenizer is not None else load_gguf_tokenizer(path)).backend_tokenizer.to_str().encode()
    return _write_verified(folder, prefix, data, ".json")
