"""Prompt-lookup decoding: tokens proposed by n-gram lookup in the conversation, checked in one multi-row forward.

Decode reads every weight once per token; a forward over several tokens reads them once for all. When a reply copies
a span it has seen (an answer quoting the attached document, a rewrite, a code edit), the tokens that followed the
last few tokens' previous occurrence are a good guess for what comes next: run the current token and the guesses in
one forward, and every guess the model's own pick agrees with is a token gained for the price of one pass.

Exactness: the engine picks every token from logits exactly as plain decode computes them (the torch-free GGUF
forward computes each row as a decode step does, bit for bit), one pick per token in order, with the same sampler
and its random draws. A guess counts only when the pick equals it, so greedy and seeded replies are the same tokens
with lookup on or off; for sampling this is the speculative acceptance rule for a draft that puts all its
probability on one token (accept with probability p(guess)), so the distribution is unchanged.

Cost: a guess the model rejects costs the rows it added to the forward. LookupPlanner measures what a step and a
forward of each size cost on this machine (they differ between CPUs and with the cores' load) and how this reply's
guesses fare: how often a check's first guess is taken, by the kind of match that proposed it (a context of three
tokens seen before, always followed by the same token, is a far better guess than two tokens followed by different
ones), and how often a guess after a taken one is (a copied span goes on: the default model took 82-86 % of those,
against 50-84 % of first guesses, over nine prompts). It proposes only as many tokens as pay for themselves, none
when none do.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

# The longest match is tried first: a longer context predicts the continuation better. A single token's match is the
# last resort: weak evidence (its first guess taken 22-49 % of the time, by its history), but where no longer one
# matched it still found spans a reply went on to copy (2026-12-08; measured in docs/speed.md).
NGRAM_SIZES = (3, 2, 1)
MAX_DRAFT = 8  # the most tokens one forward checks (the forward's rows are that plus the current token)
# A reply's odds before its own guesses count, as (taken, tried) pseudo-counts: light, so that a few guesses outweigh
# them. A guess after a taken one is taken four times in five. A check's first guess by the kind of match that proposed
# it (FIRST_PRIORS, below); for a kind not listed one time in four (free writing's rate: with one in two for every
# match a fresh process's first reply checked up to 7 guesses before any was taken).
PRIOR_FIRST = (1.0, 4.0)
PRIOR_FOLLOW = (4.0, 5.0)
STEPS_KEPT = 15
# Each check size's last timings: their median is its cost. (A moving average kept a moment when the host slowed every
# call to twice its time: 2-row checks priced at 1.55-1.96 steps against 1.2-1.3 measured alone, at which no first
# guess pays, and a rewrite that copies its whole text then checked nothing; 2026-12-07, Zen 4 guest.)
FORWARDS_KEPT = 5
# A size last timed this many steps and checks ago is priced as if untimed (from the sizes timed since, else the
# prior): a cost measured under other load is measured again, not trusted for good.
STALE_CALLS = 200
# Before any forward has been timed: what a row adds, in steps. Measured 0.06-0.15 where the weights stream from
# memory (the 1B shape) and 0.25-0.4 where the products are bound by arithmetic (the default model in a large L3);
# the higher guess keeps a fresh process from paying for checks before it has measured one.
PRIOR_ROW_COST = 0.3

# A matched n-gram's history: seen once before, seen several times always followed by the same token, or followed by
# different tokens.
ONCE, REPEATED, MIXED = "once", "repeated", "mixed"


class MatchKind(NamedTuple):
    """What proposed a run of guesses: how many tokens of context matched, and that n-gram's history."""

    length: int
    history: str


# How often a check's first guess is taken, by its match's kind, before the reply's own guesses count. Measured on the
# default model's greedy replies to twelve prompts (bench/lookup.py's and six others: document questions, rewrites, a
# code edit, free writing; 2026-12-07), at positions where no copy was running: trigram repeated 4/4, once 11/17, mixed
# 7/9; bigram repeated 6/11, once 35/61, mixed 2/16; a single token (2026-12-08, where it was the longest match)
# repeated 8/22, once 40/82, mixed 40/181. Rounded down: a prior that is too hopeful pays for checks.
FIRST_PRIORS = {
    MatchKind(3, REPEATED): 0.85,
    MatchKind(3, ONCE): 0.65,
    MatchKind(3, MIXED): 0.55,
    MatchKind(2, REPEATED): 0.5,
    MatchKind(2, ONCE): 0.45,
    MatchKind(2, MIXED): 0.15,
    MatchKind(1, REPEATED): 0.3,
    MatchKind(1, ONCE): 0.45,
    MatchKind(1, MIXED): 0.2,
}
PRIOR_WEIGHT = 4.0  # the tries each kind's prior counts for
# Each first guess missed in a row (from a match of two tokens or more) scales every kind's odds by this: a reply that
# copies nothing stops checking after two or three misses instead of paying for each kind's own misses in turn.
MISS_DAMPING = 0.8


class _Continuation(NamedTuple):
    position: int  # where the latest occurrence's next token is
    seen: int  # occurrences with a token after them
    mixed: bool  # whether those tokens differed


class NgramIndex:
    """Where each n-gram of a token sequence last occurred with a token after it (and whether earlier occurrences were
    followed by the same token), kept as tokens are appended."""

    def __init__(self, tokens: Iterable[int], sizes: tuple[int, ...] = NGRAM_SIZES) -> None:
        self.tokens: list[int] = []
        self.sizes = sizes
        self._follows: dict[int, dict[tuple[int, ...], _Continuation]] = {size: {} for size in sizes}
        for token in tokens:
            self.append(token)

    def append(self, token: int) -> None:
        # The n-grams that end just before the new token now have a continuation: the new token's position.
        position = len(self.tokens)
        for size in self.sizes:
            if position >= size:
                follows = self._follows[size]
                key = tuple(self.tokens[position - size : position])
                last = follows.get(key)
                if last is None:
                    follows[key] = _Continuation(position, 1, False)
                else:
                    mixed = last.mixed or self.tokens[last.position] != token
                    follows[key] = _Continuation(position, last.seen + 1, mixed)
        self.tokens.append(token)

    def match(self, limit: int) -> tuple[list[int], MatchKind | None]:
        """Up to `limit` tokens that followed the latest earlier occurrence of the sequence's last n tokens, for the
        longest n that has one, and the kind of that match; ([], None) when none does."""
        if limit <= 0:
            return [], None
        for size in self.sizes:
            if len(self.tokens) < size:
                continue
            found = self._follows[size].get(tuple(self.tokens[-size:]))
            if found is not None:
                history = MIXED if found.mixed else REPEATED if found.seen > 1 else ONCE
                return self.tokens[found.position : found.position + limit], MatchKind(size, history)
        return [], None

    def propose(self, limit: int) -> list[int]:
        """match()'s tokens alone."""
        return self.match(limit)[0]


@dataclass
class LookupTally:
    """One reply's account: each check's (guesses proposed, guesses accepted), in order, and their totals."""

    runs: list[tuple[int, int]] = field(default_factory=list)

    @property
    def checks(self) -> int:
        return len(self.runs)

    @property
    def proposed(self) -> int:
        return sum(proposed for proposed, _ in self.runs)

    @property
    def accepted(self) -> int:
        return sum(accepted for _, accepted in self.runs)


@dataclass
class Odds:
    """How often something happened: `taken` times out of `tried`, pseudo-counts of a prior included."""

    taken: float
    tried: float

    @property
    def chance(self) -> float:
        return self.taken / self.tried

    def add(self, taken: float, tried: float) -> None:
        self.taken += taken
        self.tried += tried


@dataclass
class GuessOdds:
    """The odds the planner prices a check with: that its first guess is taken, and that a guess after a taken one
    is."""

    first: Odds = field(default_factory=lambda: Odds(*PRIOR_FIRST))
    follow: Odds = field(default_factory=lambda: Odds(*PRIOR_FOLLOW))


@dataclass
class ReplyOdds:
    """One reply's odds, from the priors and its own guesses (each reply has its own: concurrent replies on one engine
    do not share them): a first guess's per kind of match, a guess's after a taken one, and how many first guesses in a
    row were missed."""

    first: dict[MatchKind | None, Odds] = field(default_factory=dict)
    follow: Odds = field(default_factory=lambda: Odds(*PRIOR_FOLLOW))
    missed_in_a_row: int = 0

    def first_odds(self, kind: MatchKind | None) -> Odds:
        odds = self.first.get(kind)
        if odds is None:
            prior = FIRST_PRIORS.get(kind) if kind is not None else None
            odds = Odds(prior * PRIOR_WEIGHT, PRIOR_WEIGHT) if prior is not None else Odds(*PRIOR_FIRST)
            self.first[kind] = odds
        return odds

    def for_kind(self, kind: MatchKind | None) -> GuessOdds:
        """The odds for guesses proposed by a match of this kind, damped by the first guesses missed in a row."""
        first = self.first_odds(kind)
        damping = MISS_DAMPING**self.missed_in_a_row
        return GuessOdds(Odds(first.taken * damping, first.tried), self.follow)

    def record(self, kind: MatchKind | None, proposed: int, accepted: int) -> None:
        """`proposed` guesses in a row from a match of `kind`, the first `accepted` of them the tokens the reply went
        on with (checked in a forward, or only compared with the reply's next tokens: the same odds, learned without
        paying for a check)."""
        if proposed:
            self.first_odds(kind).add(1.0 if accepted else 0.0, 1.0)
            # A single token's match missing says little about whether the reply copies: it learns its own odds but
            # does not damp the others (counted, it cost the document question's trigram checks 4 % in the replay).
            if accepted:
                self.missed_in_a_row = 0
            elif kind is None or kind.length > 1:
                self.missed_in_a_row += 1
            if accepted:
                # guesses 2..accepted were taken after a taken one, and the next, if there was one, was not
                self.follow.add(accepted - 1, min(accepted, proposed - 1))


class LookupPlanner:
    """How many guesses to check in the next forward: the count that maximises expected tokens per second, from the
    measured cost of a step and of forwards of each size (kept across replies: one planner per engine) and the
    reply's GuessOdds."""

    def __init__(self, max_draft: int = MAX_DRAFT) -> None:
        self.max_draft = max_draft
        # The last steps' times: their median is a step's cost (the decode team's trials of another size make a few
        # steps twice as slow now and then; an average of them priced checks, which run on the fastest size, at
        # under a step, and a fresh process then checked 8 guesses at once).
        self._steps: deque[float] = deque(maxlen=STEPS_KEPT)
        self.step_s: float | None = None  # their median, worked out once per step, not once per size priced
        self.forward_s: dict[int, float] = {}  # rows -> seconds: the median of that size's last FORWARDS_KEPT
        self._forwards: dict[int, deque[float]] = {}
        self._calls = 0  # steps and checks recorded
        self._timed_at: dict[int, int] = {}  # rows -> the call count when that size was last timed

    def record_step(self, seconds: float) -> None:
        self._calls += 1
        self._steps.append(seconds)
        self.step_s = statistics.median(self._steps)

    def record_forward(self, rows: int, seconds: float) -> None:
        self._calls += 1
        kept = self._forwards.setdefault(rows, deque(maxlen=FORWARDS_KEPT))
        kept.append(seconds)
        self.forward_s[rows] = statistics.median(kept)
        self._timed_at[rows] = self._calls

    def _fresh(self) -> dict[int, float]:
        """The sizes timed within the last STALE_CALLS calls, and their costs in seconds."""
        return {
            rows: seconds
            for rows, seconds in self.forward_s.items()
            if self._calls - self._timed_at.get(rows, self._calls) < STALE_CALLS
        }

    def cost_in_steps(self, rows: int) -> float:
        step = self.step_s
        if step is None or step <= 0:
            return 1.0 + PRIOR_ROW_COST * (rows - 1)
        fresh = self._fresh()
        measured = fresh.get(rows)
        if measured is not None:
            return measured / step
        # Not timed lately: what a row added in the sizes that were (a forward's cost grows about linearly with rows).
        slopes = [(seconds / step - 1.0) / (size - 1) for size, seconds in fresh.items() if size > 1]
        per_row = max(0.0, statistics.median(slopes)) if slopes else PRIOR_ROW_COST
        return 1.0 + per_row * (rows - 1)

    def longest_check(self) -> int:
        """The most guesses the next check may hold: twice the largest check timed so far (two at first), so that
        a size is priced from one near it, never a long check from a short one's time alone."""
        timed = max((rows - 1 for rows in self.forward_s), default=0)
        return min(self.max_draft, max(2, 2 * timed))

    def draft_length(self, available: int, odds: GuessOdds) -> int:
        """0 (a plain step) or the number of guesses, at most `available`, whose expected tokens per step-time is
        best and above a plain step's 1, at the reply's `odds`."""
        best, best_rate = 0, 1.0
        expected = 1.0  # the current token's own next token is always gained
        chance = 1.0
        for count in range(1, min(available, self.longest_check()) + 1):
            chance *= odds.first.chance if count == 1 else odds.follow.chance
            expected += chance  # the i-th guess counts only if every guess before it was accepted
            rate = expected / self.cost_in_steps(count + 1)
            if rate > best_rate * 1.02:  # a gain within timing noise is no gain
                best, best_rate = count, rate
        return best


class LookupDecoder:
    """One reply's next-logits source with lookup: `next_logits(token)` runs `token` and returns the logits after it,
    from a plain step, a fresh forward over the token and its guesses, or a row of the last forward whose guess the
    token matched. The engine supplies the model's calls; the cache never keeps a rejected guess's position."""

    def __init__(
        self,
        planner: LookupPlanner,
        index: NgramIndex,
        *,
        step: Callable[[int], Any],
        forward: Callable[[list[int]], Any],
        truncate: Callable[[int], None],
        length: Callable[[], int],
        room: Callable[[], int],
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.planner, self.index = planner, index
        self._step, self._forward, self._truncate, self._length, self._room = step, forward, truncate, length, room
        self._clock = clock  # the steps' and checks' times (bench/lookup_oracle.py replays replies on priced ones)
        self.tally = LookupTally()
        self.odds = ReplyOdds()
        self._rows: Any = None  # the last forward's logits [1 + guesses, vocab] while some guesses are unresolved
        self._guesses: list[int] = []
        self._used = 0  # guesses matched so far
        self._base = 0  # the cache's length before that forward
        self._seconds = 0.0
        self._kind: MatchKind | None = None  # the last forward's guesses' match
        # Guesses proposed but not checked (the planner chose a plain step): compared with the tokens the reply goes
        # on with, so the planner learns this reply's odds while it checks nothing (else a reply whose first checks
        # missed would never check again).
        self._unchecked: list[int] = []
        self._unchecked_used = 0
        self._unchecked_kind: MatchKind | None = None

    def next_logits(self, token: int) -> Any:
        row = self.take_row(token)
        if row is not None:
            return row
        # room(): tokens the reply may still produce after this one's successor, and positions left in the window
        candidates, kind = self.index.match(min(self._room(), self.planner.max_draft))
        count = self.planner.draft_length(len(candidates), self.odds.for_kind(kind)) if candidates else 0
        guesses = candidates[:count]
        if not guesses and not self._unchecked:
            self._unchecked, self._unchecked_used, self._unchecked_kind = candidates, 0, kind
        started = self._clock()
        if not guesses:
            logits = self._step(token)
            self.planner.record_step(self._clock() - started)
            return logits
        self._end_unchecked()
        self._kind = kind
        self._base = self._length()
        rows = self._forward([token, *guesses])
        self._seconds = self._clock() - started
        self._rows, self._guesses, self._used = rows, guesses, 0
        return rows[0]

    def take_row(self, token: int) -> Any:
        """Note `token` as the reply's next; the logits after it when the last forward guessed it (nothing runs),
        else None: the caller runs it (the unmatched guesses' positions are dropped first)."""
        self.index.append(token)
        if self._unchecked:
            if token == self._unchecked[self._unchecked_used]:
                self._unchecked_used += 1
                if self._unchecked_used == len(self._unchecked):
                    self._end_unchecked()
            else:
                self._end_unchecked(missed=True)
        if self._rows is not None:
            if token == self._guesses[self._used]:
                self._used += 1
                row = self._rows[self._used]
                if self._used == len(self._guesses):
                    self._settle()
                return row
            self._drop_unmatched()
        return None

    def finish(self) -> None:
        """The reply ended: drop the positions of guesses it never reached."""
        if self._rows is not None:
            self._drop_unmatched()
        self._end_unchecked()

    def _end_unchecked(self, missed: bool = False) -> None:
        """Count the unchecked guesses as far as the reply has gone: up to a miss, or all taken so far."""
        if self._unchecked and (missed or self._unchecked_used):
            self.odds.record(self._unchecked_kind, self._unchecked_used + missed, self._unchecked_used)
        self._unchecked, self._unchecked_used = [], 0

    def _drop_unmatched(self) -> None:
        self._truncate(self._base + 1 + self._used)  # the token, then the guesses matched
        self._settle()

    def _settle(self) -> None:
        self.planner.record_forward(len(self._guesses) + 1, self._seconds)
        self.odds.record(self._kind, len(self._guesses), self._used)
        self.tally.runs.append((len(self._guesses), self._used))
        self._rows, self._guesses, self._used = None, [], 0
