"""The conversation history store: real SQLite files, real threads, real killed processes."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from app.core.chat.events import ReplyStats
from app.core.storage import history_schema
from app.core.storage.history import (
    Attachment,
    HistoryError,
    HistoryImportError,
    HistoryNotFoundError,
    HistoryStore,
    Message,
)
from app.core.storage.history_schema import schema_version

REPO_ROOT = Path(__file__).resolve().parents[3]

STATS = ReplyStats(
    ttft_s=0.25,
    prompt_tokens=120,
    cached_tokens=100,
    prefill_tokens_per_s=400.0,
    decode_tokens_per_s=15.5,
    generated_tokens=42,
    prefill_s=0.05,
    decode_s=2.7,
    peak_memory_bytes=123_456_789,
    memory_device="cpu",
).to_dict()

REPORT = Attachment(
    name="report.pdf",
    mime_type="application/pdf",
    size_bytes=12_800,
    sha256="ab" * 32,
    text="Quarterly numbers: up 4%.",
    token_count=9,
)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "history.sqlite"


@pytest.fixture
def store(db_path: Path):
    with HistoryStore(db_path) as opened:
        yield opened


def contents(messages: list[Message]) -> list[str]:
    return [message.content for message in messages]


def run_python(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )


def build_branchy_conversation(store: HistoryStore) -> dict[str, Any]:
    """system -> user1 -> (reply1a, reply1b regenerated); reply1b -> user2 (edited into user2b) -> reply2b."""
    chat = store.create_conversation("Trip planning", settings={"temperature": 0.7, "system_prompt": "Be brief."})
    system = store.add_message(chat.id, "system", "Be brief.", None)
    user1 = store.add_message(chat.id, "user", "Plan a day in Lyon", system.id, attachments=[REPORT])
    reply1a = store.add_message(
        chat.id, "assistant", "Visit the old town.", user1.id, model="SmolLM2", finish_reason="stop", stats=STATS
    )
    reply1b = store.add_message(
        chat.id, "assistant", "Eat at a bouchon.", user1.id, model="SmolLM2", finish_reason="length", stats=STATS
    )
    user2 = store.add_message(chat.id, "user", "And the evening?", reply1b.id)
    user2b = store.add_message(chat.id, "user", "And at night?", reply1b.id)
    reply2b = store.add_message(chat.id, "assistant", "See the lights on Fourvière.", user2b.id, finish_reason="stop")
    return {
        "chat": chat,
        "system": system,
        "user1": user1,
        "reply1a": reply1a,
        "reply1b": reply1b,
        "user2": user2,
        "user2b": user2b,
        "reply2b": reply2b,
    }


# -- the database file ------------------------------------------------------------------------------------------


def test_new_database_is_versioned_wal_and_marked_as_hearths(store: HistoryStore, db_path: Path) -> None:
    raw = sqlite3.connect(db_path)
    try:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == schema_version() >= 1
        assert raw.execute("PRAGMA application_id").fetchone()[0] == history_schema.APPLICATION_ID
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        raw.close()
    assert store._connection().execute("PRAGMA foreign_keys").fetchone()[0] == 1


def test_default_path_is_in_the_data_dir(hearth_home: Path) -> None:
    with HistoryStore() as store:
        assert store.path == hearth_home / "data" / "history.sqlite"
        assert store.path.is_file()


def test_reopening_keeps_everything(db_path: Path) -> None:
    with HistoryStore(db_path) as store:
        parts = build_branchy_conversation(store)
        before = store.export_json(parts["chat"].id)
    with HistoryStore(db_path) as reopened:
        after = reopened.export_json(parts["chat"].id)
    before.pop("exported_at")
    after.pop("exported_at")
    assert after == before


def test_closed_store_says_so(db_path: Path) -> None:
    store = HistoryStore(db_path)
    store.close()
    store.close()  # closing twice is harmless
    with pytest.raises(HistoryError, match=r"history database .*history\.sqlite is closed"):
        store.list_conversations()


# -- conversations ----------------------------------------------------------------------------------------------


def test_create_list_rename_delete(store: HistoryStore) -> None:
    first = store.create_conversation()
    second = store.create_conversation("Recipes", settings={"temperature": 0.2})
    assert first.title == "New chat" and first.settings == {} and first.active_leaf_id is None
    assert store.get_conversation(second.id).settings == {"temperature": 0.2}
    assert [c.id for c in store.list_conversations()] == [second.id, first.id]

    # A new message moves its conversation to the top.
    store.add_message(first.id, "user", "hello", None)
    assert [c.id for c in store.list_conversations()] == [first.id, second.id]

    store.rename_conversation(second.id, "  Bread   recipes \n")
    assert store.get_conversation(second.id).title == "Bread recipes"
    store.update_conversation_settings(second.id, {"temperature": 0.9, "model": "x"})
    assert store.get_conversation(second.id).settings == {"temperature": 0.9, "model": "x"}

    store.delete_conversation(first.id)
    assert [c.id for c in store.list_conversations()] == [second.id]
    with pytest.raises(HistoryNotFoundError, match=f"Conversation {first.id} does not exist"):
        store.get_conversation(first.id)


def test_deleting_a_conversation_removes_its_messages_and_attachments(store: HistoryStore, db_path: Path) -> None:
    parts = build_branchy_conversation(store)
    kept = store.create_conversation("kept")
    store.add_message(kept.id, "user", "still here", None, attachments=[REPORT])
    store.delete_conversation(parts["chat"].id)
    raw = sqlite3.connect(db_path)
    try:
        assert raw.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 1
        assert raw.execute("SELECT COUNT(*) FROM attachments").fetchone()[0] == 1
    finally:
        raw.close()
    assert contents(store.active_branch(kept.id)) == ["still here"]


def test_search_matches_titles_and_any_message_ignoring_case(store: HistoryStore) -> None:
    parts = build_branchy_conversation(store)
    other = store.create_conversation("Ärger mit dem Drucker")
    store.add_message(other.id, "user", "The printer says PC LOAD LETTER", None)
    chat_id = parts["chat"].id

    assert [c.id for c in store.list_conversations("trip")] == [chat_id]  # title
    assert [c.id for c in store.list_conversations("BOUCHON")] == [chat_id]  # a reply
    assert [c.id for c in store.list_conversations("and the evening")] == [chat_id]  # an inactive branch
    assert [c.id for c in store.list_conversations("ärger")] == [other.id]  # not only ASCII
    assert [c.id for c in store.list_conversations("load letter")] == [other.id]
    assert store.list_conversations("100%_") == []  # no LIKE wildcards
    assert len(store.list_conversations("   ")) == 2


def test_empty_title_is_refused(store: HistoryStore) -> None:
    chat = store.create_conversation("Keep me")
    with pytest.raises(HistoryError, match="A conversation title cannot be empty"):
        store.rename_conversation(chat.id, "  \t ")
    with pytest.raises(HistoryError, match="A conversation title cannot be empty"):
        store.create_conversation("")
    assert store.get_conversation(chat.id).title == "Keep me"


def test_unknown_ids_raise_not_found(store: HistoryStore) -> None:
    with pytest.raises(HistoryNotFoundError, match="Conversation 41 does not exist"):
        store.add_message(41, "user", "hi", None)
    with pytest.raises(HistoryNotFoundError, match="Message 42 does not exist"):
        store.update_message(42, content="x")
    with pytest.raises(HistoryNotFoundError, match="Message 43 does not exist"):
        store.get_message(43)
    with pytest.raises(HistoryNotFoundError, match="Conversation 44 does not exist"):
        store.delete_conversation(44)


def test_bad_messages_are_refused_and_nothing_is_written(store: HistoryStore) -> None:
    first = store.create_conversation("one")
    second = store.create_conversation("two")
    foreign_parent = store.add_message(first.id, "user", "hi", None)
    with pytest.raises(HistoryError, match=f"Message {foreign_parent.id} belongs to another conversation"):
        store.add_message(second.id, "assistant", "hello", foreign_parent.id)
    with pytest.raises(HistoryError, match="A message role must be one of system, user, assistant"):
        store.add_message(second.id, "robot", "beep", None)
    with pytest.raises(HistoryError, match="A finish reason must be one of stop, length, cancelled, error"):
        store.add_message(second.id, "assistant", "x", None, finish_reason="done")
    with pytest.raises(HistoryError, match="A finish reason must be one of"):
        store.update_message(foreign_parent.id, finish_reason="eos")
    assert store.active_branch(second.id) == []
    assert store.get_conversation(second.id).active_leaf_id is None


# -- messages and branches --------------------------------------------------------------------------------------


def test_messages_keep_every_field(store: HistoryStore) -> None:
    chat = store.create_conversation()
    user = store.add_message(chat.id, "user", "Summarise this", None, attachments=[REPORT, REPORT])
    reply = store.add_message(
        chat.id, "assistant", "Numbers went up.", user.id, model="SmolLM2-135M", finish_reason="stop", stats=STATS
    )
    loaded = store.get_message(reply.id)
    assert loaded == reply
    assert (loaded.parent_id, loaded.role, loaded.model, loaded.finish_reason) == (
        user.id,
        "assistant",
        "SmolLM2-135M",
        "stop",
    )
    assert ReplyStats.from_dict(loaded.stats or {}) == ReplyStats.from_dict(STATS)
    assert store.get_message(user.id).attachments == (REPORT, REPORT)
    assert store.get_conversation(chat.id).active_leaf_id == reply.id


def test_regenerate_keeps_the_old_reply_reachable(store: HistoryStore) -> None:
    chat = store.create_conversation()
    user = store.add_message(chat.id, "user", "Name a colour", None)
    old = store.add_message(chat.id, "assistant", "Blue", user.id, finish_reason="stop")
    new = store.add_message(chat.id, "assistant", "Red", user.id, finish_reason="stop")  # regenerate

    assert contents(store.active_branch(chat.id)) == ["Name a colour", "Red"]
    assert [m.id for m in store.siblings(new.id)] == [old.id, new.id]
    assert [m.id for m in store.siblings(old.id)] == [old.id, new.id]
    assert [m.id for m in store.children(user.id, chat.id)] == [old.id, new.id]

    store.switch_to(old.id)
    assert contents(store.active_branch(chat.id)) == ["Name a colour", "Blue"]
    store.switch_to(new.id)
    assert contents(store.active_branch(chat.id)) == ["Name a colour", "Red"]


def test_edit_makes_a_branch_and_switch_to_follows_the_latest_children(store: HistoryStore) -> None:
    parts = build_branchy_conversation(store)
    chat_id = parts["chat"].id
    assert contents(store.active_branch(chat_id)) == [
        "Be brief.",
        "Plan a day in Lyon",
        "Eat at a bouchon.",
        "And at night?",
        "See the lights on Fourvière.",
    ]
    # The edited user message and its edit are alternatives at the same point.
    assert [m.id for m in store.siblings(parts["user2b"].id)] == [parts["user2"].id, parts["user2b"].id]

    store.switch_to(parts["user2"].id)
    assert contents(store.active_branch(chat_id))[-2:] == ["Eat at a bouchon.", "And the evening?"]

    # Switching to an earlier message on another branch goes down its newest children.
    store.switch_to(parts["reply1a"].id)
    assert contents(store.active_branch(chat_id))[-1] == "Visit the old town."
    store.switch_to(parts["reply1b"].id)
    assert contents(store.active_branch(chat_id))[-1] == "See the lights on Fourvière."

    # A message already on the active branch leaves it as it is.
    store.switch_to(parts["user2"].id)
    store.switch_to(parts["user1"].id)
    assert contents(store.active_branch(chat_id))[-1] == "And the evening?"


def test_editing_the_first_message_adds_a_second_root(store: HistoryStore) -> None:
    chat = store.create_conversation()
    first = store.add_message(chat.id, "user", "Hi", None)
    store.add_message(chat.id, "assistant", "Hello!", first.id)
    edited = store.add_message(chat.id, "user", "Hi there", None)
    assert [m.id for m in store.children(None, chat.id)] == [first.id, edited.id]
    assert [m.id for m in store.siblings(first.id)] == [first.id, edited.id]
    assert contents(store.active_branch(chat.id)) == ["Hi there"]
    store.switch_to(first.id)
    assert contents(store.active_branch(chat.id)) == ["Hi", "Hello!"]


def test_continue_after_length_limit_updates_the_same_reply(store: HistoryStore) -> None:
    chat = store.create_conversation()
    user = store.add_message(chat.id, "user", "Count to ten", None)
    reply = store.add_message(chat.id, "assistant", "1 2 3", user.id, finish_reason="length", stats=STATS)
    store.update_message(reply.id, content="1 2 3 4 5 6 7 8 9 10", finish_reason="stop")
    loaded = store.get_message(reply.id)
    assert (loaded.content, loaded.finish_reason, loaded.stats) == ("1 2 3 4 5 6 7 8 9 10", "stop", STATS)


def test_streaming_updates_survive_reopening_without_close(db_path: Path) -> None:
    store = HistoryStore(db_path)
    chat = store.create_conversation()
    user = store.add_message(chat.id, "user", "Tell me a story", None)
    reply = store.add_message(chat.id, "assistant", "", user.id, model="SmolLM2")
    text = ""
    for word in ["Once", " upon", " a", " time"]:
        text += word
        store.update_message(reply.id, content=text)
    # No close(): a second connection, as a restarted app would open, sees every committed update.
    with HistoryStore(db_path) as fresh:
        seen = fresh.get_message(reply.id)
        assert seen.content == "Once upon a time"
        assert seen.finish_reason is None  # still streaming (or interrupted) as far as the file knows
        assert contents(fresh.active_branch(chat.id)) == ["Tell me a story", "Once upon a time"]
    store.update_message(reply.id, finish_reason="cancelled", stats=STATS)
    store.close()
    with HistoryStore(db_path) as fresh:
        seen = fresh.get_message(reply.id)
        assert (seen.finish_reason, seen.stats) == ("cancelled", STATS)


def test_killed_process_keeps_the_streamed_text(db_path: Path) -> None:
    result = run_python(
        f"""
        import os, signal
        from pathlib import Path
        from app.core.storage.history import HistoryStore
        store = HistoryStore(Path({str(db_path)!r}))
        chat = store.create_conversation("Killed mid-reply")
        user = store.add_message(chat.id, "user", "Write a poem", None)
        reply = store.add_message(chat.id, "assistant", "", user.id)
        store.update_message(reply.id, content="Roses are red,")
        store.update_message(reply.id, content="Roses are red, violets")
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    assert result.returncode == -9, result.stderr
    with HistoryStore(db_path) as store:
        [chat] = store.list_conversations()
        assert chat.title == "Killed mid-reply"
        assert contents(store.active_branch(chat.id)) == ["Write a poem", "Roses are red, violets"]


def test_delete_message_removes_its_subtree_and_moves_the_active_leaf(store: HistoryStore, db_path: Path) -> None:
    parts = build_branchy_conversation(store)
    chat_id = parts["chat"].id

    # Deleting the regenerated reply (on the active branch) falls back to the other reply.
    store.delete_message(parts["reply1b"].id)
    assert contents(store.active_branch(chat_id)) == ["Be brief.", "Plan a day in Lyon", "Visit the old town."]
    for gone in ("reply1b", "user2", "user2b", "reply2b"):
        with pytest.raises(HistoryNotFoundError):
            store.get_message(parts[gone].id)
    assert [m.id for m in store.siblings(parts["reply1a"].id)] == [parts["reply1a"].id]

    # Deleting a message off the active branch leaves the branch alone.
    extra = store.add_message(chat_id, "assistant", "Third try", parts["user1"].id)
    store.switch_to(parts["reply1a"].id)
    store.delete_message(extra.id)
    assert contents(store.active_branch(chat_id))[-1] == "Visit the old town."

    # With no sibling left, the parent becomes the leaf.
    store.delete_message(parts["reply1a"].id)
    assert contents(store.active_branch(chat_id)) == ["Be brief.", "Plan a day in Lyon"]

    # The root goes, and with it everything (attachments included).
    store.delete_message(parts["system"].id)
    assert store.active_branch(chat_id) == []
    assert store.get_conversation(chat_id).active_leaf_id is None
    raw = sqlite3.connect(db_path)
    try:
        assert raw.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0
        assert raw.execute("SELECT COUNT(*) FROM attachments").fetchone()[0] == 0
    finally:
        raw.close()


def test_deep_conversations_delete_and_load(store: HistoryStore) -> None:
    """Deeper than SQLite's trigger depth (1000): cascades per level would fail here."""
    chat = store.create_conversation()
    parent = None
    ids = []
    for index in range(1200):
        parent = store.add_message(chat.id, "user" if index % 2 == 0 else "assistant", str(index), parent).id
        ids.append(parent)
    assert len(store.active_branch(chat.id)) == 1200
    store.delete_message(ids[1])
    assert contents(store.active_branch(chat.id)) == ["0"]
    store.add_message(chat.id, "assistant", "again", ids[0])
    store.delete_conversation(chat.id)
    assert store.list_conversations() == []


# -- export and import ------------------------------------------------------------------------------------------


def without_export_time(data: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in data.items() if key != "exported_at"}


def test_json_export_import_round_trip_keeps_the_whole_tree(store: HistoryStore, tmp_path: Path) -> None:
    parts = build_branchy_conversation(store)
    exported = store.export_json(parts["chat"].id)
    assert exported["format"] == "hearth-conversation" and exported["version"] == 1
    assert len(exported["messages"]) == 7  # every branch, not just the active one
    assert exported["messages"][1]["attachments"][0]["text"] == "Quarterly numbers: up 4%."
    assert exported["messages"][2]["stats"] == STATS

    # Through a real file, as a user would move it between machines.
    file = tmp_path / "trip.json"
    file.write_text(json.dumps(exported), encoding="utf-8")
    imported = store.import_json_file(file)

    assert imported.id != parts["chat"].id
    assert (imported.title, imported.settings) == (parts["chat"].title, parts["chat"].settings)
    assert without_export_time(store.export_json(imported.id)) == without_export_time(exported)
    assert contents(store.active_branch(imported.id)) == contents(store.active_branch(parts["chat"].id))
    imported_user1 = store.active_branch(imported.id)[1]
    assert imported_user1.attachments == (REPORT,)
    assert len(store.children(imported_user1.id, imported.id)) == 2


def test_markdown_export_shows_the_active_branch_with_stats_and_attachments(store: HistoryStore) -> None:
    parts = build_branchy_conversation(store)
    markdown = store.export_markdown(parts["chat"].id)
    assert markdown.startswith("# Trip planning\n")
    assert "## System prompt\n\nBe brief." in markdown
    assert (
        "## User\n\nAttachments:\n- `report.pdf` (application/pdf, 12.5 KB, 9 tokens)\n\nPlan a day in Lyon" in markdown
    )
    assert (
        "## Assistant\n\nEat at a bouchon.\n\n*first token 0.25 s · prompt 120 tok (100 cached / 20 new) · "
        "prefill 400 tok/s · decode 15.5 tok/s (eager) · 42 generated · SmolLM2 · stopped at the length limit*"
    ) in markdown
    assert "See the lights on Fourvière." in markdown
    # Only the active branch.
    assert "Visit the old town." not in markdown
    assert "And the evening?" not in markdown
    assert markdown.index("Plan a day") < markdown.index("Eat at") < markdown.index("And at night?")


def valid_export() -> dict[str, Any]:
    return {
        "format": "hearth-conversation",
        "version": 1,
        "conversation": {
            "title": "Imported",
            "created_at": 1.0,
            "updated_at": 2.0,
            "settings": {},
            "active_leaf_id": 2,
        },
        "messages": [
            {"id": 1, "parent_id": None, "role": "user", "content": "hi", "created_at": 1.0},
            {
                "id": 2,
                "parent_id": 1,
                "role": "assistant",
                "content": "hello",
                "created_at": 2.0,
                "finish_reason": "stop",
            },
        ],
    }


def broken(change: Any) -> dict[str, Any]:
    data = valid_export()
    change(data)
    return data


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([1, 2, 3], 'This file is not a Hearth conversation export \\(it lacks "format": "hearth-conversation"\\)'),
        ({"format": "something-else"}, "not a Hearth conversation export"),
        (
            broken(lambda d: d.update(version=2)),
            "exported by a newer version of Hearth \\(format version 2; this version reads up to 1\\)",
        ),
        (broken(lambda d: d.update(version="1")), "version must be a whole number from 1 up"),
        (broken(lambda d: d.pop("messages")), "file.messages is missing"),
        (broken(lambda d: d.update(messages={"1": {}})), "file.messages must be a list \\(got an object\\)"),
        (broken(lambda d: d["conversation"].update(title="  ")), "conversation.title is empty"),
        (broken(lambda d: d["conversation"].update(created_at="yesterday")), "conversation.created_at must be"),
        (broken(lambda d: d["messages"].__setitem__(0, "hi")), "messages\\[0\\] must be an object"),
        (broken(lambda d: d["messages"][1].update(role="bot")), "messages\\[1\\].role must be one of system, user"),
        (broken(lambda d: d["messages"][1].update(id=1)), "messages\\[1\\].id repeats id 1"),
        (broken(lambda d: d["messages"][1].update(id=True)), "messages\\[1\\].id must be a whole number"),
        (
            broken(lambda d: d["messages"][0].update(parent_id=2)),
            "messages\\[0\\].parent_id refers to message 2, which does not come before it",
        ),
        (broken(lambda d: d["messages"][1].pop("content")), "messages\\[1\\].content is missing"),
        (
            broken(lambda d: d["messages"][1].update(finish_reason="eos")),
            "messages\\[1\\].finish_reason must be one of",
        ),
        (broken(lambda d: d["messages"][1].update(stats=[1])), "messages\\[1\\].stats must be an object"),
        (
            broken(lambda d: d["messages"][0].update(attachments=[{"name": "a.txt"}])),
            "messages\\[0\\].attachments\\[0\\].mime_type is missing",
        ),
        (
            broken(lambda d: d["conversation"].update(active_leaf_id=9)),
            "conversation.active_leaf_id refers to message 9, which is not in the file",
        ),
    ],
)
def test_bad_imports_are_refused_with_a_specific_message(store: HistoryStore, data: Any, message: str) -> None:
    kept = store.create_conversation("existing")
    with pytest.raises(HistoryImportError, match=message):
        store.import_json(data)
    assert [c.id for c in store.list_conversations()] == [kept.id]


def test_a_valid_hand_written_file_imports(store: HistoryStore) -> None:
    imported = store.import_json(valid_export())
    assert contents(store.active_branch(imported.id)) == ["hi", "hello"]
    assert (imported.created_at, imported.updated_at) == (1.0, 2.0)


def test_import_file_errors_name_the_file(store: HistoryStore, tmp_path: Path) -> None:
    not_json = tmp_path / "notes.json"
    not_json.write_text("{ this is not json", encoding="utf-8")
    with pytest.raises(HistoryImportError, match=r"Cannot import .*notes\.json: it is not valid JSON \(line 1"):
        store.import_json_file(not_json)
    binary = tmp_path / "image.json"
    binary.write_bytes(b"\xff\xd8\xff\xe0 jpeg")
    with pytest.raises(HistoryImportError, match=r"Cannot import .*image\.json: it is not a UTF-8 text file"):
        store.import_json_file(binary)
    with pytest.raises(HistoryImportError, match=r"Cannot import .*missing\.json: No such file"):
        store.import_json_file(tmp_path / "missing.json")
    assert store.list_conversations() == []


def test_import_is_all_or_nothing_when_a_write_fails(store: HistoryStore, monkeypatch: pytest.MonkeyPatch) -> None:
    parts = build_branchy_conversation(store)
    exported = store.export_json(parts["chat"].id)
    calls = 0

    def failing_insert(*args: Any) -> None:
        nonlocal calls
        calls += 1
        raise sqlite3.OperationalError("disk I/O error")

    # The conversation and the first messages are written before the attachment insert fails.
    monkeypatch.setattr(HistoryStore, "_insert_attachment", staticmethod(failing_insert))
    with pytest.raises(HistoryError, match=r"history database .* could not be read or written \(disk I/O error\)"):
        store.import_json(exported)
    assert calls == 1
    assert [c.id for c in store.list_conversations()] == [parts["chat"].id]
    raw = sqlite3.connect(store.path)
    try:
        assert raw.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 7
    finally:
        raw.close()


def test_process_killed_mid_import_leaves_no_half_written_conversation(store: HistoryStore, tmp_path: Path) -> None:
    parts = build_branchy_conversation(store)
    export_file = tmp_path / "export.json"
    export_file.write_text(json.dumps(store.export_json(parts["chat"].id)), encoding="utf-8")
    store.close()
    result = run_python(
        f"""
        import os, signal
        from pathlib import Path
        from app.core.storage.history import HistoryStore
        def die(*args):
            os.kill(os.getpid(), signal.SIGKILL)
        HistoryStore._insert_attachment = staticmethod(die)
        HistoryStore(Path({str(store.path)!r})).import_json_file(Path({str(export_file)!r}))
        """
    )
    assert result.returncode == -9, result.stderr
    with HistoryStore(store.path) as reopened:
        assert [c.id for c in reopened.list_conversations()] == [parts["chat"].id]
        assert len(reopened.export_json(parts["chat"].id)["messages"]) == 7


# -- schema versions and foreign files --------------------------------------------------------------------------


def test_a_newer_schema_is_refused_untouched(db_path: Path) -> None:
    with HistoryStore(db_path) as store:
        store.create_conversation("from the future")
    raw = sqlite3.connect(db_path)
    raw.execute(f"PRAGMA user_version = {schema_version() + 5}")
    raw.close()
    before = db_path.read_bytes()
    with pytest.raises(
        HistoryError,
        match=rf"{db_path.name} was written by a newer version of Hearth \(schema {schema_version() + 5}; "
        rf"this version understands up to {schema_version()}\)",
    ):
        HistoryStore(db_path)
    assert db_path.read_bytes() == before


def add_pinned_column(db: sqlite3.Connection) -> None:
    db.execute("ALTER TABLE conversations ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0")


def test_migrations_upgrade_an_existing_database_and_keep_a_backup(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with HistoryStore(db_path) as store:
        parts = build_branchy_conversation(store)
    monkeypatch.setattr(history_schema, "MIGRATIONS", [*history_schema.MIGRATIONS, add_pinned_column])
    with HistoryStore(db_path) as upgraded:
        assert schema_version() == 2
        assert contents(upgraded.active_branch(parts["chat"].id))[-1] == "See the lights on Fourvière."
        columns = [row[1] for row in upgraded._connection().execute("PRAGMA table_info(conversations)")]
        assert "pinned" in columns
        assert upgraded._connection().execute("PRAGMA user_version").fetchone()[0] == 2
    # Opening again finds nothing to do.
    with HistoryStore(db_path) as again:
        assert again.get_conversation(parts["chat"].id).title == "Trip planning"


def test_backup_holds_the_old_version(db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with HistoryStore(db_path) as store:
        build_branchy_conversation(store)
    monkeypatch.setattr(history_schema, "MIGRATIONS", [*history_schema.MIGRATIONS, add_pinned_column])
    HistoryStore(db_path).close()
    raw = sqlite3.connect(db_path.with_name("history.sqlite.v1.bak"))
    try:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == 1
        assert raw.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 7
    finally:
        raw.close()


def test_a_failing_migration_rolls_back_and_says_so(db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with HistoryStore(db_path) as store:
        parts = build_branchy_conversation(store)

    def half_done(db: sqlite3.Connection) -> None:
        add_pinned_column(db)
        raise ValueError("no space left")

    monkeypatch.setattr(history_schema, "MIGRATIONS", [*history_schema.MIGRATIONS, half_done])
    with pytest.raises(
        HistoryError, match=r"could not be upgraded to schema 2 \(no space left\); it was left at schema 1"
    ):
        HistoryStore(db_path)
    monkeypatch.undo()
    with HistoryStore(db_path) as store:
        assert store._connection().execute("PRAGMA user_version").fetchone()[0] == 1
        columns = [row[1] for row in store._connection().execute("PRAGMA table_info(conversations)")]
        assert "pinned" not in columns
        assert len(store.export_json(parts["chat"].id)["messages"]) == 7


def test_a_non_sqlite_file_is_refused_and_left_untouched(db_path: Path) -> None:
    junk = b"These are my notes, not a database.\n" * 200
    db_path.write_bytes(junk)
    with pytest.raises(HistoryError, match=rf"The file .*{db_path.name} is not a SQLite database.*left untouched"):
        HistoryStore(db_path)
    assert db_path.read_bytes() == junk
    assert sorted(p.name for p in db_path.parent.iterdir()) == [db_path.name]


def test_another_programs_database_is_refused(db_path: Path) -> None:
    raw = sqlite3.connect(db_path)
    raw.execute("CREATE TABLE bookmarks (url TEXT)")
    raw.execute("INSERT INTO bookmarks VALUES ('https://example.org')")
    raw.commit()
    raw.close()
    before = db_path.read_bytes()
    with pytest.raises(HistoryError, match=rf"{db_path.name} is a SQLite database of another program"):
        HistoryStore(db_path)
    assert db_path.read_bytes() == before


def test_a_folder_at_the_path_is_refused(db_path: Path) -> None:
    db_path.mkdir()
    with pytest.raises(HistoryError, match=rf"{db_path.name} is a folder, not a file"):
        HistoryStore(db_path)


def test_a_damaged_database_gives_a_clear_error(db_path: Path) -> None:
    with HistoryStore(db_path) as store:
        chat = store.create_conversation("soon damaged")
        store.add_message(chat.id, "user", "x" * 20_000, None)
    page_size = 4096
    data = bytearray(db_path.read_bytes())
    assert len(data) > 2 * page_size
    data[page_size:] = b"\xa5" * (len(data) - page_size)  # every page but the header page
    db_path.write_bytes(bytes(data))
    with pytest.raises(
        HistoryError, match=rf"The history database .*{db_path.name} is damaged \(database disk image is malformed\)"
    ):
        opened = HistoryStore(db_path)
        try:
            opened.list_conversations()
            opened.active_branch(chat.id)
        finally:
            opened.close()


# -- threads ----------------------------------------------------------------------------------------------------


def test_two_threads_share_one_store(store: HistoryStore) -> None:
    streaming_chat = store.create_conversation("streaming")
    user = store.add_message(streaming_chat.id, "user", "go", None)
    reply = store.add_message(streaming_chat.id, "assistant", "", user.id)
    other_chat = store.create_conversation("typing")
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def stream() -> None:
        try:
            start.wait()
            for index in range(200):
                store.update_message(reply.id, content="tok " * (index + 1))
            store.update_message(reply.id, finish_reason="stop", stats=STATS)
        except BaseException as err:
            errors.append(err)

    def type_and_browse() -> None:
        try:
            start.wait()
            parent = None
            for index in range(100):
                parent = store.add_message(other_chat.id, "user", f"line {index}", parent).id
                store.list_conversations("tok")
                store.active_branch(streaming_chat.id)
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=stream), threading.Thread(target=type_and_browse)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    final = store.get_message(reply.id)
    assert (final.content, final.finish_reason) == ("tok " * 200, "stop")
    assert len(store.active_branch(other_chat.id)) == 100


def test_two_stores_on_one_file_see_each_others_writes(db_path: Path) -> None:
    """Two windows (two connections): WAL lets one read while the other writes."""
    with HistoryStore(db_path) as writer, HistoryStore(db_path) as reader:
        chat = writer.create_conversation("shared")
        reply = writer.add_message(chat.id, "assistant", "partial", None)
        assert reader.get_message(reply.id).content == "partial"
        writer.update_message(reply.id, content="partial and more")
        assert reader.get_message(reply.id).content == "partial and more"
        assert os.path.exists(f"{db_path}-wal")
