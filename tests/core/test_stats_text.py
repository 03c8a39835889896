"""The one wording of a reply's numbers (window, `hearth chat --stats`, Markdown export) and when a rate shows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.core.chat.events import ReplyStats
from app.core.stats_text import FINISH_LABELS, format_cost, rate_text, reply_stats_text
from app.core.storage.history import HistoryStore


def stats(**changes: Any) -> dict[str, Any]:
    base = ReplyStats(
        ttft_s=0.25,
        prompt_tokens=120,
        cached_tokens=100,
        prefill_tokens_per_s=400.0,
        decode_tokens_per_s=15.5,
        generated_tokens=42,
        prefill_s=0.05,
        decode_s=2.65,
        peak_memory_bytes=300 * 2**20,
        memory_device="cpu",
        decode_path="fused-q4",
        decode_path_note="fused Q4_1 step",
    ).to_dict()
    return {**base, **changes}


def test_every_number_in_one_order() -> None:
    assert reply_stats_text(stats(), "length") == (
        "first token 0.25 s · prompt 120 tok (100 cached / 20 new) · prefill 400 tok/s · decode 15.5 tok/s "
        "(fused-q4) · 42 generated · stopped at the length limit"
    )


def test_a_regenerates_one_new_token_shows_no_prefill_rate() -> None:
    # The case a user saw: "50 cached / 1 new · prefill 0 tok/s" (one token over a few microseconds).
    line = reply_stats_text(stats(prompt_tokens=51, cached_tokens=50, prefill_tokens_per_s=0.0, prefill_s=0.0))
    assert "prompt 51 tok (50 cached / 1 new)" in line
    assert "prefill" not in line
    assert "decode 15.5 tok/s (fused-q4)" in line  # the decode rate still means something


def test_a_one_token_reply_shows_its_decode_path_but_no_rate() -> None:
    line = reply_stats_text(stats(generated_tokens=1, decode_tokens_per_s=0.0, decode_s=0.0))
    assert "tok/s (fused-q4)" not in line and "decode path fused-q4" in line
    assert "1 generated" in line


@pytest.mark.parametrize(
    ("tokens", "seconds", "shown"),
    [(4, 0.020, True), (3, 1.0, False), (100, 0.019, False), (4, 0.0, False)],
)
def test_a_rate_needs_four_tokens_over_twenty_milliseconds(tokens: int, seconds: float, shown: bool) -> None:
    assert (rate_text(tokens, seconds, tokens / seconds if seconds else 0.0) is not None) is shown


def test_rates_are_worded_by_size() -> None:
    assert rate_text(10, 1.0, 12.34) == "12.3 tok/s"
    assert rate_text(10_000, 1.0, 1234.5) == "1,234 tok/s"
    assert rate_text(10, 1.0, float("nan")) is None


def test_decode_rate_counts_the_steps_after_the_first_token() -> None:
    # 4 tokens generated = 3 decode steps: too few for a rate, however long they took.
    assert "decode path" in reply_stats_text(stats(generated_tokens=4, decode_s=1.0, decode_tokens_per_s=3.0))
    assert "decode 4.0 tok/s" in reply_stats_text(stats(generated_tokens=5, decode_s=1.0, decode_tokens_per_s=4.0))


def test_an_older_record_without_durations_works_them_back_from_the_rate() -> None:
    old = stats()
    del old["prefill_s"], old["decode_s"]
    assert "prefill 400 tok/s" in reply_stats_text(old)  # 20 tokens at 400 tok/s = 50 ms
    fast = {**old, "prefill_tokens_per_s": 10_000.0}  # 20 tokens in 2 ms: noise
    assert "prefill" not in reply_stats_text(fast)


def test_a_replayed_reply_says_so_instead_of_rates() -> None:
    line = reply_stats_text(stats(from_response_cache=True))
    assert "replayed from the response cache" in line and "tok/s" not in line


def test_damaged_or_missing_fields_never_raise() -> None:
    line = reply_stats_text({"ttft_s": "soon", "prompt_tokens": True, "generated_tokens": 3, "decode_s": None})
    assert line == "first token 0.00 s · prompt 0 tok (0 cached / 0 new) · 3 generated"
    assert reply_stats_text(None, "cancelled") == "stopped by you"


def test_the_command_lines_extras() -> None:
    line = reply_stats_text(stats(dropped_turns=2), memory=True, note=True)
    assert "peak 300 MiB (cpu)" in line and "dropped 2 old messages to fit" in line
    assert line.endswith("fused Q4_1 step")
    assert "peak" not in reply_stats_text(stats()) and "fused Q4_1 step" not in reply_stats_text(stats())


def test_prompt_lookup_shows_its_guesses_in_the_line_and_its_state_in_the_note() -> None:
    line = reply_stats_text(stats(lookup="on", lookup_checks=9, lookup_proposed=40, lookup_accepted=31), note=True)
    assert "decode 15.5 tok/s (fused-q4) · lookup 31/40 guesses taken · 42 generated" in line
    assert line.endswith("fused Q4_1 step · prompt lookup on")
    off = reply_stats_text(stats(lookup="off (the prompt_lookup setting)"), note=True)
    assert "guesses" not in off and off.endswith("prompt lookup off (the prompt_lookup setting)")
    assert "lookup" not in reply_stats_text(stats(lookup="on"))  # nothing guessed: the line stays as it was


def test_cost_in_one_wording_with_or_without_the_running_total() -> None:
    cost = {
        "total_usd": 0.0013,
        "provider": "openai",
        "model": "gpt-4o-mini",
        "history_usd": 0.0008,
        "cache_saved_usd": 0.0005,
        "conversation_total_usd": 0.01,
    }
    assert format_cost(cost) == (
        "cost ~$0.0013 on openai/gpt-4o-mini (estimate) (re-sent history $0.0008, caching saved $0.0005, "
        "conversation $0.0100)"
    )
    assert "conversation $" not in reply_stats_text(stats(cost=cost))
    assert "conversation $0.0100" in reply_stats_text(stats(cost=cost), conversation_total=True)
    assert format_cost({**cost, "hypothetical": True}).startswith("would cost ~$0.0013")


def test_the_export_and_the_window_word_a_reply_alike(tmp_path: Path) -> None:
    with HistoryStore(tmp_path / "history.sqlite") as store:
        chat = store.create_conversation("Words")
        question = store.add_message(chat.id, "user", "Hi", None)
        store.add_message(chat.id, "assistant", "Hello", question.id, finish_reason="cancelled", stats=stats())
        markdown = store.export_markdown(chat.id)
    assert f"*{reply_stats_text(stats(), 'cancelled')}*" in markdown
    assert FINISH_LABELS["cancelled"] in markdown and "stopped by the user" not in markdown
