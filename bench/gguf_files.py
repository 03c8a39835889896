"""What a GGUF file holds, as the benches print it: its format, its tensors' block types, and the bytes a decode step
reads of it. Read from the header and tensor table with the `gguf` package; no weight is dequantized here."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

LAYER_TENSOR = re.compile(r"^blk\.\d+\.(.+)\.weight$")


def _reader(path: Path) -> Any:
    import gguf

    return gguf.GGUFReader(str(path))


def file_format(path: Path, reader: Any = None) -> str:
    """The file's format as llama.cpp names it (general.file_type: Q4_K_M, Q8_0, BF16, ...), else its main type."""
    import gguf

    reader = reader or _reader(path)
    field = reader.get_field("general.file_type")
    if field is not None:
        try:
            name = gguf.LlamaFileType(int(field.contents())).name
        except ValueError:
            name = ""
        if name:
            return name.removeprefix("MOSTLY_").replace("ALL_", "")
    counts = Counter(t.tensor_type.name for t in reader.tensors if len(t.shape) > 1)
    return counts.most_common(1)[0][0] if counts else "unknown"


def role(name: str) -> str:
    """A tensor's role without its layer number: blk.3.attn_v.weight -> attn_v; token_embd, output, norms as named."""
    found = LAYER_TENSOR.match(name)
    return found.group(1) if found else name.removesuffix(".weight")


def describe(path: Path) -> dict[str, Any]:
    """The file's format, tensor count per type, bytes per type, per-role type counts, and decode bytes/token."""
    reader = _reader(path)
    types: Counter[str] = Counter()
    type_bytes: Counter[str] = Counter()
    roles: dict[str, Counter[str]] = defaultdict(Counter)
    for tensor in reader.tensors:
        kind = tensor.tensor_type.name
        types[kind] += 1
        type_bytes[kind] += int(tensor.n_bytes)
        roles[role(str(tensor.name))][kind] += 1
    return {
        "file": str(path),
        "file_bytes": path.stat().st_size,
        "format": file_format(path, reader),
        "types": dict(types.most_common()),
        "type_bytes": dict(type_bytes.most_common()),
        "roles": {name: dict(counts) for name, counts in sorted(roles.items())},
        "decode_bytes_per_token": decode_bytes_per_token(path, reader),
    }


def decode_bytes_per_token(path: Path, reader: Any = None) -> int:
    """The bytes one decode step reads of the file, at the file's own block sizes: every matrix and the head (the
    token embedding when tied, else output.weight), norms included; the embedding table of an untied model is read
    one row per token, which is left out."""
    reader = reader or _reader(path)
    tensors = {str(t.name): int(t.n_bytes) for t in reader.tensors}
    if "output.weight" in tensors:
        tensors.pop("token_embd.weight", None)
    return sum(tensors.values())


def histogram_lines(info: dict[str, Any]) -> list[str]:
    """The type histogram as printed: per type its tensor count, MiB and share of the file's tensor bytes, then which
    roles hold which types (roles with one type and the norms folded into one line each)."""
    total = sum(info["type_bytes"].values()) or 1
    lines = [f"{info['file']}: {info['format']}, {info['file_bytes'] / 2**20:.1f} MiB"]
    for kind, count in info["types"].items():
        size = info["type_bytes"][kind]
        lines.append(f"  {kind:<6} {count:>4} tensors {size / 2**20:>9.1f} MiB {size / total:>6.1%}")
    for name, counts in info["roles"].items():
        shown = ", ".join(f"{kind} x{count}" for kind, count in sorted(counts.items()))
        lines.append(f"    {name:<16} {shown}")
    lines.append(f"  decode reads {info['decode_bytes_per_token'] / 2**20:.1f} MiB per token (matrices + head)")
    return lines


def default_model_folder() -> Path:
    """The default model as a Hugging Face folder (fp32 safetensors, config, tokenizer), for the benches that need one
    (transformers as a peer, random models with its tokenizer): written once from its GGUF into .cache/bench/ (Hearth
    itself reads the GGUF; this copy is the benches' own)."""
    from app.core.models.model_source import default_model_gguf
    from tests.helpers.tiny_models import write_default_model_folder

    gguf = default_model_gguf()
    stat = gguf.stat()
    cache = Path(__file__).resolve().parents[1] / ".cache" / "bench"
    folder = cache / f"default-model-{stat.st_size}-{stat.st_mtime_ns}"
    if (folder / "model.safetensors").is_file():
        return folder
    write_default_model_folder(folder.with_name(folder.name + ".partial")).rename(folder)
    return folder
