"""The memory verdict of a model on disk, from the plan of the runtime its load would take.

A GGUF file (the built-in model is one) loads on the torch-free runtime where it can: its verdict comes from that
runtime's own plan, the figures `hearth plan` prints and the window shows before loading, and plans without
importing torch (~2 s and ~300 MB in the window's process). A Hugging Face folder, or a GGUF file that runtime
declines, is planned by the memory planner as before (app.core.memory.verdict).
"""

from __future__ import annotations

from typing import cast

from app.core.engines.backend import LoadRequest
from app.core.engines.opening import plan_load
from app.core.memory.verdict import VERDICT_CONTEXT, Verdict, model_verdict, planned_verdict
from app.core.models.library import LibraryModel
from app.core.models.quant import Quantization


def library_verdict(
    model: LibraryModel, *, quantization: str = "auto", device: str = "auto", free_bytes: int | None = None
) -> Verdict:
    """`model`'s verdict at VERDICT_CONTEXT tokens (or its maximum where that is smaller)."""
    if not (model.path.is_file() and model.path.suffix.lower() == ".gguf"):
        return model_verdict(model.config, quantization=quantization, device=device, free_bytes=free_bytes)
    request = LoadRequest(
        model.spec, quantization=cast(Quantization, quantization), device=device, context_length=VERDICT_CONTEXT
    )
    return planned_verdict(lambda: plan_load(request, free_bytes), model.path)
