"""Fault suite, core: each kind of file Hearth owns, damaged by random bytes, truncation and same-size byte flips.

User data (history, settings) is never modified; derived data (response cache, a GGUF's tokenizer copy) is moved to
a `.damaged` name and rebuilt with a notice; a damaged entry is never replayed into a reply.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from app.core.chat.events import ChatMessage, DoneEvent, StatsEvent
from app.core.chat.response_cache import CachedReply, ResponseCache
from app.core.chat.sampling import SamplingParams
from app.core.engines.backend import ReplyRequest
from app.core.engines.engine import Engine
from app.core.settings import Settings, read_settings, settings_path
from app.core.storage.history import HistoryDamagedError, HistoryStore
from tests.helpers.damage import SETTINGS_FAULTS, flipped, history_with_conversations, random_bytes, truncated

GREEDY = SamplingParams(temperature=0, max_new_tokens=6)


# -- settings.json (user data) -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("case", "data", "names"), SETTINGS_FAULTS, ids=[case for case, _, _ in SETTINGS_FAULTS])
def test_a_damaged_settings_file_keeps_the_opt_ins_off_and_the_file_untouched(
    case: str, data: bytes, names: str
) -> None:
    path = settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    found = read_settings()
    assert not found.ok and names in found.error_line() and str(path) in found.error_line()
    assert found.settings.allow_pickle is False and found.settings.trust_remote_code is False
    assert path.read_bytes() == data


def test_only_a_json_true_switches_an_opt_in_on() -> None:
    path = settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    for value in ('"true"', '"false"', "1", "0", '"yes"', "null", "[true]", '{"on": true}'):
        path.write_text(f'{{"trust_remote_code": {value}, "allow_pickle": {value}}}')
        found = read_settings()
        assert found.settings.trust_remote_code is False and found.settings.allow_pickle is False, value
        assert len(found.problems) == 2
    path.write_text('{"trust_remote_code": true, "allow_pickle": true}')
    assert read_settings().settings.trust_remote_code is True and read_settings().settings.allow_pickle is True


def test_one_bad_value_costs_only_itself() -> None:
    path = settings_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"theme": "dark", "context_length": "abc", "sampling": {"top_p": 2, "top_k": 7}}))
    found = read_settings()
    assert found.settings.theme == "dark" and found.settings.sampling.top_k == 7
    assert found.settings.context_length is None and found.settings.sampling.top_p == Settings().sampling.top_p
    assert [line.split(" must")[0] for line in found.problems] == ["context_length", "sampling.top_p"]


def test_a_safety_opt_in_that_reads_false_never_runs_model_code(tmp_path: Path) -> None:
    """The reported hole: {"trust_remote_code": "false"} ran a model folder's own Python code."""
    from app.core.engines.loader import load_model
    from app.core.errors import UnsafeModelError

    marker = tmp_path / "code-ran"
    folder = tmp_path / "custom-code-model"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({"model_type": "evil", "auto_map": {"AutoModelForCausalLM": "modeling_evil.EvilModel"}})
    )
    (folder / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    (folder / "model.safetensors").write_bytes(b"")
    settings_path().parent.mkdir(parents=True, exist_ok=True)
    settings_path().write_text('{"trust_remote_code": "false", "allow_pickle": "false"}')
    settings = read_settings().settings
    with pytest.raises(UnsafeModelError, match="--trust-remote-code"):
        load_model(str(folder), device="cpu", trust_remote_code=settings.trust_remote_code)
    assert not marker.exists()


# -- history.sqlite (user data) ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("case", "damage"),
    [
        ("random bytes", lambda data: random_bytes(len(data))),
        ("cut to 8 KiB", lambda data: truncated(data, 8192)),
        ("header page size flipped", lambda data: flipped(data, 16, 2)),
    ],
)
def test_a_damaged_history_is_refused_untouched_and_can_be_moved_aside(tmp_path: Path, case: str, damage: Any) -> None:
    path = tmp_path / "history.sqlite"
    original = history_with_conversations(path)
    damaged = damage(original)
    path.write_bytes(damaged)
    with pytest.raises(HistoryDamagedError, match=str(path)):
        store = HistoryStore(path)
        store.list_conversations()
    assert path.read_bytes() == damaged
    moved = HistoryStore.move_aside(path)
    assert not path.exists() and moved.read_bytes() == damaged and moved.name.startswith("history.sqlite.damaged-")


def test_a_flipped_byte_inside_a_message_shows_as_a_replacement_character(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    original = history_with_conversations(path, conversations=2)
    offset = original.index(b"message 2 of conversation 1")
    path.write_bytes(flipped(original, offset + 1, 1))  # 'e' ^ 0xFF: not UTF-8
    with HistoryStore(path) as store:
        texts = [m.content for c in store.list_conversations() for m in store.active_branch(c.id)]
    assert sum("m\ufffdssage 2 of conversation 1" in text for text in texts) == 1
    assert sum(text.startswith("message") for text in texts) == len(texts) - 1


def test_a_store_in_memory_carries_its_conversations_into_a_new_history(tmp_path: Path) -> None:
    path = tmp_path / "history.sqlite"
    memory = HistoryStore(path, in_memory=True)
    conversation = memory.create_conversation("Made while the file was damaged")
    memory.add_message(conversation.id, "user", "hello", None)
    assert not path.exists()
    memory.copy_into(path)
    with HistoryStore(path) as fresh:
        [saved] = fresh.list_conversations()
        assert saved.title == "Made while the file was damaged"
        assert [m.content for m in fresh.active_branch(saved.id)] == ["hello"]


# -- responses.sqlite (derived) ----------------------------------------------------------------------------------
def _filled_cache(path: Path) -> bytes:
    cache = ResponseCache(path)
    for number in range(40):
        cache.put(f"key-{number}", CachedReply([f"reply {number} "] * 20, "stop", 20))
    cache.close()
    for suffix in ("-wal", "-shm"):  # fold the WAL in, so the damage below hits the real pages
        path.with_name(path.name + suffix).unlink(missing_ok=True)
    return path.read_bytes()


@pytest.mark.parametrize(
    ("case", "damage"),
    [
        ("random bytes", lambda data: random_bytes(len(data))),
        ("truncated", lambda data: truncated(data, 3000)),
        ("header flipped", lambda data: flipped(data, 16, 2)),
    ],
)
def test_a_damaged_response_cache_is_quarantined_and_rebuilt(tmp_path: Path, case: str, damage: Any) -> None:
    path = tmp_path / "responses.sqlite"
    damaged = damage(_filled_cache(path))
    path.write_bytes(damaged)
    cache = ResponseCache(path)
    [notice] = cache.take_notices()
    assert str(path) in notice and "moved to responses.sqlite.damaged and rebuilt" in notice
    assert path.with_name("responses.sqlite.damaged").read_bytes() == damaged
    assert len(cache) == 0 and cache.get("key-1") is None
    cache.put("new", CachedReply(["works"], "stop", 1))
    assert cache.get("new") == CachedReply(["works"], "stop", 1)


def test_a_damaged_response_cache_beside_a_leftover_wal_is_still_found(tmp_path: Path) -> None:
    """A process that ended without closing leaves its WAL, which holds every page it wrote: the damaged main file
    must be found by its own header, not read through the WAL as if healthy."""
    path = tmp_path / "responses.sqlite"
    writer = ResponseCache(path)
    writer.put("key", CachedReply(["kept in the WAL"], "stop", 3))
    left = tmp_path / "left"
    left.mkdir()
    for part in tmp_path.glob("responses.sqlite*"):  # the files as a killed process leaves them
        shutil.copy(part, left / part.name)
    writer.close()
    damaged = left / "responses.sqlite"
    assert (left / "responses.sqlite-wal").stat().st_size > 0
    damaged.write_bytes(b"damaged again" * 100)
    cache = ResponseCache(damaged)
    [notice] = cache.take_notices()
    assert "was damaged (file is not a database)" in notice
    assert (left / "responses.sqlite.damaged").read_bytes() == b"damaged again" * 100
    assert (left / "responses.sqlite.damaged-wal").exists()
    assert len(cache) == 0 and cache.get("key") is None


class _MalformedConnection:
    """What SQLite raises once it reads a page damaged after the cache was opened."""

    in_transaction = False

    def __init__(self, real: sqlite3.Connection) -> None:
        self.real = real

    def execute(self, *args: object) -> None:
        raise sqlite3.DatabaseError("database disk image is malformed")

    def close(self) -> None:
        self.real.close()


@pytest.mark.parametrize("operation", ["get", "put", "len"])
def test_a_cache_damaged_while_open_is_rebuilt_not_raised(tmp_path: Path, operation: str) -> None:
    path = tmp_path / "responses.sqlite"
    size = len(_filled_cache(path))
    cache = ResponseCache(path)
    damaged = random_bytes(size)
    path.write_bytes(damaged)
    cache._db = _MalformedConnection(cache._db)  # type: ignore[assignment]
    if operation == "get":
        assert cache.get("key-2") is None
    elif operation == "put":
        cache.put("x", CachedReply(["x"], "stop", 1))  # skipped, not raised
    else:
        assert len(cache) == 0
    assert any("moved to responses.sqlite.damaged and rebuilt" in line for line in cache.take_notices())
    assert path.with_name("responses.sqlite.damaged").read_bytes() == damaged
    cache.put("b", CachedReply(["y"], "stop", 1))
    assert cache.get("b") == CachedReply(["y"], "stop", 1)


def test_a_tampered_cache_entry_is_dropped_not_replayed(tmp_path: Path) -> None:
    path = tmp_path / "responses.sqlite"
    cache = ResponseCache(path)
    cache.put("k", CachedReply(["The capital is Paris."], "stop", 5))
    with sqlite3.connect(path) as db:  # same length, other text: only the checksum can tell
        db.execute("UPDATE replies SET pieces = ? WHERE key = 'k'", (json.dumps(["The capital is Lyons."]),))
    assert cache.get("k") is None
    assert any("damaged entry" in line for line in cache.take_notices())
    assert len(cache) == 0


def test_replies_from_other_weights_are_never_replayed(default_loaded: Any, tmp_path: Path) -> None:
    cache = ResponseCache(tmp_path / "responses.sqlite")
    messages = [ChatMessage("user", "Name a colour.")]
    engine = Engine(default_loaded, response_cache=cache)

    def stats(events: list[Any]) -> Any:
        return next(e.stats for e in events if isinstance(e, StatsEvent))

    first = list(engine.generate(ReplyRequest(messages, GREEDY)))
    assert stats(list(engine.generate(ReplyRequest(messages, GREEDY)))).from_response_cache
    changed = dataclasses.replace(default_loaded, weights_fingerprint="rewritten-file")
    other = Engine(changed, response_cache=cache)
    again = list(other.generate(ReplyRequest(messages, GREEDY)))
    assert not stats(again).from_response_cache
    assert again[-1].text == first[-1].text  # same weights really: only the key differs


def test_a_tampered_entry_is_regenerated_through_the_engine_with_a_notice(default_loaded: Any, tmp_path: Path) -> None:
    path = tmp_path / "responses.sqlite"
    cache = ResponseCache(path)
    engine = Engine(default_loaded, response_cache=cache)
    messages = [ChatMessage("user", "Say hello.")]
    clean = list(engine.generate(ReplyRequest(messages, GREEDY)))[-1]
    with sqlite3.connect(path) as db:
        db.execute("UPDATE replies SET pieces = ?", (json.dumps(["garbage"]),))
    events = list(engine.generate(ReplyRequest(messages, GREEDY)))
    done = events[-1]
    assert isinstance(done, DoneEvent) and done.text == clean.text
    assert not next(e.stats for e in events if isinstance(e, StatsEvent)).from_response_cache
    assert any("damaged entry" in line for line in done.notices)


# -- the tokenizer copy of a GGUF (derived) ---------------------------------------------------------------------
def test_a_damaged_tokenizer_copy_is_moved_aside_and_written_again(isolated_cache: Path) -> None:
    from tokenizers import Tokenizer

    from app.core.models.gguf_tokenizer import gguf_tokenizer_file, load_gguf_tokenizer
    from app.core.models.model_source import default_model_gguf

    gguf = default_model_gguf()
    tokenizer = load_gguf_tokenizer(gguf)
    path = gguf_tokenizer_file(gguf, tokenizer)
    whole = path.read_bytes()
    for damage in (truncated(whole, len(whole) // 2), flipped(whole, 1000), random_bytes(4096)):
        path.write_bytes(damage)
        notices: list[str] = []
        again = gguf_tokenizer_file(gguf, tokenizer, notices)
        assert again == path and again.read_bytes() == whole
        [notice] = notices
        assert f"The tokenizer copy {path.name} was damaged" in notice and "written again" in notice
        assert (path.parent / f"{path.name}.damaged").read_bytes() == damage
    assert Tokenizer.from_file(str(path)).encode("Paris", add_special_tokens=False).ids == [38634]


# -- a GGUF file (the user's: never modified, explained) ------------------------------------------------------------
def test_a_gguf_with_flipped_header_bytes_is_explained_never_a_crash(tmp_path: Path) -> None:
    from app.core.engines.loader import load_model
    from app.core.errors import HearthError
    from app.core.models.gguf_meta import read_gguf_header
    from tests.helpers.gguf_files import tiny_llama_gguf

    whole = tiny_llama_gguf(tmp_path / "source.gguf", 8)[0].read_bytes()
    end = read_gguf_header(tmp_path / "source.gguf").data_start
    refused = 0
    for offset in range(8, end, end // 20):
        path = tmp_path / f"flipped-at-{offset}.gguf"
        damaged = flipped(whole, offset)
        path.write_bytes(damaged)
        try:
            load_model(str(path), quantization="fp32", device="cpu", ignore_fit=True)
        except HearthError as exc:
            refused += 1
            assert path.name in str(exc)
        assert path.read_bytes() == damaged  # the user's file is never touched
    assert refused >= 10
