"""Prompt-lookup decoding: the n-gram proposals, the planner's cost model, and replies that are the same tokens with
lookup on and off (a toy model with a known next-token rule, then the default model from its GGUF)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from app.core.chat.events import ChatMessage, DoneEvent, StatsEvent
from app.core.chat.sampling import SamplingParams
from app.core.engines.backend import LoadRequest, ReplyRequest
from app.core.engines.lite.backend import LiteBackend, open_lite_backend
from app.core.engines.lite.engine import LiteEngine
from app.core.engines.lookup import (
    FIRST_PRIORS,
    MISS_DAMPING,
    MIXED,
    ONCE,
    PRIOR_FIRST,
    PRIOR_ROW_COST,
    PRIOR_WEIGHT,
    REPEATED,
    STALE_CALLS,
    STEPS_KEPT,
    GuessOdds,
    LookupDecoder,
    LookupPlanner,
    MatchKind,
    NgramIndex,
    Odds,
    ReplyOdds,
)
from app.core.stats_text import reply_stats_text
from tests.helpers.lookup_planners import CheapForwards


# -- proposals ---------------------------------------------------------------------------------------------------------
def test_the_tokens_after_the_latest_earlier_occurrence_of_the_last_ngram_are_proposed() -> None:
    index = NgramIndex([1, 2, 3, 4, 9, 1, 2, 3, 5, 6, 7, 1, 2, 3])
    assert index.propose(2) == [5, 6]  # the latest earlier "1 2 3" was followed by 5 6, not the first one's 4 9
    assert index.propose(10) == [5, 6, 7, 1, 2, 3]  # as far as the sequence goes
    assert index.propose(0) == []


def test_a_longer_match_wins_and_a_shorter_one_is_the_fallback() -> None:
    index = NgramIndex([7, 8, 1, 8, 9, 2, 8, 9])
    assert index.propose(1) == [2]  # "8 9" occurred before (then 2); the trigram "2 8 9" did not
    index = NgramIndex([5, 8, 9, 1, 4, 8, 9, 2, 5, 8, 9])
    assert index.propose(1) == [1]  # the trigram "5 8 9" beats the later bigram "8 9" (followed by 2)


def test_a_match_says_how_long_it_is_and_how_its_ngram_was_followed_before() -> None:
    index = NgramIndex([1, 2, 3, 4, 9, 1, 2, 3, 5, 6, 7, 1, 2, 3])
    assert index.match(2) == ([5, 6], MatchKind(3, MIXED))  # "1 2 3" was followed by 4, then by 5
    index = NgramIndex([1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3])
    assert index.match(1) == ([4], MatchKind(3, REPEATED))  # twice, by 4 both times
    index = NgramIndex([7, 8, 1, 8, 9, 2, 8, 9])
    assert index.match(3) == ([2, 8, 9], MatchKind(2, ONCE))  # "8 9" once before; "2 8 9" never
    assert index.match(0) == ([], None) and NgramIndex([1, 2, 3]).match(4) == ([], None)


def test_nothing_is_proposed_without_a_repeat_and_appends_extend_the_index() -> None:
    index = NgramIndex([1, 2, 3, 4])
    assert index.propose(4) == []  # "4" never occurred with a token after it
    index.append(1)
    assert index.match(4) == ([2, 3, 4, 1], MatchKind(1, ONCE))  # the last resort: one token's earlier occurrence
    index.append(2)
    assert index.match(4) == ([3, 4, 1, 2], MatchKind(2, ONCE))  # two tokens now: the longer match wins
    assert NgramIndex([1, 2, 3, 4], sizes=(3, 2)).propose(4) == []  # without single tokens, nothing


def test_a_single_token_s_missed_guess_teaches_its_own_odds_without_damping_the_others() -> None:
    odds = ReplyOdds()
    single, trigram = MatchKind(1, MIXED), MatchKind(3, ONCE)
    assert odds.first_odds(single).chance == pytest.approx(FIRST_PRIORS[single])
    for _ in range(5):
        odds.record(single, 3, 0)
    assert odds.first_odds(single).chance < FIRST_PRIORS[single] / 2 and odds.missed_in_a_row == 0
    assert odds.for_kind(trigram).first.chance == pytest.approx(FIRST_PRIORS[trigram])  # undamped
    odds.record(MatchKind(2, ONCE), 3, 0)  # a longer match's miss does damp
    assert odds.missed_in_a_row == 1
    assert odds.for_kind(trigram).first.chance == pytest.approx(FIRST_PRIORS[trigram] * MISS_DAMPING)


# -- the planner -------------------------------------------------------------------------------------------------------
def test_guesses_are_checked_only_when_their_forward_pays_for_itself() -> None:
    planner = LookupPlanner(max_draft=6)
    planner.record_step(0.010)
    for rows in range(2, 8):
        planner.record_forward(rows, 0.010 * rows)  # a forward costs as many steps as it has rows
    likely = GuessOdds(Odds(0.9, 1.0), Odds(0.9, 1.0))
    assert planner.draft_length(6, likely) == 0  # nothing is gained: every guess is paid in full
    for rows in range(2, 8):
        planner.forward_s[rows] = 0.010 * (1 + 0.05 * (rows - 1))  # memory-bound: rows are nearly free
    assert planner.draft_length(6, likely) == 6
    assert planner.draft_length(2, likely) == 2  # never more than the reply has room for
    assert planner.draft_length(6, GuessOdds(first=Odds(0.02, 1.0))) == 0  # guesses never taken cost their rows


def test_a_reply_s_odds_count_its_first_guesses_per_kind_and_its_runs_from_the_priors() -> None:
    odds = ReplyOdds()
    trigram, bigram = MatchKind(3, ONCE), MatchKind(2, MIXED)
    assert odds.first_odds(trigram).chance == pytest.approx(FIRST_PRIORS[trigram]) and odds.follow.chance == 0.8
    assert (odds.first_odds(None).taken, odds.first_odds(None).tried) == PRIOR_FIRST  # a kind with no prior
    for _ in range(6):
        odds.record(bigram, 4, 0)
    assert odds.first_odds(bigram).chance < 0.1 and odds.follow.chance == 0.8  # no guess taken: nothing about runs
    assert odds.first_odds(trigram).tried == PRIOR_WEIGHT  # another kind's own count is untouched ...
    damped = FIRST_PRIORS[trigram] * MISS_DAMPING**6
    assert odds.for_kind(trigram).first.chance == pytest.approx(damped)  # ... but six misses in a row damp it
    odds.record(trigram, 4, 2)  # the first two taken, the third not
    assert odds.missed_in_a_row == 0 and odds.for_kind(trigram).first.chance == odds.first_odds(trigram).chance
    assert odds.first_odds(trigram).tried == PRIOR_WEIGHT + 1
    assert (odds.follow.taken, odds.follow.tried) == (5.0, 7.0)  # one taken after a taken one, one not
    odds.record(trigram, 2, 2)  # both taken: a run the check's end cut short, no miss counted
    assert (odds.follow.taken, odds.follow.tried) == (6.0, 8.0)


def test_a_match_that_has_always_been_followed_the_same_way_is_checked_where_a_mixed_one_is_not() -> None:
    # A row costs 0.35 of a step: one guess pays when it is taken more than ~37 % of the time.
    planner = LookupPlanner(max_draft=4)
    planner.record_step(0.010)
    for rows in range(2, 6):
        planner.record_forward(rows, 0.010 * (1 + 0.35 * (rows - 1)))
    odds = ReplyOdds()
    assert planner.draft_length(4, odds.for_kind(MatchKind(3, REPEATED))) >= 1
    assert planner.draft_length(4, odds.for_kind(MatchKind(2, MIXED))) == 0
    assert planner.draft_length(4, odds.for_kind(None)) == 0  # a kind with no measured prior: one in four


def test_each_reply_has_odds_of_its_own_and_the_engine_keeps_the_costs() -> None:
    planner = LookupPlanner()
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 3, 1, 4, 1, 5]
    first, second = (toy_reply(prompt, 1, planner)[2] for _ in range(2))
    kind = MatchKind(3, ONCE)
    first.odds.record(kind, 4, 0)
    assert second.odds != first.odds
    assert first.odds.first_odds(kind).tried == second.odds.first_odds(kind).tried + 1
    assert second.planner is first.planner


def test_long_runs_pay_for_long_checks_even_when_first_guesses_often_miss() -> None:
    # A copied span: half the checks miss at once, but once a guess is taken the next ones nearly always are.
    planner = LookupPlanner(max_draft=8)
    planner.record_step(0.010)
    for rows in range(2, 10):
        planner.record_forward(rows, 0.010 * (1 + 0.3 * (rows - 1)))  # each row 0.3 of a step
    assert planner.draft_length(8, GuessOdds(Odds(0.5, 1.0), Odds(0.95, 1.0))) >= 4
    # runs that break off at once: one guess at most
    assert planner.draft_length(8, GuessOdds(Odds(0.5, 1.0), Odds(0.3, 1.0))) <= 1


def test_checks_grow_from_the_sizes_timed_and_a_few_slow_steps_do_not_cheapen_them() -> None:
    planner = LookupPlanner(max_draft=8)
    sure = GuessOdds(Odds(0.99, 1.0), Odds(0.99, 1.0))  # every guess taken: the longest check pays
    assert planner.draft_length(8, sure) == 2  # nothing timed: two guesses at most
    for _ in range(10):
        planner.record_step(0.010)
    planner.record_forward(3, 0.012)
    assert planner.longest_check() == 4 and planner.draft_length(8, sure) == 4
    planner.record_forward(5, 0.015)
    assert planner.draft_length(8, sure) == 8
    for _ in range(4):
        planner.record_step(0.040)  # a team size under trial: a few steps four times as slow
    assert planner.step_s == 0.010 and planner.cost_in_steps(3) == pytest.approx(1.2)


def test_a_size_not_timed_yet_is_priced_from_the_sizes_that_were() -> None:
    planner = LookupPlanner()
    assert planner.cost_in_steps(3) == pytest.approx(1.0 + 2 * PRIOR_ROW_COST)  # nothing timed: the prior
    planner.record_step(0.010)
    planner.record_forward(2, 0.0105)  # one row more cost 0.05 of a step
    assert planner.cost_in_steps(2) == pytest.approx(1.05)
    assert planner.cost_in_steps(5) == pytest.approx(1.2)  # four rows more at the measured 0.05 each


def test_a_slow_moment_does_not_price_checks_out_and_a_stale_cost_is_measured_again() -> None:
    """A host that slows every call for a moment (measured: 2-row checks at 1.9 steps among 1.2s) must not leave the
    checks priced at that: a rewrite that copies its text then checked nothing."""
    planner = LookupPlanner()
    likely_first = GuessOdds(Odds(0.4, 1.0), Odds(0.8, 1.0))  # a first guess taken 2 times in 5
    for _ in range(STEPS_KEPT):
        planner.record_step(0.010)
    for seconds in (0.012, 0.019, 0.020, 0.012, 0.012):  # two checks in a slow moment among three ordinary ones
        planner.record_forward(2, seconds)
    assert planner.cost_in_steps(2) == pytest.approx(1.2)
    assert planner.draft_length(1, likely_first) == 1  # 1.4 tokens for 1.2 steps: worth a check
    stale = LookupPlanner()
    for _ in range(STEPS_KEPT):
        stale.record_step(0.010)
    stale.record_forward(2, 0.019)  # the only timing of a size, in a slow moment
    assert stale.draft_length(1, likely_first) == 0  # priced out for now ...
    for _ in range(STALE_CALLS):
        stale.record_step(0.010)
    assert stale.cost_in_steps(2) == pytest.approx(1.0 + PRIOR_ROW_COST)  # ... until it is old: the prior again
    assert stale.draft_length(1, likely_first) == 1  # so it is checked, and timed afresh


# -- the decoder on a toy model ----------------------------------------------------------------------------------------
class ToyModel:
    """A 'model' whose next token is a fixed function of the last two tokens (so copying spans are predictable), with
    a cache of fed tokens that forward() extends by several at once and truncate() cuts."""

    vocab = 16

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.steps = 0
        self.forwards: list[int] = []

    def logits_after(self, ids: list[int]) -> np.ndarray:
        logits = np.zeros(self.vocab, dtype=np.float32)
        logits[(ids[-1] * 3 + (ids[-2] if len(ids) > 1 else 0)) % 7 + 1] = 1.0
        return logits

    def step(self, token: int) -> np.ndarray:
        self.steps += 1
        self.ids.append(token)
        return self.logits_after(self.ids)

    def forward(self, tokens: list[int]) -> np.ndarray:
        self.forwards.append(len(tokens))
        rows = []
        for token in tokens:
            self.ids.append(token)
            rows.append(self.logits_after(self.ids))
        return np.stack(rows)

    def truncate(self, length: int) -> None:
        assert length <= len(self.ids)
        del self.ids[length:]


def toy_reply(prompt: list[int], count: int, planner: LookupPlanner | None) -> tuple[list[int], ToyModel, Any]:
    model = ToyModel()
    logits = model.forward(prompt)[-1]
    decoder = None
    if planner is not None:
        decoder = LookupDecoder(
            planner,
            NgramIndex(prompt),
            step=model.step,
            forward=model.forward,
            truncate=model.truncate,
            length=lambda: len(model.ids),
            room=lambda: 64,
        )
    model.forwards.clear()
    out: list[int] = []
    for _ in range(count):
        token = int(logits.argmax())
        out.append(token)
        logits = decoder.next_logits(token) if decoder is not None else model.step(token)
    if decoder is not None:
        decoder.finish()
    return out, model, decoder


def cheap_forwards() -> LookupPlanner:
    return CheapForwards(max_draft=4)


def test_lookup_gives_the_plain_tokens_and_keeps_only_the_fed_ones_in_the_cache() -> None:
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 3, 1, 4, 1, 5]
    plain, plain_model, _ = toy_reply(prompt, 40, None)
    looked, model, decoder = toy_reply(prompt, 40, cheap_forwards())
    assert looked == plain
    assert model.ids == plain_model.ids  # no rejected guess's position survives
    assert decoder.tally.checks > 0 and decoder.tally.accepted > 0
    assert decoder.tally.accepted <= decoder.tally.proposed
    assert model.steps + len(model.forwards) < plain_model.steps  # fewer passes over the weights


def test_a_reply_that_ends_inside_a_checked_run_drops_the_unreached_guesses() -> None:
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 3, 1, 4, 1, 5]
    for count in range(1, 12):
        plain, plain_model, _ = toy_reply(prompt, count, None)
        looked, model, _ = toy_reply(prompt, count, cheap_forwards())
        assert looked == plain
        assert model.ids == plain_model.ids


class NeverChecks(LookupPlanner):
    """A planner whose forwards never pay: it only steps, and learns the odds from guesses it does not check."""

    def cost_in_steps(self, rows: int) -> float:
        return float(rows)


def test_guesses_that_are_not_checked_still_teach_the_planner_the_reply_s_odds() -> None:
    prompt = [3, 1, 4, 1, 5, 9, 2, 6, 3, 1, 4, 1, 5]
    plain, _, _ = toy_reply(prompt, 40, None)
    planner = NeverChecks(max_draft=4)
    looked, model, decoder = toy_reply(prompt, 40, planner)
    assert looked == plain and decoder.tally.checks == 0 and model.forwards == []
    # The toy copies its spans: the reply's guesses from matches of two tokens or more, compared with the tokens that
    # followed, were mostly right; single tokens' guesses were tried too and mostly missed (their odds learn it).
    priors = {kind: ReplyOdds().first_odds(kind) for kind in decoder.odds.first}
    seen = {
        kind: (odds.taken - priors[kind].taken, odds.tried - priors[kind].tried)
        for kind, odds in decoder.odds.first.items()
        if kind is not None
    }
    taken, tried = (sum(pair[i] for kind, pair in seen.items() if kind.length > 1) for i in (0, 1))
    assert tried > 5 and taken / tried > 0.5  # first guesses (each kind's prior left out)
    single_taken, single_tried = (sum(pair[i] for kind, pair in seen.items() if kind.length == 1) for i in (0, 1))
    assert single_tried > 5 and single_taken / single_tried < 0.5
    assert decoder.odds.follow.tried > 5 and decoder.odds.follow.chance > 0.8


# -- the default model -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lite_default() -> Iterator[LiteEngine]:
    opened = open_lite_backend(LoadRequest(None, device="cpu", response_cache=False, prompt_cache_gib=0))
    assert isinstance(opened, LiteBackend), opened
    yield opened.engine
    opened.close()


COPY_PROMPT = "Repeat this list exactly, line by line:\n" + "\n".join(
    f"- item {n}: the {color} box on shelf {n % 4}" for n, color in enumerate(["red", "blue", "green"] * 4)
)


def reply(engine: LiteEngine, params: SamplingParams) -> tuple[str, dict[str, Any], list[int]]:
    request = ReplyRequest(messages=[ChatMessage("user", COPY_PROMPT)], params=params)
    kv = engine.new_kv()
    text, stats = "", {}
    for event in engine.generate(request, kv=kv):
        if isinstance(event, StatsEvent):
            stats = event.stats.to_dict()
        elif isinstance(event, DoneEvent):
            assert event.error is None
            text = event.text
    return text, stats, list(kv.ids)


@pytest.mark.parametrize(
    "params",
    [SamplingParams(temperature=0.0, max_new_tokens=96), SamplingParams(temperature=0.8, seed=7, max_new_tokens=96)],
    ids=["greedy", "seeded"],
)
def test_the_default_model_replies_the_same_tokens_with_lookup_on_and_off(
    lite_default: LiteEngine, params: SamplingParams
) -> None:
    lite_default.set_lookup(False)
    plain_text, plain_stats, plain_ids = reply(lite_default, params)
    assert plain_stats["lookup_proposed"] == 0
    assert plain_stats["lookup"] == "off (the prompt_lookup setting)"
    lite_default.set_lookup(True)
    lite_default.lookup = CheapForwards()  # this test is about tokens, never timings
    text, stats, ids = reply(lite_default, params)
    assert text == plain_text
    assert ids == plain_ids  # the cache holds what plain decoding fed: the next turn reuses the same prefix
    assert stats["lookup"] == "on"
    if params.greedy:
        assert stats["lookup_accepted"] > 0
    assert 0 <= stats["lookup_accepted"] <= stats["lookup_proposed"]
    line = reply_stats_text(stats, note=True)
    assert f"lookup {stats['lookup_accepted']}/{stats['lookup_proposed']} guesses taken" in line
    assert "prompt lookup on" in line
