"""Cost arithmetic against hand-computed figures (genai-prices' bundled list), and no network, ever."""

from __future__ import annotations

import subprocess
import sys

import pytest

from app.core.engines.remote import pricing
from app.core.engines.remote.pricing import ConversationCost, TokenUsage, price_reply
from app.core.stats_text import format_cost

# gpt-4o-mini in the bundled list: $0.15 / MTok input, $0.075 / MTok cached input, $0.60 / MTok output
IN, CACHED, OUT = 0.15e-6, 0.075e-6, 0.60e-6


def test_one_reply_split_into_new_cached_history_and_output() -> None:
    cost = price_reply(TokenUsage(10_000, 6_000, 500, 8_000), "gpt-4o-mini", "openai")
    assert cost.input_usd == pytest.approx(4_000 * IN + 6_000 * CACHED)  # 0.00105
    assert cost.output_usd == pytest.approx(500 * OUT)  # 0.0003
    assert cost.total_usd == pytest.approx(0.00135)
    assert cost.cache_saved_usd == pytest.approx(6_000 * (IN - CACHED))  # 0.00045
    # history = 8,000 prompt tokens, 6,000 of them cached: 2,000 at the full price + 6,000 at the cached price
    assert cost.history_usd == pytest.approx(2_000 * IN + 6_000 * CACHED)  # 0.00075
    assert cost.estimate and "genai-prices" in cost.source


def test_a_cached_prefix_longer_than_the_history_reaches_into_the_new_turn() -> None:
    cost = price_reply(TokenUsage(1_000, 900, 0, 600), "gpt-4o-mini", "openai")
    assert cost.history_usd == pytest.approx(600 * CACHED)
    assert cost.input_usd == pytest.approx(100 * IN + 900 * CACHED)


def test_conversation_sums() -> None:
    ledger = ConversationCost()
    ledger.add(price_reply(TokenUsage(100, 0, 50, 0), "gpt-4o-mini", "openai"))
    ledger.add(price_reply(TokenUsage(300, 0, 50, 150), "gpt-4o-mini", "openai"))
    assert ledger.replies == 2 and ledger.prompt_tokens == 400 and ledger.history_tokens == 150
    assert ledger.total_usd == pytest.approx(400 * IN + 100 * OUT)
    assert ledger.history_usd == pytest.approx(150 * IN)
    assert ledger.to_dict()["estimate"] is True


def test_a_local_reply_priced_as_a_hosted_model_says_so() -> None:
    cost = price_reply(TokenUsage(1_000_000, 0, 1_000_000), "gpt-4o-mini", "openai", hypothetical=True)
    assert cost.total_usd == pytest.approx(0.75) and cost.hypothetical
    assert format_cost(cost.to_dict()).startswith("would cost ~$0.7500 on openai/gpt-4o-mini (estimate)")


def test_unknown_models_and_unpriced_engines() -> None:
    with pytest.raises(pricing.PriceUnknownError, match="No price for openai/no-such-model in the genai-prices"):
        price_reply(TokenUsage(1, 0, 1), "no-such-model", "openai")
    assert pricing.try_price_reply(TokenUsage(1, 0, 1), "no-such-model", "openai") is None
    assert pricing.try_price_reply(TokenUsage(1, 0, 1), "gpt-4o-mini", None) is None


def test_pricing_never_touches_the_network() -> None:
    """Import and price in a fresh interpreter where opening any socket fails."""
    script = (
        "import socket\n"
        "def refuse(*a, **k): raise RuntimeError('network used')\n"
        "socket.socket.connect = refuse; socket.create_connection = refuse; socket.getaddrinfo = refuse\n"
        "from app.core.engines.remote.pricing import price_reply, TokenUsage\n"
        "print(price_reply(TokenUsage(1000, 0, 10), 'gpt-4o-mini', 'openai').total_usd)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert float(result.stdout) == pytest.approx(1000 * IN + 10 * OUT)


def test_a_local_replys_stats_priced_on_a_chosen_hosted_model() -> None:
    from app.core.chat.events import ReplyStats

    stats = ReplyStats(0.1, 2_000, 1_500, 1.0, 1.0, 100, 0.1, 1.0, 0, "cpu")
    priced = pricing.price_local_reply(stats, "gpt-4o-mini", "openai", history_tokens=1_800)
    assert priced.cost is not None and priced.cost["hypothetical"] is True
    assert priced.cost["total_usd"] == pytest.approx(500 * IN + 1_500 * CACHED + 100 * OUT)
    assert priced.generated_tokens == 100 and stats.cost is None  # a copy; the original is untouched
    assert pricing.price_local_reply(stats, "no-such-model", "openai") is stats
