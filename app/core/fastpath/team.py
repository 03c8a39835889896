"""How many threads a forward call runs on, chosen from what each team size measured: a team that follows the cores
actually free. Torch-free.

Why: the kernel's team meets at several barriers per layer. On a quiet machine two threads on two cores decode about
twice as fast as one; beside a browser or a build, one thread of the team is often descheduled and the other waits at
every barrier for it: measured on the 2-core CI machine with other jobs running (load average 12), a 1B decode step on
two threads ran at a third of one thread's speed, and llama.cpp's likewise. A desktop app shares its CPU, so the team
size is measured, not assumed.

The policy: time every call per token, keep a moving average per team size, use the fastest, and now and then (after
the first few calls, then every `explore_every`) try another size for a few calls so a change in load is noticed. A
size that measured clearly slower is tried half as often each time (down to one try in MAX_BACKOFF intervals: on a
quiet machine the tries of one thread cost 7 % of a 4-reply batch's rate), a try whose first call is twice as slow
as the best ends there (beside one busy process a two-thread decode step took 7x one thread's time: three such calls
cost more than the forty-odd fast ones between tries), and any clear change in the chosen size's own time per token
(a load that came or went) brings the next try forward.
A try only starts when the largest team's recent calls show it short of cores: the process's CPU time over them (a
moving average) more than SHORT_OF_CORES cores' worth below team size x wall time (counted in cores, not as a share:
on a 16-core machine one busy program that takes half of one thread's core shows as clearly as on 2). A team that had
its cores cannot run faster on fewer, and on a quiet machine a try of one thread is pure loss: the first long prompt
of a process ran chunks 2 and 3 of 6 on one thread (1B Q6_K, 1,519 tokens: 12.3 s against 9.4 on two threads
throughout; 2-core Zen 4, 2026-12-07). Measured there: a two-thread prefill call used 1.96 cores' time per second
of wall time and decode steps 1.78-2.11 (median 1.99); beside one busy process 1.15 and 0.93-1.22. A team already
smaller than the largest still tries larger sizes on the schedule (its own time cannot say whether cores came free).
Windows counts a thread's CPU time in 15.6 ms ticks, so a 3 ms step reads 0 or a whole tick; the moving average
over such calls still tells (simulated in the tests: a try or three in 2,000 quiet steps, 21 calls blind to CPU time).
Decode steps and prefill chunks each have their own chooser (their times per token differ a hundredfold). The
kernel's results do not depend on the team size (row-invariant products, attention in fixed chunks), so switching
never changes a reply.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

SMOOTHING = 0.3  # weight of the newest measurement in a team size's average
EXPLORE_EVERY = 48  # calls between tries of another team size
EXPLORE_CALLS = 3  # calls per try
FIRST_TRY = 1  # the first try comes at once: a machine may be busy from the start
SLOWER = 1.25  # a tried size this much slower per token than the best is tried less often
ABANDON = 2.0  # a try whose first call is this much slower than the best ends after that call
MAX_BACKOFF = 8  # explore_every intervals at most between tries
LOAD_CHANGE = 1.3  # the best size's time per token moved this far (either way) since the last try: try again now
SHORT_OF_CORES = 0.4  # cores' worth of CPU time the team may miss over its calls and still count as having its cores
# Calls, or wall seconds, of the largest team before their CPU time decides a try: a 1B decode step (20 ms) right
# after a prefill used 1.52 cores of 2 while the other thread woke, the steps after it 1.78-2.11; a prefill chunk
# (over a second) says enough alone
MEASURED_ENOUGH_CALLS, MEASURED_ENOUGH_S = 3, 0.1


@dataclass
class TeamChooser:
    """The team size for the next call (`size`), learned from `record`ed seconds per token of each size."""

    largest: int
    explore_every: int = EXPLORE_EVERY  # 0: never try another size (a team size asked for outright)
    explore_calls: int = EXPLORE_CALLS
    clock: Callable[[], float] = time.perf_counter
    cpu_clock: Callable[[], float] = time.process_time  # this process's CPU time, every thread's
    average: dict[int, float] = field(default_factory=dict)  # team size -> seconds per token
    _calls: int = 0
    _trying: int = 0  # the size under trial, 0 when none
    _tried: int = 0  # calls of the current trial so far
    _next: int = FIRST_TRY  # the call count at which the next try starts
    _interval: int = 0  # calls between tries now (explore_every, doubled while the tries measure clearly slower)
    _baseline: float | None = None  # the best size's time per token when the last try ended
    _cpu: float = 0.0  # moving average of the largest team's calls' CPU seconds ...
    _wall: float = 0.0  # ... and of their wall seconds
    _unmeasured: bool = False  # the last such call came without its CPU time
    _measured_s: float = 0.0  # wall seconds of the largest team's calls that came with their CPU time, in all ...
    _measured_calls: int = 0  # ... and how many

    def __post_init__(self) -> None:
        self.largest = max(1, self.largest)
        self._interval = self.explore_every
        sizes, size = [], self.largest
        while size > 1:
            sizes.append(size)
            size //= 2
        self._candidates = (*sizes, 1)  # asked for on every call: worked out once

    def candidates(self) -> list[int]:
        """Team sizes worth trying: the largest, halvings of it, and one."""
        return list(self._candidates)

    def description(self) -> str:
        """A reply's note on the team: "up to 2 threads, as many as the cores free measure fastest", or "2 threads"."""
        if self.explore_every > 0 and self.largest > 1:
            return f"up to {self.largest} threads, as many as the cores free measure fastest"
        return f"{self.largest} thread{'s' if self.largest > 1 else ''}"

    @property
    def best(self) -> int:
        best, fastest = self.largest, None
        for size in self._candidates:
            value = self.average.get(size)
            if value is not None and (fastest is None or value < fastest):
                best, fastest = size, value
        return best

    @property
    def size(self) -> int:
        return self._trying or self.best

    def record(self, size: int, seconds: float, tokens: int, cpu_seconds: float | None = None) -> None:
        """One call's wall time on `size` threads for `tokens` tokens (and the process's CPU time over it, None where
        unknown); starts or ends a trial of another size."""
        per_token = seconds / max(1, tokens)
        if size == self.largest:
            self._unmeasured = cpu_seconds is None
            if cpu_seconds is not None:
                self._cpu = (1 - SMOOTHING) * self._cpu + SMOOTHING * cpu_seconds
                self._wall = (1 - SMOOTHING) * self._wall + SMOOTHING * seconds
                self._measured_s += seconds
                self._measured_calls += 1
        previous = self.average.get(size)
        if previous is None or (self._trying == size and self._tried == 0):  # a try's first call: old news gone
            self.average[size] = per_token
        else:
            self.average[size] = (1 - SMOOTHING) * previous + SMOOTHING * per_token
        self._calls += 1
        if self._trying:
            self._tried += 1
            hopeless = size != self.best and self.average[size] > ABANDON * self.average[self.best]
            if self._tried >= self.explore_calls or hopeless:
                tried, self._trying = self._trying, 0
                best = self.best
                if tried != best and self.average[tried] > SLOWER * self.average[best]:
                    self._interval = min(2 * self._interval, MAX_BACKOFF * self.explore_every)
                else:
                    self._interval = self.explore_every
                self._baseline = self.average[best]
                self._next = self._calls + self._interval
            return
        if self.largest <= 1 or self.explore_every <= 0:
            return
        now = self.average.get(self.best)
        if self._baseline and now and not 1 / LOAD_CHANGE < now / self._baseline < LOAD_CHANGE:
            self._next, self._interval, self._baseline = self._calls, self.explore_every, None  # conditions changed
        if self._calls >= self._next and self.best == self.largest:
            had = self._had_cores()
            if had is None:  # too little measured yet to tell: ask again after the next call
                self._next = self._calls + 1
            elif had:  # nothing to try until the next check, or until the team's time per token moves
                self._next, self._baseline = self._calls + self._interval, self.average[self.best]
        if self._calls >= self._next:
            others = [candidate for candidate in self.candidates() if candidate != self.best]
            untried = [candidate for candidate in others if candidate not in self.average]
            # the least recently sure: an untried size first, else the next one in turn
            self._trying = (untried or others)[(self._calls // self.explore_every) % len(untried or others)]
            self._tried = 0

    def _had_cores(self) -> bool | None:
        """Whether the largest team's recent calls ran with every thread on a core of its own (their CPU time), and
        so no smaller team is worth a try; None while too little of their time was measured to tell."""
        if self._unmeasured or self._wall <= 0:
            return False
        if self._measured_s < MEASURED_ENOUGH_S and self._measured_calls < MEASURED_ENOUGH_CALLS:
            return None
        return self._cpu >= (self.largest - SHORT_OF_CORES) * self._wall

    @contextmanager
    def timed(self, tokens: int) -> Iterator[int]:
        """`with chooser.timed(tokens) as threads:` run the call on `threads`; its time is recorded."""
        size, started, cpu_started = self.size, self.clock(), self.cpu_clock()
        yield size
        self.record(size, self.clock() - started, tokens, self.cpu_clock() - cpu_started)
