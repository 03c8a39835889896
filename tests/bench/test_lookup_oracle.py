"""The lookup bench's oracle: the bound it prints must follow the guesses and the costs, never the planner."""

from __future__ import annotations

import pytest

from bench.lookup_oracle import oracle, replayed_planner

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12, 13]


def test_a_copied_span_is_checked_at_once_when_checks_are_cheap() -> None:
    reply = [1, 5, 6, 7, 8, 9, 10, 11, 2]  # from "1 5" on the prompt's continuation is copied to the end
    cheap = {rows: 1.0 + 0.1 * (rows - 1) for rows in range(1, 10)}
    ratio, proposals, first_taken = oracle(PROMPT, reply, cheap)
    assert ratio > 1.5 and first_taken >= 1 and proposals >= first_taken
    # A step after token 1; after 5 the single token names the prompt's span: one check of 5 and the six guesses
    # 6-11 (7 rows), all taken, and the reply is done: its 8 next tokens for a step and that check.
    assert ratio == pytest.approx(8 / (1 + cheap[7]))


def test_checks_that_cost_a_step_per_row_gain_nothing_and_nothing_copied_gains_nothing() -> None:
    reply = [1, 5, 6, 7, 8, 9, 10, 11, 2]
    full = {rows: float(rows) for rows in range(1, 10)}
    assert oracle(PROMPT, reply, full)[0] == 1.0
    cheap = {rows: 1.0 + 0.1 * (rows - 1) for rows in range(1, 10)}
    ratio, proposals, first_taken = oracle(PROMPT, [1, 2, 3, 4, 2, 5, 9], cheap)  # "2" recurs, then goes elsewhere
    assert proposals >= 1 and first_taken == 0 and ratio == 1.0


def test_the_replayed_planner_is_priced_by_the_costs_never_the_clock_and_stays_under_the_bound() -> None:
    reply = [1, 5, 6, 7, 8, 9, 10, 11, 12, 13, 2]  # the prompt's span copied from "1 5 6" on
    cheap = {rows: 1.0 + 0.1 * (rows - 1) for rows in range(1, 10)}
    planned = replayed_planner(PROMPT, reply, cheap)
    assert planned == replayed_planner(PROMPT, reply, cheap)  # no timing noise: the same every time
    assert 1.2 < planned <= oracle(PROMPT, reply, cheap)[0]  # it checks the span, at most as well as the oracle
    full = {rows: float(rows) for rows in range(1, 10)}
    assert replayed_planner(PROMPT, reply, full) == 1.0  # checks that cost a step per row: it never checks
