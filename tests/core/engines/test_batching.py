"""How a batched step shares out prompt tokens (app.core.engines.batching.prompt_takes)."""

from __future__ import annotations

from app.core.engines.batching import PROMPT_TOKENS_BESIDE_DECODE, DecodeStep, PrefillStep, prompt_takes


def test_prompts_beside_decode_tokens_share_a_small_budget_in_arrival_order() -> None:
    budget = PROMPT_TOKENS_BESIDE_DECODE
    steps = [DecodeStep(5, "a"), PrefillStep(list(range(budget // 2)), "b"), PrefillStep(list(range(9 * budget)), "c")]
    assert prompt_takes(steps, alone=256) == [0, budget // 2, budget - budget // 2]
    late = [DecodeStep(5, "a"), PrefillStep(list(range(9 * budget)), "b"), PrefillStep(list(range(9)), "c")]
    assert prompt_takes(late, alone=256) == [0, budget, 0]  # c waits for the next step


def test_prompts_alone_take_the_engines_prefill_chunk() -> None:
    steps = [PrefillStep(list(range(300)), "b"), PrefillStep(list(range(9)), "c")]
    assert prompt_takes(steps, alone=256) == [256, 0]
    assert prompt_takes([PrefillStep(list(range(100)), "b"), PrefillStep(list(range(9)), "c")], alone=256) == [100, 9]
