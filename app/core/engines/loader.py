"""Load a model through transformers (+ bitsandbytes, see app.core.models.quant) onto the device the user asked for.

A GGUF file is read directly (app.core.engines.gguf_torch: tensor by tensor, nothing converted or written) with its
own tokenizer (app.core.models.gguf_tokenizer); a folder loads through transformers' from_pretrained.
Never falls back silently: a missing GPU is an error when asked for, and a notice when `auto` lands on the CPU.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from app.core.chat.template_safety import check_model
from app.core.engines.backend import CPU_NOTICE
from app.core.engines.gguf_torch import gguf_config, load_gguf_model
from app.core.errors import (
    CorruptModelError,
    DeviceUnavailableError,
    HearthError,
    LoadCancelled,
    ModelNotFoundError,
    QuantizationError,
    UnsafeModelError,
    UnsupportedModelError,
)
from app.core.fastpath.packed import set_compute_dtype
from app.core.fastpath.prefill import apply_prefill_upcast
from app.core.memory.fit import window_that_fits
from app.core.memory.model_config import stored_dtype
from app.core.memory.planner import plan_memory
from app.core.memory.release import release_freed_memory
from app.core.models.attention import attention_shape
from app.core.models.gguf_meta import check_gguf_complete
from app.core.models.gguf_tokenizer import load_gguf_tokenizer
from app.core.models.model_source import (
    ModelSource,
    check_folder_weights,
    read_config,
    resolve_model,
    weights_fingerprint,
)
from app.core.models.quant import Precision, is_4bit, quantization_kwargs, resolve_quantization

log = logging.getLogger(__name__)

ProgressCallback = Callable[[str, float | None], None]

# bnb's CPU 4-bit kernel asserts on the first forward unless each quantized layer's output size is a multiple of this.
CPU_4BIT_BLOCK_N = 32


@dataclass(frozen=True)
class DevicePlacement:
    device: str  # "cuda:0", "cpu", "mps", "disk"
    modules: int
    parameter_bytes: int


@dataclass
class LoadedModel:
    model: Any  # transformers PreTrainedModel
    tokenizer: Any
    source: ModelSource
    folder: Path  # the model's folder, or for a GGUF model the .gguf file itself (read as it is: nothing converted)
    quantization: Precision  # what `auto` (or the user's choice) resolved to
    device: str  # resolved torch device string
    context_window: int
    load_seconds: float
    placements: list[DevicePlacement] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    weights_fingerprint: str = ""  # which weight files, as they were on disk (part of the response cache key)
    recovered: list[str] = field(default_factory=list)  # damaged derived files moved aside and rebuilt

    @property
    def model_id(self) -> str:
        return self.source.repo_id or str(self.source.path)

    @property
    def display_name(self) -> str:
        return self.source.display_name

    def describe(self) -> str:
        where = ", ".join(
            f"{p.device} ({p.modules} modules, {p.parameter_bytes / 2**20:.0f} MiB)" for p in self.placements
        )
        return f"{self.display_name} · {self.quantization} · {where}"


def resolve_device(choice: str) -> tuple[str, list[str]]:
    """The torch device for a user choice, plus notices the UI must show."""
    cuda = torch.cuda.is_available()
    mps = bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()
    if choice == "auto":
        if cuda:
            return "cuda:0", []
        if mps:
            return "mps", []
        reason = "this PyTorch build has no CUDA support" if torch.version.cuda is None else "no CUDA GPU was found"
        return "cpu", [CPU_NOTICE.format(reason=reason)]
    if choice == "cuda":
        if not cuda:
            detail = (
                "this PyTorch build has no CUDA support (install the CUDA build of torch)"
                if torch.version.cuda is None
                else "no CUDA GPU or driver was found"
            )
            raise DeviceUnavailableError(
                f"The GPU (CUDA) was requested but {detail}. Use --device cpu to run on the CPU."
            )
        return "cuda:0", []
    if choice == "mps":
        if not mps:
            raise DeviceUnavailableError("Apple Metal (MPS) was requested but is not available on this machine.")
        return "mps", []
    if choice == "cpu":
        return "cpu", []
    raise DeviceUnavailableError(f"Unknown device {choice!r}: use auto, cuda, cpu or mps.")


def model_weights(source: ModelSource, *, allow_pickle: bool = False) -> Path:
    """Where the source's weights are read from: its folder (HF layout), or a GGUF file (the source itself, or a
    folder's only weights), read directly."""
    if source.kind == "gguf":
        return source.path
    weights = check_folder_weights(source.path, allow_pickle=allow_pickle)
    if weights[0].suffix == ".gguf":
        return weights[0]
    return source.path


def is_gguf_file(path: Path) -> bool:
    return path.suffix.lower() == ".gguf" and path.is_file()


def file_fingerprint(path: Path) -> str:
    """weights_fingerprint's identity of one weight file (name, size, modification time)."""
    try:
        stat = path.stat()
    except OSError:
        return ""
    return hashlib.sha256(f"{path.name}|{stat.st_size}|{stat.st_mtime_ns}\n".encode()).hexdigest()[:20]


def load_model(
    spec: str | ModelSource | None,
    *,
    quantization: str = "auto",  # a Quantization name (app.core.models.quant), checked here
    device: str = "auto",
    context_length: int | None = None,
    allow_pickle: bool = False,
    trust_remote_code: bool = False,
    progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
    ignore_fit: bool = False,
    free_bytes: int | None = None,
) -> LoadedModel:
    """Load a model; refused with ModelTooLargeError when the memory planner says it will not fit (unless
    ignore_fit). free_bytes states the device's free memory instead of measuring it."""
    started = time.perf_counter()

    def step(message: str, fraction: float | None = None) -> None:
        if cancel is not None and cancel.is_set():
            raise LoadCancelled()
        if progress:
            progress(message, fraction)

    source = spec if isinstance(spec, ModelSource) else resolve_model(spec)
    torch_device, notices = resolve_device(device)
    quant = resolve_quantization(quantization, torch_device)
    step(f"Preparing {source.display_name}…", 0.05)
    recovered: list[str] = []
    folder = model_weights(source, allow_pickle=allow_pickle)
    gguf = is_gguf_file(folder)
    if gguf:
        check_gguf_complete(folder)  # a cut-short file is named before anything reads it
        step("Reading the tokenizer…", 0.15)
        tokenizer = load_gguf_tokenizer(folder, recovered)  # a damaged cached copy: said, not lost
        config = gguf_config(folder)
    else:
        config_data = read_config(folder)
        _check_remote_code(folder, config_data, trust_remote_code)
        step("Reading the tokenizer…", 0.15)
        try:
            tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
        except (OSError, ValueError) as exc:
            raise CorruptModelError(f"The tokenizer in {folder} could not be loaded: {exc}") from exc
        try:
            config = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
        except ValueError as exc:
            raise UnsupportedModelError(
                f"{folder}: model type {config_data.get('model_type')!r} is not supported by this transformers "
                f"version ({exc})."
            ) from exc
    # A template that reaches outside its sandbox is refused at load (naming its file), not at every reply.
    check_model(folder, tokenizer)
    if is_4bit(quant) and torch_device == "cpu":
        _check_cpu_4bit_shapes(config)
    fit_window = None
    if not ignore_fit:
        step("Checking memory…", 0.25)
        fit_window = _check_memory(source, config, quant, torch_device, context_length, free_bytes, notices)
    step(f"Loading weights ({quant} on {torch_device})…", 0.3)
    kwargs = quantization_kwargs(quant, torch_device)
    compute_dtype = kwargs["dtype"]
    if quant == "q4" and not gguf:
        # In the files' own dtype transformers keeps every tensor a view of the mapped file: the matrices are then
        # packed (or their packed copy mapped) without a 16-bit copy of the model ever being made.
        kwargs["dtype"] = stored_dtype(folder) or compute_dtype
    try:
        if gguf:
            model = load_gguf_model(folder, config, device_map={"": torch_device}, step=step, **kwargs)
        else:
            model = AutoModelForCausalLM.from_pretrained(
                folder,
                device_map={"": torch_device},
                trust_remote_code=trust_remote_code,
                use_safetensors=not allow_pickle,
                **kwargs,
            )
    except ValueError as exc:
        message = str(exc)
        if "does not appear to have" in message or "no file named" in message.lower():
            raise ModelNotFoundError(f"{folder}: {message}") from exc
        if "Unrecognized configuration" in message or "model type" in message:
            raise UnsupportedModelError(f"{folder}: {message}") from exc
        raise CorruptModelError(f"{folder}: the weights could not be loaded ({message}).") from exc
    except (OSError, RuntimeError, KeyError, SafetensorError) as exc:
        raise CorruptModelError(
            f"{folder}: the weights could not be loaded ({type(exc).__name__}: {exc}). "
            "The files may be corrupt or incomplete."
        ) from exc
    model.eval()
    if quant == "q4":
        set_compute_dtype(model, compute_dtype)
        quant = _hold_once(model, folder, notices if quantization == "q4" else [], recovered)
        if quant != "q4" and model.dtype != compute_dtype:  # held as bf16 after all: now it is a copy
            model.to(compute_dtype)
    apply_prefill_upcast(model, torch_device, quant)  # the stats say so (decode_path_note)
    if torch_device == "cpu":
        release_freed_memory()  # what loading freed (transient copies, parse buffers) goes back to the system
    step("Ready", 1.0)
    placements = device_placements(model)
    if any(p.device in ("cpu", "disk") for p in placements) and torch_device.startswith("cuda"):
        notices.append("Part of the model is on the CPU or disk, not the GPU: it will be much slower.")
    window = int(getattr(config, "max_position_embeddings", 0) or 2048)
    if context_length:
        window = min(window, context_length)
    if fit_window:
        window = min(window, fit_window)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        source=source,
        folder=folder,
        quantization=quant,
        device=torch_device,
        context_window=window,
        load_seconds=time.perf_counter() - started,
        placements=placements,
        notices=notices,
        weights_fingerprint=file_fingerprint(folder) if gguf else weights_fingerprint(folder),
        recovered=recovered,
    )


def _hold_once(model: Any, folder: Path, notices: list[str], recovered: list[str]) -> Precision:
    """Swap the decoder's matrices for their one Q4_1 copy; "q4", or "bf16" (with a notice) where it can't be done."""
    from app.core.fastpath.select import hold_weights_once

    reason = hold_weights_once(model, folder, recovered)
    if not reason:
        return "q4"
    notices.append(f"Loaded as bf16: q4 needs the fused decode step ({reason}).")
    return "bf16"


def _check_memory(
    source: ModelSource,
    config: Any,
    quant: Precision,
    device: str,
    context_length: int | None,
    free_bytes: int | None,
    notices: list[str],
) -> int | None:
    """Refuse a model the planner says will not fit; returns a shorter context window when only that fits."""
    try:
        plan = plan_memory(
            config,
            quantization=quant,
            context=context_length,
            device=device,
            free_bytes=free_bytes,
            name=source.display_name,
        )
    except (HearthError, ValueError, RuntimeError, AttributeError, TypeError) as exc:
        # The planner cannot model this architecture: load without the check rather than refuse a working model.
        log.warning("memory check skipped: %s", exc)
        notices.append(f"The memory check was skipped ({exc}).")
        return None
    log.info("memory plan: %s", plan.to_json_dict())
    return window_that_fits(plan, context_length is not None, notices)


def _check_remote_code(folder: Path, config: dict[str, object], trust_remote_code: bool) -> None:
    if trust_remote_code:
        return
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = str(config.get("model_type", ""))
    if model_type not in CONFIG_MAPPING:
        if config.get("auto_map"):
            raise UnsafeModelError(
                f"{folder / 'config.json'} needs the model's own Python code (auto_map), which Hearth does not run "
                "by default. If you trust its source, opt in with --trust-remote-code."
            )
        raise UnsupportedModelError(
            f"{folder}: model type {model_type!r} is not supported by transformers {_transformers_version()}."
        )


def _transformers_version() -> str:
    import transformers

    return str(transformers.__version__)


def _check_cpu_4bit_shapes(config: Any) -> None:
    """bnb's CPU 4-bit kernel needs output sizes divisible by 32; say so before a forward asserts."""
    sizes = {
        "hidden_size": getattr(config, "hidden_size", None),
        "intermediate_size": getattr(config, "intermediate_size", None),
    }
    try:
        shape = attention_shape(config)
    except (AttributeError, TypeError, ValueError, ZeroDivisionError):
        shape = None  # no attention config to check: the other sizes still are
    if shape is not None:
        sizes["q_proj"] = shape.heads * shape.head_dim
        sizes["kv_proj"] = shape.kv_heads * shape.head_dim
    bad = {k: v for k, v in sizes.items() if isinstance(v, int) and v % CPU_4BIT_BLOCK_N}
    if bad:
        listed = ", ".join(f"{k}={v}" for k, v in bad.items())
        raise QuantizationError(
            f"4-bit on the CPU needs layer sizes divisible by {CPU_4BIT_BLOCK_N} ({listed}); use --quant int8 or bf16."
        )


def device_placements(model: Any) -> list[DevicePlacement]:
    """Where every parameter actually lives, summed per device (bnb's packed 4-bit storage included)."""
    bytes_by_device: dict[str, int] = defaultdict(int)
    modules_by_device: dict[str, set[str]] = defaultdict(set)
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        device = str(tensor.device)
        bytes_by_device[device] += tensor.numel() * tensor.element_size()
        modules_by_device[device].add(name.rsplit(".", 1)[0])
    hf_map = getattr(model, "hf_device_map", None) or {}
    for value in hf_map.values():
        if value == "disk":
            bytes_by_device.setdefault("disk", 0)
    return [
        DevicePlacement(device=device, modules=len(modules_by_device[device]), parameter_bytes=size)
        for device, size in sorted(bytes_by_device.items())
    ]


def device_map_json(loaded: LoadedModel) -> str:
    return json.dumps([p.__dict__ for p in loaded.placements])
