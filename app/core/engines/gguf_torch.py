"""Load a GGUF file straight into a transformers model, one tensor at a time: no converted copy on disk, and never a
full-precision copy of the model in memory.

The model is built from the header's config (app.core.models.gguf_meta) the way transformers builds any model, and
its weights come from a state dict of lazy tensors: transformers materializes one when it places it, and only then
are its bytes read from the file, dequantized (`dequantize_tensor`), put back in transformers' layout (llama.cpp's
Q/K row order undone by transformers' own GGUF tensor processors, names from gguf-py's tensor map) and handed over,
to be cast to bf16/fp32 or quantized to NF4/int8 by the bitsandbytes integration as it arrives. Loading is kept
sequential (transformers' loader otherwise materializes on worker threads far ahead of placing), so the peak is the
model as loaded plus one tensor's staging: its stored bytes, its fp32 values and their cast.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from app.core.errors import CorruptModelError, UnsupportedModelError
from app.core.models.gguf_meta import TensorExtent, config_dict_from_gguf, read_gguf_header, tensor_bytes
from app.core.models.gguf_tokenizer import gguf_eos_ids

log = logging.getLogger(__name__)

StepCallback = Callable[[str, float | None], None]  # raises LoadCancelled when the user cancelled

# The GGUF architectures whose experts llama.cpp stacks into one tensor per layer: transformers' processors build
# those from several file tensors at once, which a one-tensor-at-a-time load can't do.
STACKED_EXPERT_ARCHITECTURES = ("qwen2moe", "qwen3moe", "gpt-oss", "gpt_oss", "minimax-m2")
# transformers' loader materializes tensors on a thread pool unless this is set (read at each load).
_SEQUENTIAL_LOAD_ENV = "HF_DEACTIVATE_ASYNC_LOAD"


def ggml_type_name(kind: int) -> str:
    from gguf.constants import GGMLQuantizationType

    try:
        return GGMLQuantizationType(kind).name
    except ValueError:
        return f"type {kind}"


def dequantize_tensor(raw: np.ndarray, kind: int, shape: tuple[int, ...]) -> np.ndarray:
    """One tensor's values as fp32 in torch order `shape`, from its bytes as stored (`raw`, uint8) in ggml type
    `kind`. A fresh array, never a view of `raw`. gguf-py's numpy dequantizers for now (every type llama.cpp writes);
    UnsupportedModelError for a type they do not know."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    try:
        qtype = GGMLQuantizationType(kind)
        block, block_bytes = GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError) as exc:
        raise UnsupportedModelError(f"ggml type {kind} is not one this loader can read") from exc
    row = shape[-1] if shape else 1
    if row % block:
        raise CorruptModelError(f"rows of {row} values do not split into {qtype.name} blocks of {block}")
    rows = raw.reshape(-1, row // block * block_bytes)
    try:
        values = dequantize(rows, qtype)
    except NotImplementedError as exc:
        raise UnsupportedModelError(f"{qtype.name} weights can't be dequantized here yet") from exc
    values = np.asarray(values, dtype=np.float32).reshape(shape)
    return values.copy() if np.shares_memory(values, raw) else values


class GGUFTensor:
    """One tensor of the file, read when transformers materializes it (`tensor[...]`, as it reads safetensors)."""

    def __init__(self, reader: GGUFTensorReader, extent: TensorExtent, target: str) -> None:
        self.reader = reader
        self.extent = extent
        self.target = target  # the model's name for it

    def __getitem__(self, _index: Any) -> torch.Tensor:
        return self.reader.materialize(self)


class GGUFTensorReader:
    """Reads, dequantizes and re-lays out one tensor at a time, reporting progress (and cancellation) per tensor."""

    def __init__(
        self,
        path: Path,
        config: dict[str, Any],
        expected: dict[str, torch.Size],
        step: StepCallback | None,
        fractions: tuple[float, float],
    ) -> None:
        from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

        header = read_gguf_header(path)
        self.path = path
        self.data_start = header.data_start
        self.processor = TENSOR_PROCESSORS.get(header.architecture, TensorProcessor)(config=config)
        self.expected = expected
        self.step = step
        self.fractions = fractions
        self.total = 0
        self.done = 0
        self.handle: Any = None

    def open(self) -> None:
        try:
            self.handle = self.path.open("rb")
        except OSError as exc:
            raise CorruptModelError(f"Cannot read {self.path}: {exc.strerror or exc}.") from exc

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None

    def materialize(self, tensor: GGUFTensor) -> torch.Tensor:
        extent = tensor.extent
        if self.step is not None:
            start, end = self.fractions
            self.step(f"Loading {extent.name}…", start + (end - start) * self.done / max(self.total, 1))
        raw = self._read(extent)
        try:
            values = dequantize_tensor(raw, extent.kind, extent.shape)
        except (UnsupportedModelError, CorruptModelError) as exc:
            raise type(exc)(
                f"{self.path.name}: tensor {extent.name} ({ggml_type_name(extent.kind)}): {exc}. File: {self.path}"
            ) from exc
        del raw
        parsed: dict[str, Any] = {"tensors": {}}
        result = self.processor.process(
            weights=values, name=extent.name, tensor_key_mapping={}, parsed_parameters=parsed
        )
        weights = result.weights if result.name is not None else parsed["tensors"].pop(tensor.target, None)
        if weights is None:
            raise UnsupportedModelError(
                f"{self.path.name}: tensor {extent.name} can't be loaded on its own by this loader. File: {self.path}"
            )
        out = weights if isinstance(weights, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(weights))
        expected = self.expected.get(tensor.target)
        if expected is not None and tuple(out.shape) != tuple(expected):
            raise CorruptModelError(
                f"{self.path.name}: tensor {extent.name} has shape {tuple(out.shape)} but the model its header "
                f"describes needs {tuple(expected)} for {tensor.target}; the file is damaged or inconsistent. "
                f"File: {self.path}"
            )
        self.done += 1
        return out

    def _read(self, extent: TensorExtent) -> np.ndarray:
        size = tensor_bytes(extent.kind, extent.elements)
        raw = np.empty(size, dtype=np.uint8)
        try:
            self.handle.seek(self.data_start + extent.offset)
            got = self.handle.readinto(raw.data)
        except OSError as exc:
            raise CorruptModelError(f"Cannot read {self.path}: {exc.strerror or exc}.") from exc
        if got != size:
            raise CorruptModelError(
                f"{self.path.name} ends inside tensor {extent.name} (it needs {size:,} bytes, {got:,} are there); "
                f"the file may be truncated. Download it again. File: {self.path}"
            )
        return raw


def gguf_config(path: Path) -> Any:
    """The transformers config of a GGUF file, from its header (what transformers' GGUF loader would build)."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    values = config_dict_from_gguf(path)
    model_type = str(values.pop("model_type"))
    if model_type not in CONFIG_MAPPING:
        raise UnsupportedModelError(
            f"{path.name}: GGUF architecture {model_type!r} is not supported by this transformers version."
        )
    try:
        return AutoConfig.for_model(model_type, **values)
    except (TypeError, ValueError) as exc:
        raise CorruptModelError(f"{path.name}: its header does not make a valid {model_type} config ({exc}).") from exc


def gguf_state_dict(
    path: Path, config: Any, step: StepCallback | None, fractions: tuple[float, float]
) -> tuple[dict[str, GGUFTensor], GGUFTensorReader, Any]:
    """The model's parameter names -> lazy tensors of the file, checked against the model the config describes:
    every weight it needs is in the file (a tied output head excepted), with as many values as it needs; and the
    reader behind them and the model's class."""
    from transformers import AutoModelForCausalLM

    header = read_gguf_header(path)
    architecture = header.architecture
    if architecture in STACKED_EXPERT_ARCHITECTURES:
        raise UnsupportedModelError(
            f"{path.name}: {architecture} GGUF files (mixture of experts, stacked per layer) can't be loaded "
            "through torch yet."
        )
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    expected = {name: tensor.shape for name, tensor in skeleton.state_dict().items()}
    reader = GGUFTensorReader(path, config.to_dict(), expected, step, fractions)
    names = gguf_names(path, architecture, list(expected), config, reader.processor)
    tensors: dict[str, GGUFTensor] = {}
    unused: list[str] = []
    for extent in header.tensors:
        target = names.get(extent.name)
        if target is None or target not in expected:
            unused.append(extent.name)
            continue
        if extent.elements != expected[target].numel():
            raise CorruptModelError(
                f"{path.name}: tensor {extent.name} holds {extent.elements:,} values but the model its header "
                f"describes needs {expected[target].numel():,} for {target}; the file is damaged or inconsistent. "
                f"File: {path}"
            )
        tensors[target] = GGUFTensor(reader, extent, target)
    if unused:
        log.info("%s: tensors the model does not use: %s", path.name, ", ".join(unused))
    tied = _tied_names(skeleton)
    buffers = {name for name, _ in skeleton.named_buffers()}
    missing = sorted(set(expected) - set(tensors) - tied - buffers)
    if missing:
        listed = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise CorruptModelError(
            f"{path.name} lacks weights its {architecture} header needs ({listed}); the file is incomplete or "
            f"not a model transformers can run. File: {path}"
        )
    reader.total = len(tensors)
    return tensors, reader, type(skeleton)


def gguf_names(path: Path, architecture: str, targets: list[str], config: Any, processor: Any) -> dict[str, str]:
    """GGUF tensor name -> the model's parameter name, from gguf-py's tensor name map of the file's architecture
    (what transformers' get_gguf_hf_weights_map does, with one name map instead of one per submodule: 20 s -> 1 ms
    for the default model). A name is tried whole, then without its leading parts (a submodule's own names)."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    arch = next((key for key, value in MODEL_ARCH_NAMES.items() if value == architecture), None)
    if arch is None:
        raise UnsupportedModelError(f"{path.name}: GGUF architecture {architecture!r} is not known to gguf-py.")
    layers = int(getattr(config.get_text_config(decoder=True), "num_hidden_layers", 0) or 0)
    name_map = get_tensor_name_map(arch, layers)
    names: dict[str, str] = {}
    for target in targets:
        name = processor.preprocess_name(target)
        base, suffix = name, ""
        if name.endswith((".weight", ".bias")):
            base, suffix = name.rsplit(".", 1)
            suffix = "." + suffix
        parts = base.split(".")
        for start in range(len(parts)):
            found = name_map.get_name(".".join(parts[start:]))
            if found is not None:
                names.setdefault(found + suffix, target)
                break
    return names


def _tied_names(model: Any) -> set[str]:
    """Parameters the model ties to another (the output head to the embedding when the config says so)."""
    tied = getattr(model, "_tied_weights_keys", None) or {}
    if not getattr(model.config.get_text_config(decoder=True), "tie_word_embeddings", False):
        return set()
    return set(tied)  # a dict (target -> source) in transformers 5, a list before


@contextlib.contextmanager
def _sequential_loading() -> Iterator[None]:
    """transformers' loader materializes every tensor on worker threads at once unless told not to: that would hold
    the whole model dequantized before placing it."""
    before = os.environ.get(_SEQUENTIAL_LOAD_ENV)
    os.environ[_SEQUENTIAL_LOAD_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(_SEQUENTIAL_LOAD_ENV, None)
        else:
            os.environ[_SEQUENTIAL_LOAD_ENV] = before


def load_gguf_model(
    path: Path,
    config: Any,
    *,
    device_map: dict[str, str],
    step: StepCallback | None = None,
    fractions: tuple[float, float] = (0.3, 0.95),
    **kwargs: Any,
) -> Any:
    """The GGUF's model through transformers, its weights streamed from the file (`kwargs`: dtype and
    quantization_config, as for a folder). Progress per tensor goes to `step`, which may raise to cancel."""
    state_dict, reader, model_class = gguf_state_dict(path, config, step, fractions)
    reader.open()
    try:
        with _sequential_loading():
            model = model_class.from_pretrained(
                None, config=config, state_dict=state_dict, device_map=device_map, **kwargs
            )
    finally:
        reader.close()
    model.config.name_or_path = str(path)
    ends = sorted(gguf_eos_ids(path))
    if len(ends) > 1 and model.generation_config is not None:
        model.generation_config.eos_token_id = ends  # the end-of-turn ids llama.cpp stops on too
    return model
