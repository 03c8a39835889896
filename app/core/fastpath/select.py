"""Pick the decode path for a loaded model and apply it; never raise: a failure is the plain path plus a reason."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from app.core.fastpath import int8, integrity, kernel, native, packed, prefill
from app.core.fastpath.packed_cache import packed_cache_file, write_packed_copy
from app.core.fastpath.rows import release_file_pages
from app.core.models.dtypes import FLOAT_DTYPES
from app.core.models.model_source import file_fingerprint, weights_fingerprint

log = logging.getLogger(__name__)

# "auto" picks the fastest measured path for the device and weights; the others force one (bench, tests).
DECODE_PATHS = ("auto", "eager", "fused-int8", "fused-q4", "int8-decode")
ENV_OVERRIDE = "HEARTH_DECODE_PATH"
# Weights "auto" runs through the fused C decode step on the CPU. Measured on SmolLM2-135M, 2-core AVX2 machine,
# bf16 weights (bench/engine_speed.py): eager 25 tok/s, fused-int8 107 (4.25x), fused-q4 147 (5.85x); teacher-forced
# greedy agreement with eager 93/96 (int8) and 90/96 (Q4_1), both inside the 90 % bound the tests hold. The fastest
# measured path is the default; fp32 stays exact (see below); forcing a fused path also takes fp32.
# The decoder matrices' format per source precision under "auto" (the lm_head is int8 rows in both).
AUTO_FUSED_FORMAT = {"bf16": "q4", "nf4": "q4", "nf4-nodq": "q4", "q4": "q4"}
AUTO_FUSED_SOURCES = tuple(AUTO_FUSED_FORMAT)
FUSED_PATHS = {"fused-int8": "int8", "fused-q4": "q4"}
FORCED_FUSED_SOURCES = (*AUTO_FUSED_SOURCES, "fp32")
# Where the fused step can't run, "auto" repacks nf4 to int8 for torch's int8 kernel (4.6x faster than bnb's CPU
# 4-bit path). fp32 stays exact (a user who picks fp32 asks for precision; the tests that compare reused-cache runs
# with fresh ones rely on it); bnb int8 (LLM.int8) already is int8; fp16 matmuls are slow on CPUs in any form. bf16
# without the fused step stays eager: the int8 copies decoded only 1.07x faster for +38 % weights memory. Forcing
# "int8-decode" also repacks bf16, fp32 and fp16.
AUTO_INT8_SOURCES = ("nf4", "nf4-nodq")
FORCED_INT8_SOURCES = (*AUTO_INT8_SOURCES, "bf16", "fp32", "fp16")


@dataclass(frozen=True)
class DecodePathChoice:
    name: str  # what runs single-token steps: "eager", "fused-int8", "fused-q4" or "int8-decode"
    note: str = ""  # why this path (and why not a faster one), shown with the reply's stats
    patched_layers: int = 0
    added_bytes: int = 0  # memory the path adds (the int8 copies) on top of the loaded weights
    prepare_seconds: float = 0.0
    fused: native.FusedDecoder | None = None  # the C decode step, for the "fused-*" paths
    # Which weights single-token steps read, for keys that must change when they do (the response cache):
    # "sha256:<hex>" of the packed copy's file (fused-*, int8-decode), or "dense:<fingerprint>" of the model folder's
    # weight files (names, sizes, modification times) when steps run the loaded weights; "" with no folder.
    weights_digest: str = ""
    # Derived files found damaged while the path was set up, each moved to NAME.damaged and rebuilt: one line each
    # for the user (the CLI prints them as `hearth: note:`, the window as a banner; see Engine.recovery_notices).
    recovery_notices: tuple[str, ...] = ()

    def step(self) -> AbstractContextManager[None]:
        """Wrap one single-token forward pass: the fast path is active only inside it."""
        return int8.active() if self.name == "int8-decode" else nullcontext()


def apply_decode_path(
    model: Any, device: str, quantization: str, requested: str = "auto", folder: Path | None = None
) -> DecodePathChoice:
    """Apply the requested (or the best) decode path to `model` in place.

    With the model's `folder`, the int8 copies are cached under cache_dir()/decode-int8, keyed by the folder's weight
    files (path, size, mtime) and the precision, so the next load reads them instead of packing again. Each copy is
    written with its sha256 and checked before use: a damaged one is moved to NAME.damaged and packed again, with a
    line in `recovery_notices`.
    """
    notices: list[str] = []
    choice = _choose(model, device, quantization, requested, folder, notices)
    notices[:0] = kernel.take_library_notices()  # the kernel library's, found while loading it
    digest = choice.weights_digest or (_dense_digest(folder) if choice.fused is None and folder is not None else "")
    return dataclasses.replace(choice, weights_digest=digest, recovery_notices=(*notices, *choice.recovery_notices))


def _choose(
    model: Any, device: str, quantization: str, requested: str, folder: Path | None, notices: list[str]
) -> DecodePathChoice:
    requested = os.environ.get(ENV_OVERRIDE, "") or requested
    if requested not in DECODE_PATHS:
        return DecodePathChoice("eager", f"unknown decode path {requested!r} (use {', '.join(DECODE_PATHS)})")
    if requested == "eager":
        return DecodePathChoice("eager", "plain path requested")
    if not str(device).startswith("cpu"):
        return DecodePathChoice("eager", "GPU: the model's own kernels (bitsandbytes for nf4)")
    fused_reason = ""
    forced_fused = requested in FUSED_PATHS
    if requested == "auto" or forced_fused:
        if quantization in (FORCED_FUSED_SOURCES if forced_fused else AUTO_FUSED_SOURCES):
            weight_format = FUSED_PATHS[requested] if forced_fused else AUTO_FUSED_FORMAT[quantization]
            fused = _apply_fused(model, quantization, folder, weight_format, notices)
            if isinstance(fused, DecodePathChoice):
                return fused
            fused_reason = f"fused decode unavailable: {fused}"
        elif forced_fused:
            return DecodePathChoice("eager", f"the fused decode step does not take {quantization} weights")
    if forced_fused or quantization not in (AUTO_INT8_SOURCES if requested == "auto" else FORCED_INT8_SOURCES):
        # Under "auto", bf16 always tried the fused step, so only fp32 and the weights no path takes get here bare.
        exact = "exact path for fp32" if quantization == "fp32" else f"no faster CPU decode path for {quantization}"
        return DecodePathChoice("eager", fused_reason or exact)
    reason = int8.int8_kernel_available()
    if reason:
        return DecodePathChoice("eager", reason)
    started = time.perf_counter()
    cache_file = packed_cache_file(folder, quantization) if folder is not None else None
    stored = _read_cache(cache_file, notices)
    digest = stored[1] if stored is not None else ""
    try:
        skip = _output_embedding_ids(model)
        result = int8.patch_linears(model, skip, stored[0] if stored is not None else None)
    except Exception as exc:  # a model we can't repack still runs, on the plain path
        log.exception("int8 decode path failed")
        int8.unpatch_linears(model)
        return DecodePathChoice("eager", f"int8 repacking failed ({type(exc).__name__}: {exc})")
    if result.patched == 0:
        return DecodePathChoice("eager", "no linear layers the int8 decode path can run")
    if cache_file is not None and result.fresh and not result.reused:
        digest = _write_cache(cache_file, result.fresh, notices)
    elif result.fresh:
        digest = ""  # repacked over a stale copy without writing it: the copy's hash says nothing
    seconds = time.perf_counter() - started
    how = "packed" if result.fresh else "loaded from the cache" if result.reused else "already packed, ready"
    note = (
        f"weight-only int8 decode ({result.patched} layers, {how} in {seconds:.1f} s); "
        f"prefill in {quantization}, lm_head as loaded"
    )
    if fused_reason:
        note = f"{note}; {fused_reason}"
    return DecodePathChoice(
        "int8-decode", note, result.patched, result.added_bytes, seconds, weights_digest=_digest_key(digest)
    )


def _apply_fused(
    model: Any, quantization: str, folder: Path | None, weight_format: str, notices: list[str]
) -> DecodePathChoice | str:
    """The fused C decode step with copies of every decoder matrix (int8 rows or Q4_1 blocks) and the lm_head (int8),
    or why not."""
    library = _fused_library(model, weight_format)
    if isinstance(library, str):
        return library
    started = time.perf_counter()
    held: HeldOnce | None = getattr(model, HELD_ATTR, None)
    try:
        if held is not None and weight_format == "q4":  # the model's own layers hold these matrices: no copy
            tensors, digest, how = held.tensors, held.digest, f"held once ({held.how})"
        else:
            tensors, digest, how = _packed_copy(model, quantization, folder, weight_format, notices)
        decoder = native.FusedDecoder(library, model, tensors, weight_format)
        if held is not None and weight_format == "q4":
            decoder.added_bytes -= packed.held_tensor_bytes(model)
    except Exception as exc:  # an odd model still runs, on the plain path
        log.exception("fused decode path failed")
        return f"packing for the fused kernel failed ({type(exc).__name__}: {exc})"
    seconds = time.perf_counter() - started
    built = f", kernel compiled in {library.build_seconds:.1f} s" if library.build_seconds else ""
    described, runs = kernel.describe_step(library, weight_format, decoder.decode_team)
    note = (
        f"fused {described} decode step ({runs}; weights {how} in {seconds:.1f} s{built}); "
        f"prefill in {_prefill_description(model, quantization)}"
    )
    name = f"fused-{weight_format}"
    return DecodePathChoice(
        name, note, decoder.layers, decoder.added_bytes, seconds, decoder, weights_digest=_digest_key(digest)
    )


def _packed_copy(
    model: Any, quantization: str, folder: Path | None, weight_format: str, notices: list[str]
) -> tuple[dict[str, torch.Tensor], str, str]:
    """(tensors, sha256, how) of the fused step's copies: read from the cache where they fit, else packed now."""
    # q4 packs from the same values as a bf16 load does (its matrices, mapped in the file's dtype, rounded to bf16 one
    # at a time): one cache entry serves both.
    key = "bf16" if quantization == "q4" else quantization
    cache_file = packed_cache_file(folder, key, kind=f"decode-fused-{weight_format}") if folder is not None else None
    stored = _read_cache(cache_file, notices)
    if stored is not None and native.tensors_fit(model, stored[0], weight_format):
        return stored[0], stored[1], "loaded from the cache"
    dense_weight = _rounded_to(packed.compute_dtype(model)) if quantization == "q4" else int8.dense_weight
    # q4 drops the 16-bit matrices once packed: their mapped pages go back as each is done (int8 keeps them).
    release = release_file_pages if quantization == "q4" else None
    tensors = native.pack_model(model, dense_weight, weight_format, release)
    return tensors, _write_cache(cache_file, tensors, notices), "packed"


def _rounded_to(dtype: torch.dtype | None) -> Any:
    """int8.dense_weight, rounded to `dtype` (the values a load in that dtype would have held)."""

    def dense_weight(module: nn.Module) -> torch.Tensor | None:
        weight = int8.dense_weight(module)
        if weight is None or dtype is None or weight.dtype == dtype:
            return weight
        return weight.to(dtype)

    return dense_weight


HELD_ATTR = "_hearth_held_once"


@dataclass(frozen=True)
class HeldOnce:
    """The packed matrices a `q4` model's layers are views of, and where they came from."""

    tensors: dict[str, torch.Tensor]
    digest: str
    how: str


def _fused_library(model: Any, weight_format: str) -> Any:
    """The kernel library for the fused step on this model in `weight_format`, or why it can't run (an architecture
    it lacks, no kernel)."""
    return native.unsupported_reason(model, weight_format) or kernel.load_library()


def hold_weights_once(model: Any, folder: Path | None, notices: list[str]) -> str:
    """Make the model hold its decoder matrices once, as the fused step's Q4_1 copy (app.core.fastpath.packed): from
    the cache when there is one (the 16-bit weights are then never read), else packed from the mapped weights and
    cached. Empty on success, else why not (the model is then untouched)."""
    library = _fused_library(model, "q4")
    if isinstance(library, str):
        return library
    started = time.perf_counter()
    try:
        packed.keep_small(model, native.kv_dtype(model))
        tensors, digest, how = _packed_copy(model, "q4", folder, "q4", notices)
        packed.hold_once(model, tensors, library, folder)
    except Exception as exc:  # a half-swapped model can't be trusted: say so loudly
        log.exception("holding the weights once failed")
        raise RuntimeError(f"holding the weights as Q4_1 failed ({type(exc).__name__}: {exc})") from exc
    setattr(model, HELD_ATTR, HeldOnce(tensors, digest, f"{how} in {time.perf_counter() - started:.1f} s"))
    return ""


def _prefill_description(model: Any, quantization: str) -> str:
    if quantization == "q4":
        gemm = {torch.bfloat16: "bf16", torch.float32: "fp32"}[prefill.gemm_dtype()]
        rows = max((m.record_rows for m in model.modules() if isinstance(m, packed.Q4Linear)), default=0)
        if rows:
            return (
                f"Q4_1 weights held once: up to {rows} tokens a call multiplied straight from the records, longer "
                f"chunks dequantized per layer for {gemm} GEMMs"
            )
        return f"Q4_1 weights held once, dequantized per layer for {gemm} GEMMs"
    return f"{quantization} weights, fp32 GEMMs" if prefill.uses_upcast(model) else quantization


def _read_cache(cache_file: Path | None, notices: list[str]) -> tuple[dict[str, torch.Tensor], str] | None:
    """The packed copies and their sha256, read once and checked against the hash written with them; a damaged file
    is moved to NAME.damaged (with a line in `notices`) and None tells the caller to pack again."""
    if cache_file is None:
        return None
    checked = integrity.check_or_quarantine(cache_file, "packed decode copy", "packed again", notices)
    if checked is None:
        return None
    try:
        tensors = load_file(cache_file)  # memory-mapped: no second read of the bytes just hashed
        if integrity.identity(cache_file) != checked.identity:  # replaced meanwhile (another process packing)
            return None
        return tensors, checked.sha256
    except (OSError, ValueError, RuntimeError, SafetensorError) as exc:  # our hash, not our format: repack
        log.warning("ignoring the unreadable packed copy %s: %s", cache_file, exc)
        return None


SAFETENSORS_NAMES = {torch.uint8: "U8", torch.int8: "I8", **{dtype: name for name, dtype in FLOAT_DTYPES.items()}}


def safetensors_pieces(tensors: Mapping[str, torch.Tensor]) -> list[memoryview]:
    """A safetensors file of `tensors` as pieces to write in order (its header, then each tensor's own bytes, not
    copied): safetensors' `save` built the whole file in memory first (775 MiB at 1B, on top of the copies)."""
    names = sorted(tensors)
    flat = {name: tensors[name].detach().contiguous().reshape(-1).view(torch.uint8) for name in names}
    header: dict[str, Any] = {}
    offset = 0
    for name in names:
        size = flat[name].numel()
        dtype = SAFETENSORS_NAMES[tensors[name].dtype]
        header[name] = {"dtype": dtype, "shape": list(tensors[name].shape), "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    head = len(encoded).to_bytes(8, "little") + encoded
    return [memoryview(head)] + [memoryview(flat[name].numpy().data) for name in names]


def _write_cache(cache_file: Path | None, tensors: dict[str, torch.Tensor], notices: list[str]) -> str:
    """The copies' sha256 (of the file as written), writing them atomically with it first where there is a file (a
    full disk: a notice, nothing left behind; packed_cache.write_packed_copy)."""
    pieces = safetensors_pieces(tensors)
    if cache_file is None:
        return integrity.digest_pieces(pieces)
    return write_packed_copy(cache_file, pieces, notices)


def _digest_key(sha256: str) -> str:
    return f"sha256:{sha256}" if sha256 else ""


def _dense_digest(folder: Path) -> str:
    """Steps that run the loaded weights are identified by the loader's fingerprint of the weight files (a GGUF
    model's `folder` is its file)."""
    fingerprint = file_fingerprint(folder) if folder.is_file() else weights_fingerprint(folder)
    return f"dense:{fingerprint}" if fingerprint else ""


def _output_embedding_ids(model: Any) -> set[int]:
    """The lm_head stays as loaded: int8 is no faster for it (measured), and the logits keep full precision."""
    getter = getattr(model, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    return {id(head)} if isinstance(head, nn.Module) else set()
