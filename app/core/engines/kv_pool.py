"""KV caches for requests that name no conversation (API clients): reuse the one sharing the longest prefix.

Every OpenAI-style client resends the whole conversation each turn. The pool keeps a few caches, each holding the
exact token ids it was built from; a new prompt takes the cache whose ids share the longest prefix with it (its
turns so far), or a fresh one. Least recently used caches are dropped first; the count is bounded by memory:
a cache can grow to the whole context window, so `budget_bytes // (kv bytes per token x context window)`.
"""

from __future__ import annotations

from app.core.engines.engine import KVState

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


class PrefixKVPool:
    def __init__(self, max_caches: int) -> None:
        self.max_caches = max(1, max_caches)
        self._caches: list[KVState] = []  # least recently used first

    def take(self, prompt_ids: list[int]) -> KVState:
        """The cache to generate `prompt_ids` on top of (the engine crops it to the shared prefix).

        A cache the prompt merely extends (the same client's next turn) is taken as is. A cache that shares only
        part of its tokens (another client with the same system prompt) would lose its tail to the crop, so while
        the pool has room the prompt gets a fresh cache instead; a full pool crops the best partial match."""
        extended: KVState | None = None
        partial: KVState | None = None
        extended_len = partial_len = 0
        for kv in self._caches:
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
            best = KVState()
            if len(self._caches) >= self.max_caches:  # full: the least recently used one makes room
                self._caches.pop(0).reset()
        else:
            self._caches.remove(best)
        self._caches.append(best)
        return best

    def states(self) -> list[KVState]:
        return list(self._caches)

    def nbytes(self) -> int:
        return sum(kv.nbytes() for kv in self._caches)

    def clear(self) -> None:
        for kv in self._caches:
            kv.reset()
        self._caches.clear()
