"""How a reply's numbers read: the one wording of the window's line under a reply, `hearth chat --stats` and the
Markdown export, and of a priced reply's cost.

It reads the stored form of the stats (ReplyStats.to_dict(), any field possibly missing in an old history), so it
needs nothing but the standard library and sits below every package that shows a reply (storage's export too).

A rate over one token or a few milliseconds is noise (a regenerate's one new prompt token once read "prefill 0
tok/s"), so a rate shows only where it measures at least RATE_MIN_TOKENS tokens over at least RATE_MIN_SECONDS.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

RATE_MIN_TOKENS = 4
RATE_MIN_SECONDS = 0.020

FINISH_LABELS: dict[str, str] = {
    "stop": "finished",
    "length": "stopped at the length limit",
    "cancelled": "stopped by you",
    "error": "failed",
    "interrupted": "interrupted: Hearth closed before this reply finished (continue or regenerate it)",
}

WINDOW_SEPARATOR = "  ·  "
SEPARATOR = " · "


def format_cost(cost: Mapping[str, Any], *, conversation_total: bool = True) -> str:
    """A priced reply in one line: `cost ~$0.0013 on openai/gpt-4o-mini (estimate) (re-sent history $0.0008, caching
    saved $0.0005)`. conversation_total=False leaves out the running total (the window and exports sum the history
    themselves; a backend's total restarts with each load)."""
    what = "would cost" if cost.get("hypothetical") else "cost"
    text = f"{what} ~${_number(cost.get('total_usd')):.4f} on {cost.get('provider')}/{cost.get('model')} (estimate)"
    extras = []
    if cost.get("history_usd"):
        extras.append(f"re-sent history ${_number(cost['history_usd']):.4f}")
    if cost.get("cache_saved_usd"):
        extras.append(f"caching saved ${_number(cost['cache_saved_usd']):.4f}")
    if conversation_total and cost.get("conversation_total_usd") is not None:
        extras.append(f"conversation ${_number(cost['conversation_total_usd']):.4f}")
    return text + (f" ({', '.join(extras)})" if extras else "")


def rate_text(tokens: int, seconds: float, rate: float, unit: str = "tok/s") -> str | None:
    """`rate` formatted, or None where it measures too few tokens or too short a time to mean anything."""
    if tokens < RATE_MIN_TOKENS or seconds < RATE_MIN_SECONDS or not math.isfinite(rate) or rate <= 0:
        return None
    return f"{rate:,.0f} {unit}" if rate >= 100 else f"{rate:.1f} {unit}"


def reply_stats_text(
    stats: Mapping[str, Any] | None,
    finish_reason: str | None = None,
    *,
    model: str | None = None,
    memory: bool = False,
    note: bool = False,
    conversation_total: bool = False,
    separator: str = SEPARATOR,
) -> str:
    """The line under a reply: time to first token, prompt tokens (cached / new), prefill and decode rates (where
    they mean something) with the decode path, tokens generated, then what the front end asks for: peak memory
    (memory=True), the model (model=), the cost when priced, why it stopped (finish_reason) and the decode path's
    note (note=True: the window shows it as a tooltip instead)."""
    parts: list[str] = []
    if stats:
        prompt = _whole(stats.get("prompt_tokens"))
        cached = _whole(stats.get("cached_tokens"))
        generated = _whole(stats.get("generated_tokens"))
        new = max(prompt - cached, 0)
        parts.append(f"first token {_number(stats.get('ttft_s')):.2f} s")
        parts.append(f"prompt {prompt:,} tok ({cached:,} cached / {new:,} new)")
        restored = _whole(stats.get("restored_tokens"))
        if restored:
            parts.append(f"restored {restored:,} tokens from disk in {_number(stats.get('restore_s')):.2f} s")
        if stats.get("from_response_cache"):
            parts.append("replayed from the response cache")
        else:
            prefill_rate = _number(stats.get("prefill_tokens_per_s"))
            prefill = rate_text(new, _seconds(stats.get("prefill_s"), new, prefill_rate), prefill_rate)
            if prefill:
                parts.append(f"prefill {prefill}")
            # The decode rate counts the tokens after the first (the first one ends the prefill).
            decode_rate = _number(stats.get("decode_tokens_per_s"))
            steps = max(generated - 1, 0)
            decode = rate_text(steps, _seconds(stats.get("decode_s"), steps, decode_rate), decode_rate)
            path = str(stats.get("decode_path") or "")
            if decode:
                parts.append(f"decode {decode} ({path})" if path else f"decode {decode}")
            elif path:
                parts.append(f"decode path {path}")
            proposed = _whole(stats.get("lookup_proposed"))
            if proposed:
                parts.append(f"lookup {_whole(stats.get('lookup_accepted')):,}/{proposed:,} guesses taken")
        parts.append(f"{generated:,} generated")
        if memory and _whole(stats.get("peak_memory_bytes")):
            parts.append(f"peak {_whole(stats['peak_memory_bytes']) / 2**20:,.0f} MiB ({stats.get('memory_device')})")
        if dropped := _whole(stats.get("dropped_turns")):
            parts.append(f"dropped {dropped} old message{'s' if dropped != 1 else ''} to fit")
    if model:
        parts.append(model)
    cost = (stats or {}).get("cost")
    if isinstance(cost, Mapping) and isinstance(cost.get("total_usd"), int | float):
        parts.append(format_cost(cost, conversation_total=conversation_total))
    if finish_reason:
        parts.append(FINISH_LABELS.get(finish_reason, finish_reason))
    if note and (why := reply_note(stats, separator)):
        parts.append(why)
    return separator.join(parts)


def reply_note(stats: Mapping[str, Any] | None, separator: str = SEPARATOR) -> str:
    """How the reply ran, in words: the decode path's note and whether prompt lookup was on (the window's tooltip,
    the end of `hearth chat --stats`)."""
    if not stats:
        return ""
    parts = [str(stats["decode_path_note"])] if stats.get("decode_path_note") else []
    if isinstance(stats.get("lookup"), str) and stats["lookup"]:
        parts.append(f"prompt lookup {stats['lookup']}")
    return separator.join(parts)


def _number(value: Any) -> float:
    """A stored float, or 0.0 where it is missing or not a finite number (a hand-edited or older history)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return 0.0
    return float(value)


def _whole(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _seconds(stored: Any, tokens: int, rate: float) -> float:
    """The time a rate was measured over: stored, or worked back from the rate where an older record lacks it."""
    if isinstance(stored, int | float) and not isinstance(stored, bool) and math.isfinite(stored):
        return float(stored)
    return tokens / rate if rate > 0 else 0.0
