"""The one GGUF header reader: a file's metadata, tensor table and the config transformers would convert it to,
read from the header alone (no tensor data), for the library, the memory planner, the loaders and the tokenizer.

transformers' own reader (load_gguf_checkpoint) and gguf.GGUFReader turn every tokenizer string into Python
objects: 40-90 s for the 49k-token default model on the 2-core CI box. This walks the header once with
struct.unpack_from over a buffered read and skips arrays it does not need, in well under a second; the long arrays
(the vocabulary, merges, token types, scores) are read only when asked for (read_gguf_arrays, for the tokenizer). The
config's key renames come from transformers' GGUF tables, so they stay in step with what transformers reads. Torch-free.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from app.core.errors import CorruptModelError, UnsupportedModelError
from app.core.models.model_source import check_gguf_header

# GGUF value types -> struct format (scalars); 8 = string, 9 = array.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
# Arrays longer than this (token lists, merges, scores) are skipped; only their length is kept.
_MAX_ARRAY_KEPT = 4096
_READ_BLOCK = 1 << 20
_MAX_DIMS = 4  # GGML_MAX_DIMS: a header claiming more is damaged (and would make a tuple of any length)
_LENGTH = struct.Struct("<Q")


class SkippedArray:
    """A long array value, kept only as its length (the vocab size from tokenizer.ggml.tokens)."""

    def __init__(self, length: int) -> None:
        self.length = length


@dataclass(frozen=True)
class TensorExtent:
    kind: int  # GGML quantization type
    elements: int
    offset: int  # from the start of the data section
    name: str = ""
    dims: tuple[int, ...] = ()  # as the file lists them: ggml order, the fastest-moving (row length) first

    @property
    def shape(self) -> tuple[int, ...]:
        """The tensor's shape in torch/numpy order (rows, row length)."""
        return tuple(reversed(self.dims))


@dataclass(frozen=True)
class GGUFHeader:
    metadata: dict[str, Any]  # key -> value; arrays longer than _MAX_ARRAY_KEPT as SkippedArray
    tensor_names: frozenset[str]
    tensors: tuple[TensorExtent, ...]
    data_start: int  # file offset of the tensor data (the header's end, aligned)

    @property
    def parameters(self) -> int:
        return sum(tensor.elements for tensor in self.tensors)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))


class _Reader:
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

    def strings(self, count: int) -> list[str]:
        """`count` strings in a row, in one tight loop (a 128k-token vocabulary and its merges are 256k strings)."""
        values: list[str] = []
        append, unpack = values.append, _LENGTH.unpack_from
        buffer, offset = self.buffer, self.position - self.start
        for _ in range(count):
            if offset + 8 > len(buffer):
                buffer, offset = self._refill(offset, 8)
            (length,) = unpack(buffer, offset)
            end = offset + 8 + length
            if end > len(buffer):
                if length > 1 << 20:
                    raise CorruptModelError(
                        f"{self.path}: a GGUF header string claims {length} bytes; the file is corrupt."
                    )
                buffer, offset = self._refill(offset, 8 + length)
                end = offset + 8 + length
            append(buffer[offset + 8 : end].decode("utf-8", errors="replace"))
            offset = end
        self.position = self.start + offset
        return values

    def _refill(self, offset: int, size: int) -> tuple[bytes, int]:
        """Move the buffer to `offset` (in the current buffer) with `size` bytes available there."""
        self.position = self.start + offset
        self._need(size)
        return self.buffer, self.position - self.start

    def value(self, kind: int, keep: bool = False) -> Any:
        """The next value of type `kind`; an array longer than _MAX_ARRAY_KEPT only as its length unless `keep`."""
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item_kind = self.unpack("<I")
            count = self.unpack("<Q")
            if item_kind in _SCALARS:
                fmt = _SCALARS[item_kind]
                size = count * struct.calcsize(fmt)
                if count <= _MAX_ARRAY_KEPT or keep:
                    self._need(size)
                    values = struct.unpack_from(f"<{count}{fmt[1]}", self.buffer, self.position - self.start)
                    self.position += size
                    return list(values)
                self.position += size
                return SkippedArray(count)
            if item_kind == _STRING:
                if count <= _MAX_ARRAY_KEPT or keep:
                    return self.strings(count)
                self.skip_strings(count)
                return SkippedArray(count)
            if count <= _MAX_ARRAY_KEPT or keep:
                return [self.value(item_kind, keep) for _ in range(count)]
            for _ in range(count):
                self.value(item_kind)
            return SkippedArray(count)
        raise CorruptModelError(f"{self.path}: unknown GGUF value type {kind}; the file is corrupt.")

    def skip_strings(self, count: int) -> None:
        """Past `count` strings in a row, in a loop as tight as `strings`' (a warm load reads the header once)."""
        unpack = _LENGTH.unpack_from
        buffer, offset = self.buffer, self.position - self.start
        for _ in range(count):
            if offset + 8 > len(buffer):
                buffer, offset = self._refill(offset, 8)
            (length,) = unpack(buffer, offset)
            if length > 1 << 20:
                raise CorruptModelError(
                    f"{self.path}: a GGUF header string claims {length} bytes; the file is corrupt."
                )
            offset += 8 + length
        self.position = self.start + offset

    def metadata(self, keep: Collection[str] = ()) -> tuple[int, dict[str, Any]]:
        """(tensor count, metadata) from the start of the file; the arrays named in `keep` in full."""
        self.position = 8  # magic + version, checked by check_gguf_header
        tensor_count = self.unpack("<Q")
        kv_count = self.unpack("<Q")
        metadata: dict[str, Any] = {}
        for _ in range(kv_count):
            key = self.string()
            metadata[key] = self.value(self.unpack("<I"), key in keep)
        return tensor_count, metadata


def read_gguf_header(path: Path) -> GGUFHeader:
    """The header of a GGUF file (cached per file size and modification time: a replaced file is read again)."""
    stat = path.stat()
    return _read_header(path.resolve(), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _read_header(path: Path, size: int, mtime_ns: int) -> GGUFHeader:
    del size, mtime_ns  # part of the cache key
    check_gguf_header(path)
    try:
        reader = _Reader(path)
    except OSError as exc:
        raise CorruptModelError(f"Cannot read {path}: {exc.strerror or exc}.") from exc
    try:
        tensor_count, metadata = reader.metadata()
        names: list[str] = []
        tensors: list[TensorExtent] = []
        for _ in range(tensor_count):
            name = reader.string()
            names.append(name)
            rank = reader.unpack("<I")
            if rank > _MAX_DIMS:
                raise CorruptModelError(f"{path}: a tensor claims {rank} dimensions; the file is corrupt.")
            dims = tuple(reader.unpack("<Q") for _ in range(rank))
            elements = 1
            for dim in dims:
                elements *= dim
            kind = reader.unpack("<I")
            tensors.append(TensorExtent(kind, elements, reader.unpack("<Q"), name, dims))
    except (struct.error, UnicodeDecodeError, OverflowError) as exc:
        raise CorruptModelError(f"{path}: the GGUF header could not be read ({exc}).") from exc
    except OSError as exc:
        raise CorruptModelError(f"Cannot read {path}: {exc.strerror or exc}.") from exc
    finally:
        reader.close()
    alignment = metadata.get("general.alignment")
    alignment = alignment if isinstance(alignment, int) and alignment > 0 else 32
    data_start = -(-reader.position // alignment) * alignment
    return GGUFHeader(metadata, frozenset(names), tuple(tensors), data_start)


def read_gguf_arrays(path: Path, keys: Collection[str]) -> dict[str, Any]:
    """The metadata values named in `keys` (those present), long arrays in full: what read_gguf_header keeps only as
    their lengths (tokenizer.ggml.tokens, .merges, .token_type, .scores). Not cached: a 128k-token vocabulary with
    its merges is tens of MB of Python strings, wanted once per load."""
    check_gguf_header(path)
    try:
        reader = _Reader(path)
    except OSError as exc:
        raise CorruptModelError(f"Cannot read {path}: {exc.strerror or exc}.") from exc
    try:
        _count, metadata = reader.metadata(keep=frozenset(keys))
    except (struct.error, UnicodeDecodeError, OverflowError) as exc:
        raise CorruptModelError(f"{path}: the GGUF header could not be read ({exc}).") from exc
    except OSError as exc:
        raise CorruptModelError(f"Cannot read {path}: {exc.strerror or exc}.") from exc
    finally:
        reader.close()
    return {key: metadata[key] for key in keys if key in metadata}


# (values, bytes) per block of the ggml types the kernel computes on and the other K-quants: gguf-py's
# GGML_QUANT_SIZES for them (the tests hold the two equal). Another type's size comes from the gguf package, whose
# import costs ~30 ms at every load (it reads its writer, vocabulary and YAML modules too).
BLOCK_SIZES = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 10: (256, 84),
    11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 30: (1, 2),
}  # fmt: skip


def tensor_bytes(kind: int, count: int) -> int:
    """Bytes of one tensor's data; 0 for a type this gguf package does not know (never a false 'incomplete')."""
    sizes = BLOCK_SIZES.get(kind)
    if sizes is None:
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        try:
            sizes = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        except (ValueError, KeyError):
            return 0
    block, size = sizes
    return count // block * size


def check_gguf_complete(path: Path) -> None:
    """A GGUF file cut short (an interrupted download or copy) is named as such before anything reads its tensors."""
    header = read_gguf_header(path)
    size = path.stat().st_size
    needed = header.data_start + max(
        (tensor.offset + tensor_bytes(tensor.kind, tensor.elements) for tensor in header.tensors), default=0
    )
    if size < needed:
        raise CorruptModelError(
            f"{path.name} is an incomplete GGUF file: it has {size:,} bytes but its tensors need "
            f"{needed:,} (the download or copy was cut short). Download it again. File: {path}"
        )


def config_dict_from_gguf(path: Path) -> dict[str, Any]:
    """What transformers' GGUF loader would put in config.json, from the header alone; UnsupportedModelError for
    an architecture transformers cannot convert."""
    from transformers.integrations.ggml import GGUF_CONFIG_DEFAULTS_MAPPING, GGUF_CONFIG_MAPPING

    header = read_gguf_header(path)
    metadata = header.metadata
    architecture = header.architecture
    name = str(metadata.get("general.name", ""))
    model_type = _model_type(header)
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
        if renamed is None or renamed == -1 or isinstance(value, SkippedArray):
            continue
        config[renamed] = value
    for key, renamed in tables.get("tokenizer", {}).items():  # bos/eos/unk/pad ids, as transformers' config has them
        value = metadata.get(f"tokenizer.{key}")
        if isinstance(value, int) and not isinstance(value, bool):
            config[renamed] = value
    tokens = metadata.get("tokenizer.ggml.tokens")
    if "vocab_size" not in config and tokens is not None:
        config["vocab_size"] = tokens.length if isinstance(tokens, SkippedArray) else len(tokens)
    config["tie_word_embeddings"] = "output.weight" not in header.tensor_names
    config["model_type"] = _config_model_type(model_type)
    if name:
        config["_name_or_path"] = name
    return config


def _model_type(header: GGUFHeader) -> str:
    """The architecture as transformers' GGUF tables name it (a llama-architecture Mistral is "mistral")."""
    architecture = header.architecture
    model_type = architecture
    if "llama" in architecture and "mistral" in str(header.metadata.get("general.name", "")).lower():
        model_type = "mistral"
    return {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss"}.get(model_type, model_type)


def _config_model_type(model_type: str) -> str:
    return {"gemma3": "gemma3_text"}.get(model_type, model_type)


def gguf_summary(path: Path) -> tuple[dict[str, Any], int]:
    """What the library's list shows of a GGUF file: its model type and context length, as config_dict_from_gguf
    names them (without importing transformers for its tables: ~0.5 s), and its parameter count. (Its memory
    verdict is its runtime's plan: app.core.engines.verdicts.)"""
    header = read_gguf_header(path)
    config: dict[str, Any] = {"model_type": _config_model_type(_model_type(header))}
    context = header.metadata.get(f"{header.architecture}.context_length")
    if isinstance(context, int) and not isinstance(context, bool):
        config["max_position_embeddings"] = context
    return config, header.parameters
