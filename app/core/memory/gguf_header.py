"""A transformers config dict from a GGUF file's header alone: metadata keys and tensor names, no tensor data.

transformers' own reader (load_gguf_checkpoint) and gguf.GGUFReader turn every tokenizer string into Python
objects: 40-90 s for the 49k-token default model on the 2-core CI box. This walks the header once with
struct.unpack_from and skips arrays it does not need, in well under a second. The key renames come from
transformers' GGUF tables, so they stay in step with what the loader converts. Torch-free.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, cast

from app.core.errors import CorruptModelError, UnsupportedModelError
from app.core.model_source import check_gguf_header

# GGUF value types -> struct format (scalars); 8 = string, 9 = array.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
# Arrays longer than this (token lists, merges, scores) are skipped; only their length is kept.
_MAX_ARRAY_KEPT = 4096
_READ_BLOCK = 1 << 20


class _Header:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.handle = path.open("rb")
        self.buffer = b""
        self.start = 0  # file offset of buffer[0]
        self.position = 0  # file offset of the next byte to read

    def close(self) -> None:
        self.handle.close()

    def _need(self, size: int) -> None:
        end = self.position + size
        if end <= self.start + len(self.buffer):
            return
        self.handle.seek(self.position)
        self.buffer = self.handle.read(max(size, _READ_BLOCK))
        self.start = self.position
        if len(self.buffer) < size:
            raise CorruptModelError(f"{self.path} ends inside its GGUF header; the file is truncated.")

    def unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        self._need(size)
        value = struct.unpack_from(fmt, self.buffer, self.position - self.start)[0]
        self.position += size
        return value

    def string(self) -> str:
        length = self.unpack("<Q")
        if length > 1 << 20:
            raise CorruptModelError(f"{self.path}: a GGUF header string claims {length} bytes; the file is corrupt.")
        self._need(length)
        offset = self.position - self.start
        self.position += length
        return self.buffer[offset : offset + length].decode("utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item_kind = self.unpack("<I")
            count = self.unpack("<Q")
            if count <= _MAX_ARRAY_KEPT:
                return [self.value(item_kind) for _ in range(count)]
            if item_kind in _SCALARS:
                self.position += count * struct.calcsize(_SCALARS[item_kind])
            else:
                for _ in range(count):
                    self.value(item_kind)
            return _SkippedArray(count)
        raise CorruptModelError(f"{self.path}: unknown GGUF value type {kind}; the file is corrupt.")


class _SkippedArray:
    def __init__(self, length: int) -> None:
        self.length = length


def read_gguf_header(path: Path) -> tuple[dict[str, Any], list[str]]:
    """The metadata key/values (long arrays replaced by their length) and the tensor names."""
    check_gguf_header(path)
    header = _Header(path)
    try:
        header.position = 8  # magic + version, checked above
        tensor_count = header.unpack("<Q")
        kv_count = header.unpack("<Q")
        metadata: dict[str, Any] = {}
        for _ in range(kv_count):
            key = header.string()
            metadata[key] = header.value(header.unpack("<I"))
        names: list[str] = []
        for _ in range(tensor_count):
            names.append(header.string())
            dims = header.unpack("<I")
            header.position += 8 * dims + 4 + 8  # shape, type, data offset
        return metadata, names
    except (struct.error, UnicodeDecodeError) as exc:
        raise CorruptModelError(f"{path}: the GGUF header could not be read ({exc}).") from exc
    finally:
        header.close()


def config_dict_from_gguf(path: Path) -> dict[str, Any]:
    """What transformers' GGUF loader would put in config.json, from the header alone."""
    from transformers.integrations.ggml import GGUF_CONFIG_DEFAULTS_MAPPING, GGUF_CONFIG_MAPPING

    metadata, tensor_names = read_gguf_header(path)
    architecture = str(metadata.get("general.architecture", ""))
    name = str(metadata.get("general.name", ""))
    model_type = architecture
    if "llama" in architecture and "mistral" in name.lower():
        model_type = "mistral"
    model_type = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss"}.get(model_type, model_type)
    tables = cast(dict[str, dict[str, Any]], GGUF_CONFIG_MAPPING)
    mapping = tables.get(model_type) or tables.get(architecture) or {}
    if not mapping:
        raise UnsupportedModelError(f"{path}: GGUF architecture {architecture!r} is not supported by transformers.")
    config: dict[str, Any] = dict(GGUF_CONFIG_DEFAULTS_MAPPING.get(model_type) or {})
    prefix = architecture + "."
    for key, value in metadata.items():
        if not key.startswith(prefix):
            continue
        renamed = mapping.get(key[len(prefix) :])
        if renamed is None or renamed == -1 or isinstance(value, _SkippedArray):
            continue
        config[renamed] = value
    tokens = metadata.get("tokenizer.ggml.tokens")
    if "vocab_size" not in config and tokens is not None:
        config["vocab_size"] = tokens.length if isinstance(tokens, _SkippedArray) else len(tokens)
    config["tie_word_embeddings"] = "output.weight" not in tensor_names
    config["model_type"] = {"gemma3": "gemma3_text"}.get(model_type, model_type)
    if name:
        config["_name_or_path"] = name
    return config
