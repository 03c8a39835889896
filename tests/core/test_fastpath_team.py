"""The team size chooser: it follows what each size measured, tries the others now and then, and a fixed team stays
fixed. Timings are fed in (no clock): behaviour, not speed."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np

from app.core.engines.lite.gguf_model import open_gguf_model
from app.core.fastpath import blocks
from app.core.fastpath.team import FIRST_TRY, TeamChooser
from tests.core.engines.lite.test_gguf_model import IDS, tiny_gguf


def run(chooser: TeamChooser, seconds_per_token: dict[int, float], calls: int) -> list[int]:
    used = []
    for _ in range(calls):
        size = chooser.size
        used.append(size)
        chooser.record(size, seconds_per_token[size], 1)
    return used


def test_a_busy_machine_moves_the_team_to_one_thread_and_back_when_it_is_quiet() -> None:
    chooser = TeamChooser(2, explore_every=10, explore_calls=2)
    busy = run(chooser, {2: 0.8, 1: 0.25}, 30)
    assert busy[:FIRST_TRY] == [2] * FIRST_TRY  # starts with every core
    assert busy[FIRST_TRY] == 1 and busy[-20:].count(1) >= 18  # tried one early, kept it (two tried now and then)
    quiet = run(chooser, {2: 0.02, 1: 0.04}, 30)
    assert quiet[-15:].count(2) >= 13  # one's time changed: two is tried at once, and found faster again


def test_a_size_that_keeps_measuring_slower_is_tried_less_and_less_until_the_load_changes() -> None:
    chooser = TeamChooser(2, explore_every=10, explore_calls=2)
    steady = run(chooser, {2: 0.02, 1: 0.05}, 400)
    tries = [index for index in range(1, len(steady)) if steady[index] == 1 and steady[index - 1] == 2]
    gaps = [b - a for a, b in itertools.pairwise(tries)]
    assert gaps[:3] == sorted(gaps[:3]) and gaps[0] < gaps[2]  # each clearly slower try waits longer for the next
    assert max(gaps) <= 8 * 10 + 2  # never longer than MAX_BACKOFF intervals
    busy = run(chooser, {2: 0.2, 1: 0.05}, 10)
    assert busy[-5:] == [1] * 5  # two's time rose 10x: one is tried at once and kept


def test_a_try_far_slower_than_the_best_ends_after_its_first_call() -> None:
    chooser = TeamChooser(2, explore_every=10, explore_calls=3)
    used = run(chooser, {2: 0.7, 1: 0.1}, 60)  # two threads 7x slower: a busy machine
    assert used[:4] == [2, 1, 1, 1]  # one thread tried after the first call, for a whole try (it was faster)
    tries_of_two = [index for index in range(4, len(used)) if used[index] == 2]
    assert tries_of_two and all(used[index + 1] == 1 for index in tries_of_two)  # each try of two: one call
    slightly = TeamChooser(2, explore_every=10, explore_calls=3)
    used = run(slightly, {2: 0.15, 1: 0.1}, 30)  # 1.5x slower: worth the whole try
    assert used[14:17] == [2, 2, 2]


def run_measured(chooser: TeamChooser, seconds_per_token: dict[int, float], cores_had: float, calls: int) -> list[int]:
    """As run, each call with the process's CPU time: `cores_had` of the team's threads on a core the whole call."""
    used = []
    for _ in range(calls):
        size = chooser.size
        used.append(size)
        seconds = seconds_per_token[size]
        chooser.record(size, seconds, 1, cpu_seconds=seconds * min(size, cores_had))
    return used


def test_a_team_that_had_its_cores_is_never_tried_smaller_and_one_short_of_them_is() -> None:
    chooser = TeamChooser(2, explore_every=10, explore_calls=2)
    quiet = run_measured(chooser, {2: 0.02, 1: 0.04}, cores_had=2, calls=300)
    assert quiet == [2] * 300  # no try of one thread: it could only be slower
    busy = run_measured(chooser, {2: 0.2, 1: 0.05}, cores_had=1.1, calls=10)  # another program took a core
    assert busy[1] == 1 and busy[-5:] == [1] * 5  # the time moved and the CPU time says why: one tried and kept
    later = run_measured(chooser, {2: 0.02, 1: 0.05}, cores_had=2, calls=100)
    assert later[-20:] == [2] * 20  # two tried again on one's schedule, found faster, and kept untried since


def test_a_slow_first_step_alone_does_not_start_a_try() -> None:
    """A first decode step while the other thread wakes used 1.5 cores of 2: too little time measured to tell, so
    the chooser waits for more calls; those say the team has its cores."""
    chooser = TeamChooser(2, explore_every=10, explore_calls=2)
    first = run_measured(chooser, {2: 0.02, 1: 0.04}, cores_had=1.5, calls=1)
    later = run_measured(chooser, {2: 0.02, 1: 0.04}, cores_had=2, calls=100)
    assert first + later == [2] * 101


def test_one_core_short_of_sixteen_is_short_of_cores() -> None:
    """Counted in cores: a busy program that halves one thread of sixteen shows (a share of 97 % would not)."""
    chooser = TeamChooser(16, explore_every=10, explore_calls=2)
    quiet = run_measured(chooser, {16: 0.01, 8: 0.015, 4: 0.03, 2: 0.06, 1: 0.12}, cores_had=16, calls=100)
    assert quiet == [16] * 100
    busy = run_measured(chooser, {16: 0.05, 8: 0.016, 4: 0.03, 2: 0.06, 1: 0.12}, cores_had=15.5, calls=12)
    # a thread descheduled at every barrier: smaller teams are tried at once, and one of them kept
    assert min(busy[:4]) < 16 and max(busy[-3:]) < 16


def test_the_timed_calls_give_the_chooser_the_process_s_cpu_time() -> None:
    wall, cpu = [0.0], [0.0]
    chooser = TeamChooser(2, explore_every=10, clock=lambda: wall[0], cpu_clock=lambda: cpu[0])
    for _ in range(50):
        with chooser.timed(1) as threads:
            assert threads == 2
            wall[0] += 0.01
            cpu[0] += 0.019  # 1.9 cores' time: the team had both
    starved = []
    for _ in range(FIRST_TRY + 12):
        with chooser.timed(1) as threads:
            starved.append(threads)
            wall[0] += 0.03 if threads == 2 else 0.012
            cpu[0] += 0.03 if threads == 2 else 0.012  # one core's time for two threads: another program has one
    assert 1 in starved


def test_sizes_tried_are_halvings_down_to_one() -> None:
    assert TeamChooser(8).candidates() == [8, 4, 2, 1]
    assert TeamChooser(1).candidates() == [1]
    single = TeamChooser(1)
    assert run(single, {1: 0.1}, 100) == [1] * 100


def test_a_fixed_team_is_never_changed() -> None:
    chooser = TeamChooser(2, explore_every=0)
    assert run(chooser, {2: 1.0, 1: 0.001}, 100) == [2] * 100


def test_a_reply_does_not_depend_on_the_team_size(tmp_path: Path) -> None:
    """The chooser may switch team sizes between any two calls: every size gives the same bits."""
    path = tiny_gguf(tmp_path / "tiny.gguf", blocks.Q4_K, v_down=blocks.Q6_K)
    results = []
    for threads in (1, 2):
        model = open_gguf_model(path, threads=threads)
        try:
            cache = model.new_cache()
            model.prefill(IDS[:-2], cache)
            model.step(IDS[-2], cache)
            results.append(model.step(IDS[-1], cache))
        finally:
            model.close()
    assert np.array_equal(results[0], results[1])


def test_fix_threads_holds_every_call_to_that_team(tmp_path: Path) -> None:
    """What bench/peer.py uses to give Hearth llama.cpp's thread count: capped at the team the model started with."""
    path = tiny_gguf(tmp_path / "tiny.gguf", blocks.Q4_K, v_down=blocks.Q6_K)
    model = open_gguf_model(path, threads=2)
    try:
        model.fix_threads(8)
        assert model.decode_team.largest == 2 and model.prefill_team.largest == 2
        model.fix_threads(1)
        cache = model.new_cache()
        model.prefill(IDS[:-1], cache)
        model.step(IDS[-1], cache)
        assert set(model.decode_team.average) == {1} and set(model.prefill_team.average) == {1}
    finally:
        model.close()


def test_a_reply_s_note_says_whether_the_team_follows_the_free_cores() -> None:
    assert TeamChooser(2).description() == "up to 2 threads, as many as the cores free measure fastest"
    assert TeamChooser(2, explore_every=0).description() == "2 threads"
    assert TeamChooser(1).description() == "1 thread"  # nothing to choose between


def quiet_calls_on_a_coarse_clock(step: float, tick: float, calls: int) -> list[int]:
    """Team sizes of `calls` decode steps of `step` seconds on two threads (one thread 1.8x slower: a quiet machine),
    with the process's CPU time read as Windows counts it: each thread's time in whole ticks."""
    wall, threads_cpu = [0.0], [0.0, 0.0]
    chooser = TeamChooser(
        2, clock=lambda: wall[0], cpu_clock=lambda: sum(math.floor(t / tick) * tick for t in threads_cpu)
    )
    used = []
    for _ in range(calls):
        with chooser.timed(1) as threads:
            used.append(threads)
            seconds = step if threads == 2 else 1.8 * step
            wall[0] += seconds
            for k in range(threads):
                threads_cpu[k] += seconds
    return used


def test_a_process_clock_in_coarse_ticks_seldom_moves_a_quiet_team() -> None:
    """Windows counts a thread's CPU time in 15.6 ms ticks: a 3 ms decode step reads 0 or a whole tick. The moving
    average over such calls still says the team had its cores often enough that one thread runs few calls."""
    for step in (0.003, 0.02):
        used = quiet_calls_on_a_coarse_clock(step, 0.015625, 2000)
        assert used.count(1) <= 10, (step, used.count(1))  # a try or three (blind to CPU time it would be 21 calls)
