"""What a load does with a memory plan that does not fit: a shorter context window where enough of one fits, else the
one refusal, with its numbers (the planner's plans and the torch-free runtime's). Torch-free."""

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


# Without --context, a model whose full context does not fit gets a shorter window if at least this much fits.
MIN_AUTO_CONTEXT = 2048


def window_that_fits(plan: MemoryPlan, context_asked: bool, notices: list[str]) -> int | None:
    """None when the plan fits; the shorter context window that does (with a line in `notices`) when none was asked
    for and at least MIN_AUTO_CONTEXT tokens (or the whole window) fit; else ModelTooLargeError (check_fit)."""
    if plan.fits != "yes" and not context_asked and plan.max_context >= min(MIN_AUTO_CONTEXT, plan.context):
        notices.append(
            f"The context window is limited to {plan.max_context:,} tokens (the model allows {plan.context:,}) so "
            f"that its KV cache fits in the {format_bytes(plan.free_bytes)} free on {plan.device}."
        )
        return plan.max_context
    check_fit(plan)
    return None
