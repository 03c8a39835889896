"""The prompt cache on disk (app.core.engines.lite.prefix_store): a restored prefix gives the bits a cold prefill
gives; another model, tokenizer or template never loads a block; damaged, hand-made or linked files are moved aside and
said once; a full disk, two writers of one block and a failed restore lose nothing."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.core.engines.lite import prefix_store
from app.core.engines.lite.gguf_model import open_gguf_model
from app.core.engines.lite.prefix_store import (
    BLOCK_TOKENS,
    CacheShape,
    PrefixCache,
    PrefixStore,
    block_keys,
    identity_digest,
)
from app.core.fastpath import blocks
from app.core.stats_text import reply_stats_text
from app.core.storage import staging
from tests.core.engines.lite.test_gguf_model import tiny_gguf
from tests.helpers.kernel_cache import seed_kernel
from tests.helpers.killed_process import killed_mid_write

IDS = [int(i) for i in np.random.default_rng(3).integers(3, 400, size=512)]  # the tiny model's whole context


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Any:
    loaded = open_gguf_model(tiny_gguf(tmp_path_factory.mktemp("model") / "tiny.gguf", blocks.Q4_K, v_down=blocks.Q6_K))
    yield loaded
    loaded.close()


def store_for(model: Any, folder: Path, identity: bytes = b"i" * 32, budget: int = 1 << 30) -> PrefixStore:
    shape = CacheShape(model.config.layers, model.config.kv_heads, model.config.head_dim)
    return PrefixStore(folder, identity, shape, budget)


def saved(model: Any, store: PrefixStore, ids: list[int]) -> PrefixCache:
    """A prefix cache over `store` holding the whole blocks of `ids`, as a reply's prefill leaves them."""
    cache = model.new_cache()
    model.prefill(ids, cache)
    prefixes = PrefixCache(store)
    prefixes.save_later(ids, cache)
    prefixes.flush()
    return prefixes


def test_a_restored_prefix_gives_the_bits_of_a_cold_prefill(model: Any, tmp_path: Path) -> None:
    prefixes = saved(model, store_for(model, tmp_path), IDS[:400])  # one whole block on disk
    cold = model.prefill(IDS, model.new_cache())
    cache = model.new_cache()
    assert prefixes.restore(IDS, cache, 0) == BLOCK_TOKENS
    warm = model.prefill(IDS[BLOCK_TOKENS:], cache)
    assert np.array_equal(cold, warm)
    assert cache.ids == IDS and cache.length == len(IDS)


def test_the_last_prompt_token_is_always_computed(model: Any, tmp_path: Path) -> None:
    ids = IDS[: 2 * BLOCK_TOKENS]
    prefixes = saved(model, store_for(model, tmp_path), ids)  # both blocks saved
    assert len(list(tmp_path.glob("*.kvb"))) == 2
    assert prefixes.restore(ids, model.new_cache(), 0) == BLOCK_TOKENS  # the second block holds the last token


@pytest.mark.parametrize("changed", ["weights_sha256", "tokenizer", "chat_template", "kv", "numerics"])
def test_another_model_tokenizer_or_template_never_loads_a_block(changed: str, model: Any, tmp_path: Path) -> None:
    parts = {name: name for name in ("weights_sha256", "tokenizer", "chat_template", "kv", "numerics")}
    saved(model, store_for(model, tmp_path, identity_digest(parts)), IDS)
    other = store_for(model, tmp_path, identity_digest({**parts, changed: "something else"}))
    assert other.available(IDS) == 0
    assert PrefixCache(other).restore(IDS, model.new_cache(), 0) == 0


def damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "bit flipped":
        data[-100] ^= 0x10
        path.write_bytes(bytes(data))
    elif how == "hand-made":
        path.write_text(json.dumps({"not": "a block"}))
    elif how == "other tokens":
        offset = prefix_store.HEADER.size
        data[offset : offset + 4] = (123456).to_bytes(4, "little")
        path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["truncated", "bit flipped", "hand-made", "other tokens"])
def test_a_damaged_block_is_moved_aside_said_once_and_recomputed(how: str, model: Any, tmp_path: Path) -> None:
    store = store_for(model, tmp_path)
    prefixes = saved(model, store, IDS)
    first = store.path_of(block_keys(store.identity, IDS, 1)[0])
    damage(first, how)
    live = model.new_cache()
    assert prefixes.restore(IDS, live, 0) == 0 and live.length == 0
    assert (tmp_path / "damaged" / first.name).is_file() and not first.exists()
    notices = store.take_notices()
    assert len(notices) == 1 and "was damaged" in notices[0] and "moved aside" in notices[0]
    assert prefixes.restore(IDS, live, 0) == 0 and store.take_notices() == []  # said once


def test_a_link_is_never_followed(model: Any, tmp_path: Path) -> None:
    store = store_for(model, tmp_path)
    prefixes = saved(model, store, IDS)
    first = store.path_of(block_keys(store.identity, IDS, 1)[0])
    target = tmp_path / "elsewhere.kvb"
    first.rename(target)
    first.symlink_to(target)
    assert prefixes.restore(IDS, model.new_cache(), 0) == 0
    assert not first.exists() and target.is_file()  # the link moved aside, its target untouched
    assert "could not be read" in store.take_notices()[0]


def test_a_failed_restore_leaves_the_live_cache_as_it_was(model: Any, tmp_path: Path) -> None:
    store = store_for(model, tmp_path)
    prefixes = saved(model, store, IDS)
    damage(store.path_of(block_keys(store.identity, IDS, 1)[0]), "bit flipped")
    live = model.new_cache()
    model.prefill(IDS[:100], live)
    keys_before = [slab[:, :100].copy() for slab in live.keys]
    assert prefixes.restore(IDS, live, 100) == 100
    assert live.length == 100 and live.ids == IDS[:100]
    assert all(np.array_equal(slab[:, :100], before) for slab, before in zip(live.keys, keys_before, strict=True))


def test_a_full_disk_loses_nothing_and_says_so(model: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(descriptor: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(prefix_store.os, "fsync", full)
    store = store_for(model, tmp_path)
    saved(model, store, IDS)
    assert list(tmp_path.iterdir()) == []  # no block, no partial file
    notices = store.take_notices()
    assert len(notices) == 1 and "the disk is full" in notices[0] and "bytes free" in notices[0]


def test_two_writers_of_one_block_leave_one_whole_block(model: Any, tmp_path: Path) -> None:
    store = store_for(model, tmp_path)
    cache = model.new_cache()
    model.prefill(IDS[:300], cache)
    key = block_keys(store.identity, IDS, 1)[0]
    payload = np.stack(
        [np.stack([s[:, :BLOCK_TOKENS] for s in cache.keys]), np.stack([s[:, :BLOCK_TOKENS] for s in cache.values])]
    )
    writers = [threading.Thread(target=store.write_block, args=(key, 0, IDS, payload)) for _ in range(4)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    assert [path.name for path in tmp_path.iterdir()] == [store.path_of(key).name]
    assert store.read_block(key, 0, IDS) is not None


KILLED_WRITER = """
import os, sys, time
from pathlib import Path
import numpy as np
from app.core.engines.lite.prefix_store import BLOCK_TOKENS, CacheShape, PrefixStore
folder = Path(sys.argv[1])
def stall(descriptor):  # the block written, not yet synced or renamed: where kill -9 finds it
    print(*sorted(folder.glob("*.partial")), flush=True)
    time.sleep(600)
os.fsync = stall
store = PrefixStore(folder, bytes(32), CacheShape(layers=30, kv_heads=3, head_dim=64), 1 << 30)
payload = np.zeros((2, 30, 3, BLOCK_TOKENS, 64), dtype=np.uint16)  # a default-model block: 5.6 MiB
store.write_block(bytes(32), 0, list(range(BLOCK_TOKENS)), payload)
"""


def test_a_block_a_killed_process_was_writing_is_swept_at_the_next_start(isolated_cache: Path) -> None:
    """A prompt-cache block is megabytes: one a process was writing when it was killed is named for that process and
    removed by the next start's sweep (app.core.storage.staging), a whole block beside it kept."""
    folder = isolated_cache / "prompt-cache"
    folder.mkdir(parents=True)
    kept = folder / "whole.kvb"
    kept.write_bytes(b"a block written in full")
    (partial,) = killed_mid_write(KILLED_WRITER, str(folder))
    assert partial.stat().st_size > 5 << 20  # kill -9: nothing of its own cleaned up
    (leftover,) = staging.find_leftovers()
    assert leftover.path == partial and "has ended" in leftover.why
    assert staging.sweep() == [leftover]
    assert sorted(path.name for path in folder.iterdir()) == ["whole.kvb"]


def test_the_least_recently_used_blocks_go_first(model: Any, tmp_path: Path) -> None:
    store = store_for(model, tmp_path)
    saved(model, store, IDS)
    first, second = (store.path_of(key) for key in block_keys(store.identity, IDS, 2))
    os.utime(first, ns=(1, 1))  # long unused
    store.budget_bytes = second.stat().st_size  # room for one block
    store.evict()
    assert not first.exists() and second.exists()


def test_the_stats_line_says_what_came_from_disk() -> None:
    stats = {"ttft_s": 0.4, "prompt_tokens": 7200, "cached_tokens": 7168, "restored_tokens": 7168, "restore_s": 0.05}
    assert "restored 7,168 tokens from disk in 0.05 s" in reply_stats_text(stats)
    assert "from disk" not in reply_stats_text({**stats, "restored_tokens": 0})


def test_a_new_process_asks_about_the_same_document_without_prefilling_it_again(tmp_path: Path) -> None:
    """The default model, a 1.3k-token document, two processes: the second restores every whole block of the prompt
    (all but its last position, in BLOCK_TOKENS blocks) and gives the same greedy reply."""
    script = (
        "import json, sys, threading, time\n"
        "from app.core.engines.backend import LoadRequest, ReplyRequest\n"
        "from app.core.engines.opening import open_backend\n"
        "from app.core.chat.events import ChatMessage, StatsEvent, TokenEvent\n"
        "from app.core.chat.sampling import SamplingParams\n"
        "backend = open_backend(LoadRequest(None, device='cpu', response_cache=False))\n"
        "while backend.engine.prefixes is None: time.sleep(0.05)\n"
        "doc = 'The river town kept its records in a stone house by the bridge. ' * 90\n"
        "request = ReplyRequest([ChatMessage('user', doc + 'Where were the records kept?')],"
        " SamplingParams(temperature=0, max_new_tokens=12))\n"
        "events = list(backend.generate(request, threading.Event()))\n"
        "stats = next(e for e in events if isinstance(e, StatsEvent)).stats\n"
        "backend.engine.prefixes.flush()\n"
        "text = ''.join(e.text for e in events if isinstance(e, TokenEvent))\n"
        "print(json.dumps([text, stats.prompt_tokens, stats.cached_tokens, stats.restored_tokens]))\n"
    )
    seed_kernel(tmp_path / "cache")  # this run's compiled kernel: neither process compiles its own
    environment = {**os.environ, "HEARTH_CACHE_DIR": str(tmp_path / "cache")}
    runs = []
    for _ in range(2):
        result = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=600, check=False, env=environment,
            cwd=Path(__file__).resolve().parents[4],
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        runs.append(json.loads(result.stdout.strip().splitlines()[-1]))
    (cold_text, prompt, cold_cached, cold_restored), (warm_text, _, warm_cached, warm_restored) = runs
    assert cold_cached == cold_restored == 0
    assert prompt > 4 * BLOCK_TOKENS
    assert warm_restored == warm_cached == (prompt - 1) // BLOCK_TOKENS * BLOCK_TOKENS
    assert warm_text == cold_text
