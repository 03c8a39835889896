"""A model's transformers config, display name, shape and stored dtype, read from a spec, folder, config.json or
GGUF header (bounds-checked before anything is built from it): what the memory planner counts from."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from app.core.errors import CorruptModelError, HearthError, ModelNotFoundError, UnsupportedModelError
from app.core.models.dtypes import FLOAT_DTYPES
from app.core.models.gguf_meta import config_dict_from_gguf
from app.core.models.model_source import ModelSource, check_config_sizes, resolve_model
from app.core.models.safetensors_header import read_header


@dataclass(frozen=True)
class ModelShape:
    config: Any  # transformers PretrainedConfig
    name: str
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    max_context: int


def load_config(source: str | Path | ModelSource | Mapping[str, Any] | None) -> tuple[Any, str]:
    """A transformers config and a display name, from a spec, folder, config.json, .gguf, ModelSource or dict."""
    from transformers import PretrainedConfig

    if isinstance(source, PretrainedConfig):
        return source, str(getattr(source, "name_or_path", "") or source.model_type)
    if isinstance(source, Mapping):
        return _config_from_dict(dict(source), "config"), str(source.get("_name_or_path") or source.get("model_type"))
    if isinstance(source, str | Path) and Path(source).expanduser().name == "config.json":
        path = Path(source).expanduser()
        if not path.is_file():
            raise ModelNotFoundError(f"No model config at {path}: the file does not exist.")
        return _config_from_folder(path.parent), path.parent.name
    model = source if isinstance(source, ModelSource) else resolve_model(None if source is None else str(source))
    if model.kind == "gguf":
        return config_from_gguf(model.path), model.display_name
    ggufs = sorted(model.path.glob("*.gguf")) if not (model.path / "config.json").is_file() else []
    if ggufs:
        return config_from_gguf(ggufs[0]), model.display_name
    return _config_from_folder(model.path), model.display_name


def _config_from_folder(folder: Path) -> Any:
    from app.core.models.model_source import read_config

    data = read_config(folder)  # clear errors for a missing or broken config.json
    return _config_from_dict(data, str(folder / "config.json"))


def _config_from_dict(data: dict[str, Any], where: str) -> Any:
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = data.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise CorruptModelError(f"{where} has no model_type: it is not a transformers model config.")
    check_config_sizes(data, where)  # before anything is built from it
    if model_type not in CONFIG_MAPPING:
        raise UnsupportedModelError(
            f"{where}: model type {model_type!r} is not supported by this transformers version "
            "(models that need their own Python code are not planned)."
        )
    values = {k: v for k, v in data.items() if k != "model_type"}
    try:
        return AutoConfig.for_model(model_type, **values)
    except (TypeError, ValueError) as exc:
        raise CorruptModelError(f"{where} is not a valid {model_type} config: {exc}") from exc


def config_from_gguf(path: Path) -> Any:
    """The model config from a GGUF file's header (metadata only: no tensor is read or dequantized)."""
    return _config_from_dict(config_dict_from_gguf(path), str(path))


def stored_dtype(folder: Path) -> torch.dtype | None:
    """The floating dtype most of the folder's safetensors bytes are stored in (read from the files' headers), or
    None where that can't be told."""
    totals: dict[torch.dtype, int] = defaultdict(int)
    for path in sorted(folder.glob("*.safetensors")):
        try:
            tensors = read_header(path)
        except (OSError, ValueError):
            return None
        for tensor in tensors:
            dtype = FLOAT_DTYPES.get(tensor.dtype)
            if dtype is not None:
                totals[dtype] += tensor.end - tensor.start
    return max(totals, key=lambda dtype: totals[dtype]) if totals else None


def weights_dtype_of(source: Any, config: Any) -> torch.dtype | None:
    """The dtype a source's weight files hold: read from a folder's safetensors headers, else (a GGUF) what its
    config says."""
    folder: Path | None = None
    try:
        if isinstance(source, str | Path) and Path(source).expanduser().name == "config.json":
            folder = Path(source).expanduser().parent
        elif source is None or isinstance(source, str | Path | ModelSource):
            spec = None if source is None else str(source)
            model = source if isinstance(source, ModelSource) else resolve_model(spec)
            folder = None if model.kind == "gguf" else model.path
    except (HearthError, OSError, ValueError):
        folder = None
    found = stored_dtype(folder) if folder is not None and folder.is_dir() else None
    return found or config_dtype(config)


def config_dtype(config: Any) -> torch.dtype | None:
    """The dtype the config says the weights are stored in (`dtype`, or the older `torch_dtype`), if it says one."""
    for name in ("dtype", "torch_dtype"):
        value = getattr(config, name, None)
        if isinstance(value, torch.dtype):
            return value
        if isinstance(value, str) and isinstance(getattr(torch, value, None), torch.dtype):
            return getattr(torch, value)
    return None


def model_shape(config: Any, name: str) -> ModelShape:
    text = config.get_text_config(decoder=True)
    hidden = int(getattr(text, "hidden_size", 0) or 0)
    return ModelShape(
        config=config,
        name=name,
        hidden_size=hidden,
        intermediate_size=int(getattr(text, "intermediate_size", 0) or 4 * hidden),
        vocab_size=int(getattr(text, "vocab_size", 0) or 0),
        max_context=int(getattr(text, "max_position_embeddings", 0) or 2048),
    )
