"""The KV caches a local backend keeps: one per conversation (only the most recent ones), and for requests that name
no conversation (API clients) a pool that reuses the one sharing the longest prefix. Torch-free: the torch backend
and the torch-free one keep their caches alike.

Every OpenAI-style client resends the whole conversation each turn. The pool keeps a few caches, each holding the
exact token ids it was built from; a new prompt takes the cache whose ids share the longest prefix with it (its
turns so far), or a fresh one. Least recently used caches are dropped first; the count is bounded by memory:
a cache can grow to the whole context window, so `budget_bytes // (kv bytes per token x context window)`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from app.core.engines.generation import KVCache

KV = TypeVar("KV", bound=KVCache)

# Only the active conversation keeps its KV cache: the memory panel then shows every byte the caches hold.
# Switching conversations prefills the other one again.
MAX_KEPT_CACHES = 1
# Requests that name no conversation (API clients) share a pool of caches matched by prefix, sized to this share of
# the memory free when the model loaded.
POOL_MEMORY_SHARE = 0.25
MAX_POOLED = 8  # beyond this, a linear scan of the prefixes stops being free and the gain is small


def shared_prefix(a: list[int], b: list[int]) -> int:
    limit = min(len(a), len(b))
    common = 0
    while common < limit and a[common] == b[common]:
        common += 1
    return common


def pool_size(budget_bytes: int, kv_bytes_per_token: int, context_window: int) -> int:
    """How many full-window caches fit in the budget (at least 1, at most MAX_POOLED)."""
    per_cache = kv_bytes_per_token * max(context_window, 1)
    if per_cache <= 0:
        return 1
    return max(1, min(MAX_POOLED, budget_bytes // per_cache))


def tokens_each(budget_bytes: int, kv_bytes_per_token: int, replies: int, context_window: int) -> int:
    """How long each of `replies` served replies may be (prompt plus reply) when their KV caches share the budget:
    at most the context window."""
    return min(context_window, budget_bytes // (max(replies, 1) * max(kv_bytes_per_token, 1)))


def served_split(
    most: int, asked: int, budget_bytes: int, kv_bytes_per_token: int, context_window: int
) -> tuple[int, int | None]:
    """`asked` served replies at once on a runtime that decodes up to `most` together: how many run together, and how
    long each may be within the KV budget they share (None where they have no budget of their own). What the Server
    tab says of a loaded model and the Memory tab of a plan."""
    together = max(1, min(asked, most))
    if budget_bytes <= 0 or kv_bytes_per_token <= 0:
        return together, None
    return together, tokens_each(budget_bytes, kv_bytes_per_token, together, context_window)


class ConversationCaches(Generic[KV]):
    """The caches of the last MAX_KEPT_CACHES conversations used, by conversation id."""

    def __init__(self, new_kv: Callable[[], KV]) -> None:
        self.new_kv = new_kv
        self._caches: dict[int, KV] = {}  # most recently used last

    def take(self, conversation_id: int) -> KV:
        kv = self._caches.pop(conversation_id, None) or self.new_kv()
        self._caches[conversation_id] = kv
        while len(self._caches) > MAX_KEPT_CACHES:
            self._caches.pop(next(iter(self._caches))).reset()
        return kv

    def forget(self, conversation_id: int) -> None:
        kv = self._caches.pop(conversation_id, None)
        if kv is not None:
            kv.reset()

    def values(self) -> Iterator[KV]:
        return iter(list(self._caches.values()))

    def clear(self) -> None:
        for kv in self._caches.values():
            kv.reset()
        self._caches.clear()


class PrefixKVPool(Generic[KV]):
    def __init__(self, max_caches: int, new_kv: Callable[[], KV]) -> None:
        self.max_caches = max(1, max_caches)
        self.new_kv = new_kv
        self._caches: list[KV] = []  # least recently used first
        self._held: list[KV] = []  # caches a running reply writes (batched replies run side by side)

    def take(self, prompt_ids: list[int], *, hold: bool = False) -> KV:
        """The cache to generate `prompt_ids` on top of (the engine crops it to the shared prefix).

        A cache the prompt merely extends (the same client's next turn) is taken as is. A cache that shares only
        part of its tokens (another client with the same system prompt) would lose its tail to the crop, so while
        the pool has room the prompt gets a fresh cache instead; a full pool crops the best partial match. A held
        cache (`hold`, until `release`) is never given to another reply nor dropped."""
        extended: KV | None = None
        partial: KV | None = None
        extended_len = partial_len = 0
        for kv in self._caches:
            if self._is_held(kv):
                continue
            common = shared_prefix(kv.ids, prompt_ids)
            if common == 0:
                continue
            if common == len(kv.ids) or common >= len(prompt_ids) - 1:  # an extension, or the same prompt again
                if common > extended_len:
                    extended, extended_len = kv, common
            elif common > partial_len:
                partial, partial_len = kv, common
        best = extended
        if best is None and len(self._caches) >= self.max_caches:
            best = partial
        if best is None:
            best = self.new_kv()
            self._trim(self.max_caches - 1)  # full: the least recently used free one makes room
        else:
            self._caches.remove(best)
        self._caches.append(best)
        if hold:
            self._held.append(best)
        return best

    def release(self, kv: KV) -> None:
        """A held cache's reply is over: it may be reused (or dropped, if the pool grew past its size meanwhile)."""
        self._held = [held for held in self._held if held is not kv]
        self._trim(self.max_caches)

    @property
    def in_use(self) -> int:
        """Caches held by running replies."""
        return len(self._held)

    def _is_held(self, kv: KV) -> bool:
        return any(held is kv for held in self._held)

    def _trim(self, keep: int) -> None:
        """Drop the least recently used free caches until at most `keep` remain (held ones always stay)."""
        for kv in list(self._caches):
            if len(self._caches) <= keep:
                return
            if not self._is_held(kv):
                self._caches.remove(kv)
                kv.reset()

    def states(self) -> list[KV]:
        return list(self._caches)

    def nbytes(self) -> int:
        return sum(kv.nbytes() for kv in self._caches)

    def clear(self) -> None:
        for kv in self._caches:
            kv.reset()
        self._caches.clear()
        self._held.clear()
