"""The kernel's software prefetch in its 16-row products, on or off: whichever this machine's decode steps measure
faster. Torch-free.

Why: the 16-row products stream each matrix from memory and prefetch a few blocks ahead into L1. That was tuned on the
Intel and Zen 3 CI machines; on a 2-core Zen 4 guest the same decode ran faster without it (1B Llama shape, Q4_K_M:
0.99-1.13x in runs an hour apart; Q6_K: 1.03-1.13x; 135M Q4_K_M: 1.15x; the built-in Q4_1: no difference; but 1B
Q5_K_M's steps took 1.22x as long without it): each prefetch holds one of the core's few L1 miss buffers until its line
arrives, while the hardware's own stream prefetch into L2 keeps more lines in flight. Which way a CPU goes is not known
from its flags, so it is measured.

How: when a model with at least MEASURED_BYTES of 16-row layouts loads, it runs a few decode steps of one token on a
scratch cache with the prefetch on and off in turn (alternating, so a change in load falls on both), and keeps the
faster by median; within MARGIN of each other it stays on, as tuned. A smaller model leaves the setting as it is:
its steps stream little from memory (the built-in 135M measured the same either way), and measuring would add most of
its load time (0.08 -> 0.15 s). The setting belongs to the kernel library, so to the process. HEARTH_PREFETCH=on or
off fixes it without measuring (benchmarks). A prefetch is a hint: on or off, every result is the same bits.

The setting governs one-row decode steps and prompts. A forward of 2 to FEW_ROWS rows (a batch's step, a lookup
check) always prefetches: on the Zen 4 guest's 1B Q4_K_M and Q6_K files, whose steps measured faster without it,
those forwards ran 1.04-1.14x (2 rows) and 1.23-1.40x (4 to 8) faster with it, the same bits.

Saved: the measurement takes ~0.3 s of a 1B model's ~2 s warm start, so a choice is kept in the cache
(`prefetch.json`) for the same CPU, kernel library, model file and thread count, and measured again after SAVED_FOR_S
(a shared machine's load changes) or when the file cannot be read (a damaged file is said in the log and replaced).
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from app.core.storage.schema import read_json_file, write_json_file

log = logging.getLogger(__name__)

PREFETCH_ENV = "HEARTH_PREFETCH"
FEW_ROWS = 8  # forwards of 2 to this many rows always prefetch (the kernel's X16_PREFETCH_FEW_ROWS)
# Steps with it on and off, alternating, after one step that warms the caches: as many pairs as fit in BUDGET_S by
# that step's time, between MIN_PAIRS and MAX_PAIRS (a 1B takes ~5 pairs in ~0.3 s, an 8B 3 in ~1.5 s): single steps
# vary by several per cent on a shared machine, and a median of more is surer.
BUDGET_S = 0.3
MIN_PAIRS, MAX_PAIRS = 3, 15
MARGIN = 0.03  # off must measure this much faster per step to be chosen
MEASURED_BYTES = 256 << 20  # the least a model's 16-row layouts hold for its load to measure the prefetch
SAVED_FOR_S = 7 * 24 * 3600  # a saved choice is measured again after a week
SAVED_CHOICES = 64  # the most choices the file keeps (the latest measured)
SAVED_FORMAT = 1
PREFETCH_FILE = "prefetch.json"  # in the cache folder


@dataclass(frozen=True)
class PrefetchChoice:
    """Whether the kernel prefetches, and why: the median step with it on and off, or the environment's setting."""

    on: bool
    on_s: float | None = None
    off_s: float | None = None
    unmeasured: str = PREFETCH_ENV  # why it was not measured
    measured_at: float | None = None  # when a saved choice was measured (epoch seconds); None: at this load

    def describe(self) -> str:
        """The runtime description's words on it: the setting, and the measured factor or why there is none."""
        state = "on" if self.on else "off"
        few = "" if self.on else f"; on for forwards of 2 to {FEW_ROWS} rows"
        if self.on_s is None or self.off_s is None:
            return f"software prefetch {state} ({self.unmeasured}{few})"
        when = ""
        if self.measured_at is not None:
            when = time.strftime(", measured %Y-%m-%d %H:%M UTC", time.gmtime(self.measured_at))
        if self.on:
            return f"software prefetch on (decode steps {self.off_s / self.on_s:.2f}x as long without it here{when})"
        return f"software prefetch off (decode steps {self.on_s / self.off_s:.2f}x faster without it here{when}{few})"


def fixed_setting(environ: Mapping[str, str] = os.environ) -> bool | None:
    """HEARTH_PREFETCH's on/off, or None to measure; anything else is an error naming the variable."""
    value = environ.get(PREFETCH_ENV, "").strip().lower()
    if not value:
        return None
    if value not in ("on", "off"):
        raise ValueError(f"{PREFETCH_ENV}={environ[PREFETCH_ENV]!r} is not one of on, off")
    return value == "on"


def pairs_for(step_s: float) -> int:
    """How many pairs of steps to time, from one step's seconds (BUDGET_S)."""
    fit = int(BUDGET_S / (2 * step_s)) if step_s > 0 else MAX_PAIRS
    return max(MIN_PAIRS, min(MAX_PAIRS, fit))


def untimed_choice(
    set_prefetch: Callable[[int], int], layout_bytes: int, environ: Mapping[str, str] = os.environ
) -> PrefetchChoice | None:
    """The setting where nothing is timed: HEARTH_PREFETCH's (set through `set_prefetch(1 or 0)`), or the one in place
    (`set_prefetch(-1)` asks) for a model with under MEASURED_BYTES of 16-row layouts; None where the steps should be
    timed (timed_choice). A HEARTH_PREFETCH that is neither on nor off raises ValueError naming it."""
    fixed = fixed_setting(environ)
    if fixed is not None:
        set_prefetch(int(fixed))
        return PrefetchChoice(fixed)
    if layout_bytes < MEASURED_BYTES:
        return PrefetchChoice(bool(set_prefetch(-1)), unmeasured=f"not measured under {MEASURED_BYTES >> 20} MiB")
    return None


def timed_choice(
    set_prefetch: Callable[[int], int], step: Callable[[], None], clock: Callable[[], float] = time.perf_counter
) -> PrefetchChoice:
    """Time `step` with the prefetch on and off (set through `set_prefetch(1 or 0)`), leave the faster set, and say
    which and by how much."""
    times: dict[bool, list[float]] = {True: [], False: []}
    set_prefetch(1)
    start = clock()
    step()  # the first step pays for cold caches and pages: not counted, only sizes the rest
    for pair in range(pairs_for(clock() - start)):
        for on in (True, False) if pair % 2 == 0 else (False, True):
            set_prefetch(int(on))
            start = clock()
            step()
            times[on].append(clock() - start)
    on_s, off_s = statistics.median(times[True]), statistics.median(times[False])
    on = not off_s < on_s * (1 - MARGIN)
    set_prefetch(int(on))
    return PrefetchChoice(on, on_s, off_s)


def choice_key(machine: str, library_sha256: str, model_identity: str, threads: int) -> str:
    """What a saved choice is for: this CPU (cpu.machine_identity), the kernel library's file, the model file (size
    and modification time) and the team's size."""
    return hashlib.sha256(f"{machine}\0{library_sha256}\0{model_identity}\0{threads}".encode()).hexdigest()


def _saved_entries(path: Path) -> tuple[dict[str, dict[str, float | bool]], str]:
    """The file's choices by key, and why it was not usable ("" when it was, or is not there)."""
    if not path.exists():
        return {}, ""
    data, problem = read_json_file(path)
    if problem:
        return {}, f"{path.name} {problem}"
    if not isinstance(data, dict) or data.get("format") != SAVED_FORMAT or not isinstance(data.get("choices"), dict):
        return {}, f"{path.name} is not a saved prefetch file of format {SAVED_FORMAT}"
    return {key: entry for key, entry in data["choices"].items() if isinstance(entry, dict)}, ""


def _choice_from(entry: Mapping[str, object]) -> PrefetchChoice | None:
    """A saved entry as a choice, or None where a value is missing or not what it should be (a hand-edited file)."""
    on = entry.get("on")
    if not isinstance(on, bool):  # only an explicit true or false
        return None
    times: list[float] = []
    for name in ("on_s", "off_s", "measured_at"):
        value = entry.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
            return None
        times.append(float(value))
    return PrefetchChoice(on, times[0], times[1], measured_at=times[2])


def saved_choice(path: Path, key: str, now: float | None = None) -> PrefetchChoice | None:
    """The choice saved in `path` for `key`, measured less than SAVED_FOR_S ago; None to measure it (none saved, too
    old, or a file or entry that cannot be read: said in the log, and replaced by the next save)."""
    entries, problem = _saved_entries(path)
    if problem:
        log.warning("the saved prefetch choices are not used: %s; measuring again", problem)
        return None
    entry = entries.get(key)
    if entry is None:
        return None
    choice = _choice_from(entry)
    if choice is None:
        log.warning("the saved prefetch choice in %s is damaged; measuring again", path)
        return None
    age = (time.time() if now is None else now) - (choice.measured_at or 0.0)
    return choice if 0 <= age < SAVED_FOR_S else None


def save_choice(path: Path, key: str, choice: PrefetchChoice, now: float | None = None) -> None:
    """Keep a measured choice in `path` under `key` (the latest SAVED_CHOICES). Best effort: a full or read-only cache
    only means the next load measures again."""
    if choice.on_s is None or choice.off_s is None:
        return
    entries, _ = _saved_entries(path)  # an unreadable file is replaced
    entry = {**asdict(choice), "measured_at": time.time() if now is None else now}
    del entry["unmeasured"]
    entries.pop(key, None)
    entries[key] = entry
    kept = dict(list(entries.items())[-SAVED_CHOICES:])
    try:
        write_json_file(path, {"format": SAVED_FORMAT, "choices": kept})
    except OSError as exc:
        log.info("prefetch choice not saved in %s: %s", path, exc)
