"""The choice of the kernel's software prefetch (app/core/fastpath/prefetch.py), on made-up step times; that it never
changes a bit is tested on real models in tests/core/engines/lite/test_gguf_model.py."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from app.core.fastpath.prefetch import (
    MARGIN,
    MAX_PAIRS,
    MEASURED_BYTES,
    MIN_PAIRS,
    PREFETCH_ENV,
    SAVED_CHOICES,
    SAVED_FOR_S,
    PrefetchChoice,
    choice_key,
    pairs_for,
    save_choice,
    saved_choice,
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
    assert (
        choice.describe()
        == "software prefetch off (decode steps 1.12x faster without it here; on for forwards of 2 to 8 rows)"
    )
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
    assert choice.describe() == "software prefetch off (not measured under 256 MiB; on for forwards of 2 to 8 rows)"
    # the environment still fixes it
    choice = untimed_choice(kernel.set_prefetch, 1, environ={PREFETCH_ENV: "on"})
    assert choice is not None and choice.on and kernel.setting == 1


NOW = 1_796_600_000.0  # 2026-12-07 UTC


def test_a_measured_choice_is_saved_read_back_with_its_date_and_measured_again_after_a_week(tmp_path: Path) -> None:
    store = tmp_path / "cache" / "prefetch.json"  # the cache folder is made on the first save
    key = choice_key("x86_64|AMD EPYC|flags", "library-sha", "803409376:1", 2)
    assert saved_choice(store, key, NOW) is None  # nothing saved yet
    save_choice(store, key, PrefetchChoice(False, 0.0291, 0.0265), NOW)
    read = saved_choice(store, key, NOW + 60)
    assert read == PrefetchChoice(False, 0.0291, 0.0265, measured_at=NOW)
    assert read.describe() == (
        "software prefetch off (decode steps 1.10x faster without it here, measured 2026-12-06 23:33 UTC;"
        " on for forwards of 2 to 8 rows)"
    )
    assert saved_choice(store, key, NOW + SAVED_FOR_S + 1) is None  # too old: measured again
    assert saved_choice(store, key, NOW - 60) is None  # from the future (a clock set back): measured again
    for other in (  # another CPU, kernel library, model file or team size: measured for itself
        choice_key("x86_64|Intel Xeon|flags", "library-sha", "803409376:1", 2),
        choice_key("x86_64|AMD EPYC|flags", "another-library", "803409376:1", 2),
        choice_key("x86_64|AMD EPYC|flags", "library-sha", "803409376:2", 2),
        choice_key("x86_64|AMD EPYC|flags", "library-sha", "803409376:1", 1),
    ):
        assert saved_choice(store, other, NOW) is None
    save_choice(store, key, PrefetchChoice(True, unmeasured="HEARTH_PREFETCH"), NOW + 120)  # not measured: not saved
    assert saved_choice(store, key, NOW + 180) == read


def test_the_file_keeps_the_latest_choices_only(tmp_path: Path) -> None:
    store = tmp_path / "prefetch.json"
    for index in range(SAVED_CHOICES + 3):
        save_choice(store, f"key-{index}", PrefetchChoice(True, 0.02, 0.03), NOW + index)
    kept = json.loads(store.read_text())["choices"]
    assert list(kept) == [f"key-{index}" for index in range(3, SAVED_CHOICES + 3)]


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b'{"format": 1, "choi', "prefetch.json is not valid JSON"),
        (b"\xff\xfe", "prefetch.json is not UTF-8 text"),
        (b"[1, 2]", "prefetch.json is not a saved prefetch file of format 1"),
        (b'{"format": 2, "choices": {}}', "prefetch.json is not a saved prefetch file of format 1"),
    ],
)
def test_a_damaged_file_is_said_measured_again_and_replaced(
    content: bytes, said: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = tmp_path / "prefetch.json"
    store.write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="app.core.fastpath.prefetch"):
        assert saved_choice(store, "key", NOW) is None
    assert f"the saved prefetch choices are not used: {said}" in caplog.text
    save_choice(store, "key", PrefetchChoice(True, 0.02, 0.03), NOW)
    assert saved_choice(store, "key", NOW) == PrefetchChoice(True, 0.02, 0.03, measured_at=NOW)


@pytest.mark.parametrize(
    "entry",
    [
        {"on": "false", "on_s": 0.03, "off_s": 0.02, "measured_at": NOW},  # only an explicit false turns it off
        {"on": 0, "on_s": 0.03, "off_s": 0.02, "measured_at": NOW},
        {"on": False, "on_s": 0.03, "measured_at": NOW},
        {"on": False, "on_s": 0.03, "off_s": -1.0, "measured_at": NOW},
        {"on": False, "on_s": True, "off_s": 0.02, "measured_at": NOW},
        {"on": False, "on_s": 0.03, "off_s": 0.02, "measured_at": "today"},
        "off",
    ],
)
def test_a_hand_edited_entry_is_not_used(entry: object, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = tmp_path / "prefetch.json"
    store.write_text(json.dumps({"format": 1, "choices": {"key": entry}}))
    with caplog.at_level(logging.WARNING, logger="app.core.fastpath.prefetch"):
        assert saved_choice(store, "key", NOW) is None
    if isinstance(entry, dict):
        assert "the saved prefetch choice in" in caplog.text and "is damaged; measuring again" in caplog.text


def test_a_cache_that_cannot_be_written_only_means_measuring_again(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder would be")
    store = blocker / "prefetch.json"
    save_choice(store, "key", PrefetchChoice(True, 0.02, 0.03), NOW)  # no exception
    assert saved_choice(store, "key", NOW) is None
