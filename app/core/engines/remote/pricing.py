"""What a reply and a conversation cost, estimated from genai-prices' bundled price list (never fetched).

A prompt is split three ways: new tokens at the input price, cached tokens at the provider's cache-read price
(what prompt caching saved is the difference), and the part that re-sent earlier turns ("history"). genai-prices
can refresh its prices over the network, but only through `UpdatePrices`, which Hearth never starts: importing it
and calling `calc_price` read the snapshot shipped in the wheel. Prices are estimates and say so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from decimal import Decimal
from importlib.metadata import PackageNotFoundError, version
from typing import Any


def _price_list() -> str:
    try:
        return f"genai-prices {version('genai-prices')} bundled price list"
    except PackageNotFoundError:  # a bundle built without the package's metadata: the prices are still there
        return "genai-prices bundled price list"


@dataclass(frozen=True)
class TokenUsage:
    prompt_tokens: int  # every prompt token, cached ones included
    cached_tokens: int = 0  # prompt tokens the server read from its prefix cache
    completion_tokens: int = 0
    history_tokens: int = 0  # prompt tokens that re-sent the system prompt and earlier turns, not the new turn


@dataclass(frozen=True)
class ReplyCost:
    """One reply's cost in US dollars. `to_dict` is what `--json` stats carry as `cost`."""

    model: str
    provider: str
    input_usd: float  # the whole prompt: new tokens and cached tokens
    output_usd: float
    total_usd: float
    history_usd: float  # the part of input_usd spent re-sending earlier turns
    cache_saved_usd: float  # what the cached tokens would have cost at the full input price, minus what they cost
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    history_tokens: int
    hypothetical: bool = False  # a local reply, priced as if the same tokens had gone to this hosted model
    estimate: bool = True
    source: str = field(default_factory=_price_list)
    conversation_total_usd: float | None = None  # the conversation so far, this reply included

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class PriceUnknownError(LookupError):
    pass


def _calc(model: str, provider: str, input_tokens: int, cached: int, output: int) -> tuple[Decimal, Decimal]:
    import genai_prices

    try:
        result = genai_prices.calc_price(
            genai_prices.Usage(input_tokens=input_tokens, cache_read_tokens=cached, output_tokens=output),
            model,
            provider_id=provider,
        )
    except LookupError as exc:
        raise PriceUnknownError(f"No price for {provider}/{model} in the {_price_list()} ({exc}).") from None
    return result.input_price, result.output_price


def price_reply(usage: TokenUsage, model: str, provider: str, *, hypothetical: bool = False) -> ReplyCost:
    """The reply's cost; raises PriceUnknownError for a model the price list does not know."""
    prompt, output = usage.prompt_tokens, usage.completion_tokens
    cached = min(usage.cached_tokens, prompt)
    history = min(usage.history_tokens, prompt)
    input_usd, output_usd = _calc(model, provider, prompt, cached, output)
    uncached_input, _ = _calc(model, provider, prompt, 0, 0)
    # Both the cached prefix and the history are prefixes of the prompt: the new turn holds whatever of the
    # cached prefix reaches past the history.
    without_history, _ = _calc(model, provider, prompt - history, max(cached - history, 0), 0)
    return ReplyCost(
        model=model,
        provider=provider,
        input_usd=float(input_usd),
        output_usd=float(output_usd),
        total_usd=float(input_usd + output_usd),
        history_usd=float(input_usd - without_history),
        cache_saved_usd=float(uncached_input - input_usd),
        prompt_tokens=prompt,
        cached_tokens=cached,
        completion_tokens=output,
        history_tokens=history,
        hypothetical=hypothetical,
    )


def try_price_reply(usage: TokenUsage, model: str, provider: str | None, **kwargs: Any) -> ReplyCost | None:
    """price_reply, or None for an unpriced engine or a model the price list does not know."""
    if provider is None:
        return None
    try:
        return price_reply(usage, model, provider, **kwargs)
    except PriceUnknownError:
        return None


@dataclass
class ConversationCost:
    """The running sums for one conversation."""

    replies: int = 0
    total_usd: float = 0.0
    input_usd: float = 0.0
    output_usd: float = 0.0
    history_usd: float = 0.0
    cache_saved_usd: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    history_tokens: int = 0

    def add(self, cost: ReplyCost) -> None:
        self.replies += 1
        self.total_usd += cost.total_usd
        self.input_usd += cost.input_usd
        self.output_usd += cost.output_usd
        self.history_usd += cost.history_usd
        self.cache_saved_usd += cost.cache_saved_usd
        self.prompt_tokens += cost.prompt_tokens
        self.cached_tokens += cost.cached_tokens
        self.completion_tokens += cost.completion_tokens
        self.history_tokens += cost.history_tokens

    def add_dict(self, cost: Mapping[str, Any]) -> None:
        """A stored reply's cost (ReplyCost.to_dict, as history keeps it in the reply's stats)."""
        self.replies += 1
        for item in fields(self):
            if item.name != "replies":
                setattr(
                    self, item.name, getattr(self, item.name) + type(getattr(self, item.name))(cost.get(item.name) or 0)
                )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "estimate": True, "source": _price_list()}


def conversation_costs(stats: Iterable[Mapping[str, Any]]) -> tuple[ConversationCost, ConversationCost]:
    """Replies' stats summed into (what was spent on hosted engines, what the local replies would have cost on
    the hosted model they were compared with); replies without a cost are left out."""
    spent, compared = ConversationCost(), ConversationCost()
    for reply in stats:
        cost = reply.get("cost")
        if isinstance(cost, Mapping):
            (compared if cost.get("hypothetical") else spent).add_dict(cost)
    return spent, compared


def price_local_reply(stats: Any, model: str, provider: str, history_tokens: int = 0) -> Any:
    """A local reply's ReplyStats with `cost` set to what the same tokens would have cost on a hosted model
    (hypothetical=True), or unchanged when the price list does not know the model. The local engine's prefix
    cache stands in for the provider's prompt cache."""
    from dataclasses import replace

    usage = TokenUsage(stats.prompt_tokens, stats.cached_tokens, stats.generated_tokens, history_tokens)
    cost = try_price_reply(usage, model, provider, hypothetical=True)
    return stats if cost is None else replace(stats, cost=cost.to_dict())


COMPARE_CHOICES: tuple[str, ...] = (
    "openai/gpt-4o-mini",
    "openai/gpt-4.1-mini",
    "openai/gpt-4o",
    "openai/gpt-5-mini",
    "anthropic/claude-haiku-4-5",
    "anthropic/claude-sonnet-4-5",
)  # offered in the settings dialog; any "provider/model" the price list knows works


def compare_local_reply(stats: Any, compare_with: str | None, history_tokens: int = 0) -> Any:
    """A local reply's ReplyStats priced as if on `compare_with` ("provider/model"; None = off). Replies that
    already carry a cost (a hosted engine's) and remote replies are left as they are."""
    if not compare_with or stats.cost is not None or stats.memory_device == "remote":
        return stats
    provider, _, model = compare_with.partition("/")
    return price_local_reply(stats, model, provider, history_tokens)


def unpriced_comparison(compare_with: str) -> str:
    """Why a local reply shows no comparison: the price list does not know the chosen model."""
    return (
        f"No price for {compare_with} in the {_price_list()}, so local replies are not compared with it; "
        "choose another model in Settings (provider/model, e.g. openai/gpt-4o-mini)."
    )
