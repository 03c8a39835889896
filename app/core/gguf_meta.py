"""Read a GGUF file's metadata (architecture, sizes, context) and count its parameters, without loading it.

gguf.GGUFReader maps every tensor and token array (20+ s for the default model on a slow CPU); the library list
needs a handful of numbers, so this reads the header and skips the rest. Torch-free and numpy-free.
"""

from __future__ import annotations

import functools
import struct
from pathlib import Path
from typing import Any, BinaryIO

from app.core.errors import CorruptModelError
from app.core.model_source import GGUF_MAGIC

# GGUF value types -> struct format of one scalar.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
# GGUF architecture name -> transformers model_type.
_MODEL_TYPES = {"gemma3": "gemma3_text"}


def _read(handle: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = handle.read(size)
    if len(data) != size:
        raise EOFError
    return struct.unpack("<" + fmt, data)[0]


def _read_string(handle: BinaryIO) -> str:
    length = _read(handle, "Q")
    return handle.read(length).decode("utf-8", errors="replace")


def _read_value(handle: BinaryIO, kind: int) -> Any:
    if kind in _SCALARS:
        return _read(handle, _SCALARS[kind])
    if kind == _STRING:
        return _read_string(handle)
    if kind == _ARRAY:
        item_kind, count = _read(handle, "I"), _read(handle, "Q")
        if item_kind in _SCALARS:  # skip numbers wholesale; only the count matters here
            handle.seek(struct.calcsize("<" + _SCALARS[item_kind]) * count, 1)
        else:
            for _ in range(count):
                _read_value(handle, item_kind)
        return _ArrayLength(count)
    raise ValueError(f"unknown GGUF value type {kind}")


_TENSOR_EXTENTS = "hearth.tensor_extents"  # not a GGUF key: (data start, tensor table), for the size check


def _tensor_bytes(kind: int, count: int) -> int:
    """Bytes of one tensor's data; 0 for a type this gguf package does not know (never a false 'incomplete')."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
    except (ValueError, KeyError):
        return 0
    return count // block * size


def check_gguf_complete(path: Path) -> None:
    """A GGUF file cut short (an interrupted download or copy) is named as such before anything reads its tensors."""
    stat = path.stat()
    fields, _, _ = _read_metadata(path.resolve(), stat.st_size, stat.st_mtime_ns)
    data_start, extents = fields[_TENSOR_EXTENTS]
    needed = data_start + max((offset + _tensor_bytes(kind, count) for kind, count, offset in extents), default=0)
    if stat.st_size < needed:
        raise CorruptModelError(
            f"{path.name} is an incomplete GGUF file: it has {stat.st_size:,} bytes but its tensors need "
            f"{needed:,} (the download or copy was cut short). Download it again. File: {path}"
        )


class _ArrayLength(int):
    """An array value, kept only as its length (vocab size from tokenizer.ggml.tokens)."""


@functools.lru_cache(maxsize=64)
def _read_metadata(path: Path, size: int, mtime_ns: int) -> tuple[dict[str, Any], int, frozenset[str]]:
    del size, mtime_ns  # part of the cache key: a replaced file is read again
    try:
        with path.open("rb") as handle:
            if handle.read(4) != GGUF_MAGIC:
                raise CorruptModelError(f"{path} is not a GGUF file (bad header).")
            _read(handle, "I")  # version
            tensor_count, kv_count = _read(handle, "Q"), _read(handle, "Q")
            fields: dict[str, Any] = {}
            for _ in range(kv_count):
                key = _read_string(handle)
                fields[key] = _read_value(handle, _read(handle, "I"))
            parameters = 0
            names: set[str] = set()
            extents: list[tuple[int, int, int]] = []  # (type, elements, offset): what a whole file must hold
            for _ in range(tensor_count):
                name = _read_string(handle)
                dims = [_read(handle, "Q") for _ in range(_read(handle, "I"))]
                kind = _read(handle, "I")
                offset = _read(handle, "Q")
                count = 1
                for dim in dims:
                    count *= dim
                parameters += count
                names.add(name)
                extents.append((kind, count, offset))
            alignment = fields.get("general.alignment")
            alignment = alignment if isinstance(alignment, int) and alignment > 0 else 32
            fields[_TENSOR_EXTENTS] = (-(-handle.tell() // alignment) * alignment, tuple(extents))
    except (EOFError, ValueError, struct.error, UnicodeDecodeError) as exc:
        raise CorruptModelError(f"{path} has unreadable GGUF metadata; the file may be truncated.") from exc
    except OSError as exc:
        raise CorruptModelError(f"Cannot read {path}: {exc.strerror or exc}.") from exc
    return fields, parameters, frozenset(names)


def gguf_summary(path: Path) -> tuple[dict[str, Any], int]:
    """An HF-style config dict built from the GGUF metadata (what the memory planner reads), and the parameters."""
    stat = path.stat()
    fields, parameters, tensor_names = _read_metadata(path.resolve(), stat.st_size, stat.st_mtime_ns)
    arch = str(fields.get("general.architecture", ""))

    def field(name: str) -> Any:
        return fields.get(f"{arch}.{name}")

    config: dict[str, Any] = {"model_type": _MODEL_TYPES.get(arch, arch)}
    mapping = {
        "hidden_size": "embedding_length",
        "num_hidden_layers": "block_count",
        "intermediate_size": "feed_forward_length",
        "num_attention_heads": "attention.head_count",
        "num_key_value_heads": "attention.head_count_kv",
        "max_position_embeddings": "context_length",
        "head_dim": "attention.key_length",
        "sliding_window": "attention.sliding_window",
    }
    for key, gguf_key in mapping.items():
        value = field(gguf_key)
        if isinstance(value, int) and not isinstance(value, bool):
            config[key] = int(value)
    vocab = field("vocab_size") or fields.get("tokenizer.ggml.tokens")
    if isinstance(vocab, int):
        config["vocab_size"] = int(vocab)
    config["tie_word_embeddings"] = "output.weight" not in tensor_names
    return config, parameters
