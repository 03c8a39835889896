"""The keyring-only rule for engine keys, as the Hub-token scan in tests/core/models/test_hub.py does for the Hub token:
after adding an engine with a key, chatting through it with every library logging at DEBUG, saving settings,
keeping the conversation in history and exporting it, no file under Hearth's folders holds the key, and no log
record shows it."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest

from app.cli import main
from app.core.settings import Settings, save_settings
from app.core.storage import paths, secrets
from app.core.storage.history import HistoryStore
from tests.helpers import memory_keyring
from tests.helpers.replay_server import ReplayServer

KEY = "sk-leakcheck-ENGINE-KEY-5f3a9c2e7b"


def test_engine_keys_live_only_in_the_keyring(
    hearth_home: Path, replay: ReplayServer, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    keyring_backend = memory_keyring.MemoryKeyring()
    log_file = paths.log_dir() / "hearth.log"
    handler = logging.FileHandler(log_file)
    handler.setFormatter(logging.Formatter("%(name)s %(message)s"))
    root = logging.getLogger()
    previous_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        with memory_keyring.installed(keyring_backend), caplog.at_level(logging.DEBUG):
            monkeypatch.setattr("sys.stdin", io.StringIO(KEY + "\n"))
            args = ["engines", "add", "hosted", "--url", replay.base_url, "--key", "--price-as", "openai"]
            assert main(args) == 0
            replay.queue_file("vllm_stream.sse")
            assert main(["chat", "--engine", "hosted", "--model", "gpt-4o-mini", "--json", "Hi"]) == 0
            replay.queue_file("openai_401.json", status=401)
            assert main(["chat", "--engine", "hosted", "--model", "gpt-4o-mini", "Hi"]) == 2
            out = capsys.readouterr()
            events = [json.loads(line) for line in out.out.splitlines() if line.startswith("{")]
            stats = next(e for e in events if e["type"] == "stats")
            save_settings(Settings(model="gpt-4o-mini"))
            store = HistoryStore()
            conversation = store.create_conversation("remote")
            user = store.add_message(conversation.id, "user", "Hi", None)
            store.add_message(
                conversation.id, "assistant", "Paris is the capital.", user.id, model="gpt-4o-mini @ hosted",
                finish_reason="stop", stats=stats,
            )  # fmt: skip
            (hearth_home / "export.json").write_text(json.dumps(store.export_json(conversation.id)))
            (hearth_home / "export.md").write_text(store.export_markdown(conversation.id))
            store.close()
            logging.getLogger("hearth.test").warning("header was Bearer %s", KEY)
    finally:
        root.removeHandler(handler)
        root.setLevel(previous_level)
        handler.close()
    assert keyring_backend.store[("hearth", "engine-key:hosted")] == KEY
    assert replay.requests[0].headers["authorization"] == f"Bearer {KEY}"  # it was used…
    assert KEY not in caplog.text and secrets.REDACTED in caplog.text  # …and never logged
    assert KEY not in out.out and KEY not in out.err
    scanned = set()
    for path in hearth_home.rglob("*"):
        if path.is_file():
            scanned.add(path.name)
            assert KEY.encode() not in path.read_bytes(), f"engine key written to {path}"
    assert {"engines.json", "settings.json", "history.sqlite", "export.json", "export.md", "hearth.log"} <= scanned
