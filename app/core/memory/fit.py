"""The one refusal of a model that will not fit, with its numbers (the planner's and the torch-free runtime's
plans). Torch-free."""

from __future__ import annotations

from app.core.errors import ModelTooLargeError
from app.core.memory.types import MemoryPlan, format_bytes


def check_fit(plan: MemoryPlan) -> None:
    """Raise ModelTooLargeError, with the numbers, unless the plan fits on its device."""
    if plan.fits == "yes":
        return
    where = "the CPU (available RAM)" if plan.device == "cpu" else plan.device
    message = (
        f"{plan.model} ({plan.quantization}) needs {format_bytes(plan.total_bytes)} at {plan.context:,} tokens of "
        f"context but only {format_bytes(plan.free_bytes)} is free on {where}."
    )
    if plan.fits == "offload":
        message += " It would fit only by offloading layers to the CPU, which Hearth does not do."
    if 0 < plan.max_context < plan.context:
        message += f" Up to {plan.max_context:,} tokens of context would fit (--context {plan.max_context})."
    else:
        message += " Try a smaller quantization (--quant nf4)." if plan.quantization != "nf4" else ""
    message += " To load it anyway, use --ignore-fit."
    raise ModelTooLargeError(message, needed_bytes=plan.total_bytes, free_bytes=plan.free_bytes)
