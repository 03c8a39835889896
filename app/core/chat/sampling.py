"""Sampling parameters, validated once so every front end reports bad values the same way."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Annotated, Any

from pydantic import Field

from app.core.storage.schema import Rule, check_fields

MAX_TOP_K = 2**31 - 1  # above any vocabulary; a larger top-k is the same as this one
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # a signed or an unsigned 64-bit seed


@dataclass(frozen=True)
class SamplingParams:
    temperature: Annotated[float, Field(ge=0), Rule("temperature", "0 or more")] = 0.7  # 0 = greedy
    top_p: Annotated[float, Field(gt=0, le=1), Rule("top-p", "in (0, 1]")] = 0.95
    top_k: Annotated[int, Field(ge=0, le=MAX_TOP_K), Rule("top-k", f"0 (off) to {MAX_TOP_K}")] = 40  # 0 = off
    min_p: Annotated[float, Field(ge=0, lt=1), Rule("min-p", "in [0, 1)")] = 0.0  # 0 = off
    repetition_penalty: Annotated[float, Field(gt=0), Rule("repetition penalty", "above 0")] = 1.0  # 1 = off
    max_new_tokens: Annotated[int, Field(ge=1), Rule("max new tokens", "at least 1")] = 512
    seed: Annotated[
        int | None, Field(ge=SEED_MIN, le=SEED_MAX), Rule("seed", "a whole number from -2^63 to 2^64-1, or null")
    ] = None

    def __post_init__(self) -> None:
        check_fields(self)  # types (strict: no "0.7" strings, no inf/nan) and ranges, named in the error

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def generator_seed(self) -> int:
        """The seed as both samplers' generators take it (0 to 2^64-1: a negative seed wraps, as a C uint64 would);
        without a seed, one from the clock."""
        return (self.seed if self.seed is not None else time.time_ns()) % 2**64

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SamplingParams:
        """Strict: the first bad value raises InvalidSettingError naming it; unknown keys are ignored."""
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})
