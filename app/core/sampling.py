"""Sampling parameters, validated once so every front end reports bad values the same way."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from app.core.errors import InvalidSettingError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.7  # 0 = greedy
    top_p: float = 0.95
    top_k: int = 40  # 0 = off
    min_p: float = 0.0  # 0 = off
    repetition_penalty: float = 1.0  # 1 = off
    max_new_tokens: int = 512
    seed: int | None = None

    def __post_init__(self) -> None:
        checks: list[tuple[bool, str]] = [
            (self.temperature >= 0, f"temperature must be 0 or more (got {self.temperature})"),
            (0 < self.top_p <= 1, f"top-p must be in (0, 1] (got {self.top_p})"),
            (self.top_k >= 0, f"top-k must be 0 (off) or more (got {self.top_k})"),
            (0 <= self.min_p < 1, f"min-p must be in [0, 1) (got {self.min_p})"),
            (self.repetition_penalty > 0, f"repetition penalty must be above 0 (got {self.repetition_penalty})"),
            (self.max_new_tokens >= 1, f"max new tokens must be at least 1 (got {self.max_new_tokens})"),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidSettingError(message)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SamplingParams:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)
