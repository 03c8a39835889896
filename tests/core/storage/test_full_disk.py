"""Fault round 2.2 and 2.4: a full disk is told as a full disk (which folder, how much is free), a healthy file is
never renamed, moved or rewritten because a write failed, replies go on, and nothing half-written is left.

Each case runs on a real full file system (a small tmpfs, filled) where the machine lets the test mount one, and
again with an injected ENOSPC / SQLITE_FULL, which runs everywhere."""

from __future__ import annotations

import errno
import hashlib
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from app.core.chat.response_cache import CachedReply, ResponseCache
from app.core.storage import space
from app.core.storage.history import HistoryDamagedError, HistoryDiskFullError, HistoryStore
from tests.helpers.full_disk import FullDiskConnection, fill, free_space, small_filesystem


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def healthy_cache(path: Path) -> None:
    cache = ResponseCache(path)
    cache.put("kept", CachedReply(["An earlier reply."], "stop", 3))
    cache.close()


# -- the response cache --------------------------------------------------------------------------------------------


def test_a_full_disk_leaves_a_healthy_response_cache_untouched(tmp_path: Path) -> None:
    with small_filesystem(tmp_path / "disk") as disk:
        path = disk / "cache" / "responses.sqlite"
        healthy_cache(path)
        before = digest(path)
        fill(disk)
        cache = ResponseCache(path)  # opening needs a WAL and a shared-memory file: no space for them
        cache.put("new", CachedReply(["x" * 100_000], "stop", 1))  # never raises: the reply is shown regardless
        notices = cache.take_notices()
        cache.close()
        assert len(notices) == 1
        off = f"The response cache is off for this session: the disk holding {path.parent} is full ("
        assert notices[0].startswith(off)
        assert "free)" in notices[0] and "damaged" not in notices[0]
        assert digest(path) == before
        assert not list(path.parent.glob("*.damaged*"))
        again = ResponseCache(path)  # space is back? not yet: still off, still untouched
        assert again.get("kept") is None and again.off_reason
        again.close()


def test_a_disk_that_fills_while_the_cache_is_open_switches_it_off_untouched(tmp_path: Path) -> None:
    with small_filesystem(tmp_path / "disk") as disk:
        path = disk / "responses.sqlite"
        healthy_cache(path)
        cache = ResponseCache(path)
        assert cache.get("kept") is not None
        filler = fill(disk)
        cache.put("big", CachedReply(["y" * 200_000], "stop", 1))
        assert any("the disk holding" in line and "is full" in line for line in cache.take_notices())
        assert cache.get("kept") is None  # off for this session (an empty cache in memory)
        cache.close()
        assert not list(disk.glob("*.damaged*"))
        free_space(filler)
        reopened = ResponseCache(path)  # the next session: the same file, as it was
        assert reopened.get("kept") is not None and reopened.get("kept").text == "An earlier reply."  # type: ignore[union-attr]
        assert reopened.take_notices() == []
        reopened.close()


def test_an_injected_full_disk_never_moves_the_response_cache_aside(tmp_path: Path) -> None:
    path = tmp_path / "responses.sqlite"
    healthy_cache(path)
    before = digest(path)
    cache = ResponseCache(path)
    cache._db = FullDiskConnection(cache._db)  # type: ignore[assignment]
    cache.put("new", CachedReply(["z"], "stop", 1))
    notices = cache.take_notices()
    cache.close()
    assert len(notices) == 1 and f"the disk holding {tmp_path} is full" in notices[0]
    assert digest(path) == before and not list(tmp_path.glob("*.damaged*"))


def test_only_a_damaged_file_counts_as_damaged() -> None:
    """SQLite's own codes decide: a full, locked or read-only file is not damaged."""

    def error(code: int, text: str) -> sqlite3.Error:
        exc = sqlite3.OperationalError(text)
        exc.sqlite_errorcode = code  # type: ignore[attr-defined]
        return exc

    assert space.is_damaged_database(error(11, "database disk image is malformed"))
    assert space.is_damaged_database(error(26, "file is not a database"))
    for code, text in ((13, "database or disk is full"), (5, "database is locked"), (8, "readonly"), (10, "I/O")):
        assert not space.is_damaged_database(error(code, text))
    assert space.is_disk_full(error(13, "database or disk is full"))
    assert space.is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert not space.is_disk_full(OSError(errno.EACCES, "Permission denied"))


# -- the history ---------------------------------------------------------------------------------------------------


def test_a_full_disk_keeps_the_reply_and_saves_it_when_space_is_back(tmp_path: Path) -> None:
    with small_filesystem(tmp_path / "disk") as disk:
        path = disk / "history.sqlite"
        store = HistoryStore(path)
        conversation = store.create_conversation("Full disk")
        question = store.add_message(conversation.id, "user", "Write a long story.", None)
        reply = store.add_message(conversation.id, "assistant", "", question.id)
        store.update_message(reply.id, content="Once upon a time")
        filler = fill(disk)
        story = "Once upon a time " + "and then " * 100_000  # ~900 KB: no room for it
        store.update_message(reply.id, content=story, finish_reason="stop")  # held back, not raised
        notice = store.unsaved_notice()
        assert notice.startswith(f"1 message is not saved yet: the disk holding {disk} is full (")
        assert notice.endswith("free). history.sqlite was not changed; Hearth saves it as soon as there is space, and "
                               "quitting before then loses it.")  # fmt: skip
        assert store.get_message(reply.id).content == story  # what the window shows meanwhile
        with pytest.raises(HistoryDiskFullError, match=r"the disk holding .* is full \(.* free\)"):
            store.add_message(conversation.id, "user", "And another?", reply.id)
        assert path.exists() and not list(disk.glob("*.damaged*"))
        assert not store.save_pending()
        free_space(filler)
        assert store.save_pending() and store.unsaved_notice() == ""
        store.close()
        reopened = HistoryStore(path)
        saved = reopened.get_message(reply.id)
        assert (saved.content, saved.finish_reason) == (story, "stop")
        reopened.close()


def test_a_new_history_on_a_full_disk_is_a_full_disk_not_a_damaged_file(tmp_path: Path) -> None:
    with small_filesystem(tmp_path / "disk", size="1m") as disk:
        fill(disk)
        with pytest.raises(HistoryDiskFullError) as raised:
            HistoryStore(disk / "history.sqlite")
        assert not isinstance(raised.value, HistoryDamagedError)
        assert f"the disk holding {disk} is full" in str(raised.value)


def test_an_injected_full_disk_holds_the_update_back(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "history.sqlite")
    conversation = store.create_conversation("x")
    message = store.add_message(conversation.id, "assistant", "first", None)
    real = store._db
    store._db = FullDiskConnection(real)  # type: ignore[assignment]
    store.update_message(message.id, content="second")
    assert "is full" in store.unsaved_notice() and store.get_message(message.id).content == "second"
    store._db = real
    assert store.save_pending()
    store.close()
    assert HistoryStore(tmp_path / "history.sqlite").get_message(message.id).content == "second"


# -- the packed copy of the weights ---------------------------------------------------------------------------------


def pieces(size: int) -> list[memoryview]:
    return [memoryview(b"header"), memoryview(bytes(size))]


def test_a_packed_copy_that_does_not_fit_is_not_written(tmp_path: Path) -> None:
    """2.4: the space is checked before writing; the notice says needed against free; nothing partial is left."""
    from app.core.fastpath import integrity
    from app.core.fastpath.packed_cache import write_packed_copy

    with small_filesystem(tmp_path / "disk", size="2m") as disk:
        target = disk / "decode-fused-q4" / "model.safetensors"
        notices: list[str] = []
        sha = write_packed_copy(target, pieces(3_000_000), notices)
        assert sha == integrity.digest_pieces(pieces(3_000_000))
        assert len(notices) == 1
        assert notices[0].startswith("The packed copy of the weights was not cached: it needs 3.0 MB and ")
        assert f"{target.parent} has " in notices[0] and "free" in notices[0]
        assert list(target.parent.iterdir()) == []


def test_a_disk_that_fills_during_packing_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2.4: the check passed (another writer took the space meanwhile): the write meets ENOSPC for real."""
    from app.core.fastpath.packed_cache import write_packed_copy

    with small_filesystem(tmp_path / "disk", size="2m") as disk:
        monkeypatch.setattr(space, "check_space", lambda *args, **kwargs: None)
        target = disk / "copy.safetensors"
        notices: list[str] = []
        write_packed_copy(target, pieces(3_000_000), notices)
        assert len(notices) == 1 and "it needs 3.0 MB" in notices[0]
        assert list(disk.iterdir()) == []  # no partial, no sidecar


def test_an_injected_enospc_during_packing_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.core.fastpath import packed_cache

    class FullFile:
        def __init__(self, real: Any) -> None:
            self.real = real

        def __enter__(self) -> FullFile:
            return self

        def __exit__(self, *exc: object) -> None:
            self.real.close()

        def write(self, data: Any) -> int:
            self.real.write(bytes(data)[:10])
            raise OSError(errno.ENOSPC, "No space left on device")

    real_open = Path.open
    monkeypatch.setattr(Path, "open", lambda self, mode="r", *a, **k: FullFile(real_open(self, mode, *a, **k))
                        if mode == "wb" else real_open(self, mode, *a, **k))  # fmt: skip
    notices: list[str] = []
    packed_cache.write_packed_copy(tmp_path / "copy.safetensors", pieces(1000), notices)
    assert len(notices) == 1 and "was not cached" in notices[0]
    assert list(tmp_path.iterdir()) == []
