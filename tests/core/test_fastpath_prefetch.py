"""The choice of the kernel's software prefetch (app/core/fastpath/prefetch.py), on made-up step times; that it never
changes a bit is tested on real models in tests/core/engines/lite/test_gguf_model.py."""

from __future__ import annotations

import pytest

from app.core.fastpath.prefetch import (
    MARGIN,
    MAX_PAIRS,
    MEASURED_BYTES,
    MIN_PAIRS,
    PREFETCH_ENV,
    PrefetchChoice,
    pairs_for,
    timed_choice,
    untimed_choice,
)


class FakeKernel:
    """A kernel whose step takes `on_s` or `off_s` (by its prefetch setting) on a clock that only steps advance."""

    def __init__(self, on_s: float, off_s: float) -> None:
        self.on_s, self.off_s = on_s, off_s
        self.setting = 1
        self.now = 0.0
        self.steps: list[int] = []  # the setting of each step run

    def set_prefetch(self, want: int) -> int:
        if want >= 0:
            self.setting = want
        return self.setting

    def step(self) -> None:
        self.steps.append(self.setting)
        self.now += self.on_s if self.setting else self.off_s

    def clock(self) -> float:
        return self.now


def choose(kernel: FakeKernel, environ: dict[str, str] | None = None) -> PrefetchChoice:
    """What a load of a model of MEASURED_BYTES does: the untimed setting where there is one, else the timed one."""
    untimed = untimed_choice(kernel.set_prefetch, MEASURED_BYTES, environ or {})
    return untimed if untimed is not None else timed_choice(kernel.set_prefetch, kernel.step, kernel.clock)


def test_off_is_kept_where_its_steps_measure_faster_and_the_note_says_by_how_much() -> None:
    kernel = FakeKernel(on_s=0.036, off_s=0.032)
    choice = choose(kernel)
    assert not choice.on and kernel.setting == 0
    assert choice.describe() == "software prefetch off (decode steps 1.12x faster without it here)"
    # a warm-up step, then each setting as many times as fit the budget, alternating which goes first
    pairs = pairs_for(0.036)
    assert pairs == 4
    assert kernel.steps == [1] + [setting for pair in range(pairs) for setting in ((1, 0) if pair % 2 == 0 else (0, 1))]


def test_small_models_time_more_pairs_and_large_ones_at_least_a_few() -> None:
    assert pairs_for(0.004) == MAX_PAIRS  # a model stepping in 4 ms: 15 pairs in ~0.1 s
    assert pairs_for(0.030) == 5  # a 1B
    assert pairs_for(0.250) == MIN_PAIRS  # an 8B: 3 pairs, however long


def test_on_stays_where_it_measures_faster_or_within_the_margin() -> None:
    slower_off = FakeKernel(on_s=0.030, off_s=0.033)
    assert choose(slower_off).on and slower_off.setting == 1
    assert choose(slower_off).describe() == "software prefetch on (decode steps 1.10x as long without it here)"
    near_tie = FakeKernel(on_s=0.030, off_s=0.030 * (1 - MARGIN / 2))
    assert choose(near_tie).on and near_tie.setting == 1


def test_the_environment_fixes_it_without_timing_a_step() -> None:
    kernel = FakeKernel(on_s=0.030, off_s=0.020)
    choice = choose(kernel, {PREFETCH_ENV: "on"})
    assert choice.on and kernel.setting == 1 and kernel.steps == []
    assert choice.describe() == "software prefetch on (HEARTH_PREFETCH)"
    choice = choose(kernel, {PREFETCH_ENV: " OFF "})
    assert not choice.on and kernel.setting == 0 and kernel.steps == []


def test_a_setting_that_is_neither_on_nor_off_is_named() -> None:
    with pytest.raises(ValueError, match=r"HEARTH_PREFETCH='sometimes' is not one of on, off"):
        choose(FakeKernel(0.03, 0.03), {PREFETCH_ENV: "sometimes"})


def test_a_small_model_leaves_the_setting_as_it_is_and_says_so() -> None:
    kernel = FakeKernel(on_s=0.004, off_s=0.002)
    kernel.setting = 0  # as a larger model loaded earlier in the process left it
    choice = untimed_choice(kernel.set_prefetch, MEASURED_BYTES - 1, environ={})
    assert choice is not None and not choice.on and kernel.setting == 0 and kernel.steps == []
    assert choice.describe() == "software prefetch off (not measured under 256 MiB)"
    # the environment still fixes it
    choice = untimed_choice(kernel.set_prefetch, 1, environ={PREFETCH_ENV: "on"})
    assert choice is not None and choice.on and kernel.setting == 1
