"""What transformers' own warpers leave a chance: the reference both engines' samplers are checked against."""

from __future__ import annotations

import numpy as np
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from app.core.chat.sampling import SamplingParams


def warped_probabilities(params: SamplingParams, logits: np.ndarray, seen: list[int]) -> np.ndarray:
    """The distribution transformers' warpers draw from, built here from the parameters (repetition penalty,
    temperature, top-k, top-p, min-p, in the torch engine's order)."""
    processors = LogitsProcessorList()
    if params.repetition_penalty != 1.0:
        processors.append(RepetitionPenaltyLogitsProcessor(params.repetition_penalty))
    processors.append(TemperatureLogitsWarper(params.temperature))
    if params.top_k:
        processors.append(TopKLogitsWarper(params.top_k))
    if params.top_p < 1:
        processors.append(TopPLogitsWarper(params.top_p))
    if params.min_p:
        processors.append(MinPLogitsWarper(params.min_p))
    warped = processors(torch.tensor([seen]), torch.from_numpy(logits.copy())[None])
    return torch.softmax(warped[0].double(), dim=-1).numpy()


def kept_tokens(params: SamplingParams, logits: np.ndarray, seen: list[int]) -> set[int]:
    """The token ids the warpers leave a chance."""
    return set(np.flatnonzero(warped_probabilities(params, logits, seen) > 0).tolist())


def distance_from_warped(drawn: list[int], params: SamplingParams, logits: np.ndarray, seen: list[int]) -> float:
    """Total variation distance between the draws' frequencies and the warpers' distribution (0: the same; a
    seeded sampler that drops the temperature or a cut-off lands far above the ~0.015 that 2,000 draws leave)."""
    expected = warped_probabilities(params, logits, seen)
    observed = np.bincount(np.asarray(drawn), minlength=expected.size) / len(drawn)
    return float(np.abs(observed - expected).sum() / 2)


# Parameter sets where the warpers keep a few dozen of 500 tokens: a sampler that skips one keeps more.
WARPED_PARAMS = [
    SamplingParams(temperature=0.7, top_p=0.9, top_k=40),
    SamplingParams(temperature=1.3, top_p=0.5, top_k=0, min_p=0.05),
    SamplingParams(temperature=0.8, top_p=1.0, top_k=5, repetition_penalty=1.3),
]
