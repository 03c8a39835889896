"""The memory planner's verdict on a model in the library: fits, fits with offload, too large, or unknown (and why).

Imports the planner (and so torch) only when a verdict is asked for: call it off the GUI thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from app.core.errors import HearthError
from app.core.memory.types import MemoryPlan, format_bytes
from app.core.models.library import describe_config, read_config

log = logging.getLogger(__name__)

Fit = Literal["yes", "offload", "no", "unknown"]
FIT_LABELS: dict[str, str] = {"yes": "fits", "offload": "fits with offload", "no": "too large", "unknown": "unknown"}
# Verdicts are for a usable chat context, not the model's maximum (128k tokens of KV cache would make every
# modern model "too large"); the verdict also says the largest context that fits.
VERDICT_CONTEXT = 8192


@dataclass(frozen=True)
class Verdict:
    fits: Fit
    total_bytes: int | None = None
    parameters: int | None = None
    max_context: int | None = None
    note: str = ""

    @classmethod
    def of_plan(cls, plan: MemoryPlan) -> Verdict:
        """What a memory plan says of the model (its notes joined into one)."""
        return cls(plan.fits, plan.total_bytes, plan.parameters, plan.max_context, "; ".join(plan.notes))

    @property
    def label(self) -> str:
        return FIT_LABELS[self.fits]

    @property
    def summary(self) -> str:
        """The label with the memory it needs where known, in the plan's units: "fits (367.1 MiB)"."""
        if self.fits == "unknown" or not self.total_bytes:
            return self.label
        return f"{self.label} ({format_bytes(self.total_bytes)})"


def model_verdict(
    source: Path | dict[str, Any] | None,
    *,
    quantization: str = "auto",
    device: str = "auto",
    context: int | None = None,
    free_bytes: int | None = None,
) -> Verdict:
    """The memory planner's verdict for a config (folder with config.json, or the dict), or `unknown` with why.

    `context` None: VERDICT_CONTEXT tokens, or the model's maximum if that is smaller. Imports torch (the planner
    does): call it off the GUI thread.
    """
    if source is None:
        return Verdict("unknown", note="no config.json to plan from")
    if context is None:
        config = read_config(source) if isinstance(source, Path) else source
        _, model_max = describe_config(config)
        context = min(VERDICT_CONTEXT, model_max) if model_max else VERDICT_CONTEXT
    try:
        from app.core.memory.planner import plan_memory  # torch: only when a verdict is asked for
    except ImportError:
        return Verdict("unknown", note="the memory planner is not available")
    return planned_verdict(
        lambda: plan_memory(source, quantization=quantization, context=context, device=device, free_bytes=free_bytes),
        source if isinstance(source, Path) else "config",
    )


def planned_verdict(plan: Callable[[], MemoryPlan], what: object) -> Verdict:
    """The verdict of the plan `plan` makes of `what`, or `unknown` with why: the user's error as it says, any other
    failure as the planner's, logged (a config or file the planner does not understand must not break a list)."""
    try:
        return Verdict.of_plan(plan())
    except HearthError as exc:
        return Verdict("unknown", note=str(exc))
    except Exception as exc:
        log.warning("memory planner failed on %s: %s", what, exc)
        return Verdict("unknown", note=f"the planner could not read this model ({type(exc).__name__})")
