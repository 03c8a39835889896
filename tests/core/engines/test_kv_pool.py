"""The prefix pool's choices, on plain KVStates (the engine tests cover real caches)."""

from __future__ import annotations

from app.core.engines.engine import KVState
from app.core.engines.kv_pool import PrefixKVPool, pool_size, served_split, shared_prefix


def filled(ids: list[int]) -> KVState:
    kv = KVState()
    kv.ids = list(ids)
    return kv


def test_takes_the_cache_sharing_the_longest_prefix() -> None:
    pool = PrefixKVPool(3, KVState)
    first = pool.take([1, 2, 3])
    first.ids = [1, 2, 3, 9]
    second = pool.take([5, 6])
    assert second is not first  # nothing shared: a fresh cache
    second.ids = [5, 6, 7]
    assert pool.take([1, 2, 3, 9, 4]) is first
    assert pool.take([5, 6, 7, 8]) is second


def test_least_recently_used_is_dropped_when_full() -> None:
    pool = PrefixKVPool(2, KVState)
    a = pool.take([1])
    a.ids = [1, 1]
    b = pool.take([2])
    b.ids = [2, 2]
    pool.take([1, 1, 1])  # a is now the most recent
    c = pool.take([3])
    assert c is not a and c is not b
    assert [id(s) for s in pool.states()] == [id(a), id(c)]  # b, the least recent, went


def test_pool_size_is_bounded_by_memory() -> None:
    assert pool_size(100 * 2**20, 23_040, 8192) == 1  # one 180 MiB window does not fit twice in 100 MiB
    assert pool_size(2**30, 23_040, 2048) == 8  # capped
    assert pool_size(500 * 2**20, 23_040, 8192) == 2
    assert pool_size(2**30, 0, 2048) == 1
    assert shared_prefix([1, 2, 3], [1, 2, 4]) == 2


def test_a_shared_system_prompt_does_not_crop_another_clients_cache_while_there_is_room() -> None:
    pool = PrefixKVPool(2, KVState)
    alice = pool.take([7, 7, 1, 1])
    alice.ids = [7, 7, 1, 1, 5]
    bob = pool.take([7, 7, 2, 2])  # shares only the "system prompt" [7, 7]
    assert bob is not alice and alice.ids == [7, 7, 1, 1, 5]
    bob.ids = [7, 7, 2, 2, 6]
    carol = pool.take([7, 7, 3])  # full now: the best partial match is cropped by the engine
    assert carol is alice  # the least recently used of the two equal matches


def test_a_held_cache_is_never_given_to_another_reply_nor_dropped() -> None:
    pool = PrefixKVPool(2, KVState)
    running = pool.take([1, 2, 3], hold=True)
    running.ids = [1, 2, 3]
    other = pool.take([1, 2, 3, 4], hold=True)  # the same conversation again, while its first reply runs
    assert other is not running
    third = pool.take([9], hold=True)  # the pool is full of held caches: it grows rather than drop one
    assert len(pool.states()) == 3 and pool.in_use == 3
    pool.release(other)  # back to its size: the least recently used free cache goes
    assert [id(kv) for kv in pool.states()] == [id(running), id(third)]
    pool.release(running)
    pool.release(third)
    assert pool.in_use == 0
    assert pool.take([1, 2, 3, 4]) is running  # free again: the prompt that extends it takes it


def test_served_replies_split_the_budget_up_to_the_runtime_s_most() -> None:
    assert served_split(8, 3, 3 << 20, 1024, 8192) == (3, 1024)
    assert served_split(8, 12, 8 << 20, 1024, 512) == (8, 512)  # capped by the runtime, then by the window
    assert served_split(8, 4, 0, 1024, 8192) == (4, None)  # no budget of their own
