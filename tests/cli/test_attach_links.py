"""`hearth chat --attach` names the file a link really is, and with a remote engine says, before sending, which files'
text leaves the computer (against the replay server on 127.0.0.1, in-process)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from app.cli import attach, main
from app.cli.attach import say_where_documents_go
from app.core.documents import extract_document
from app.core.engines.backend import ModelInfo
from tests.helpers.replay_server import ReplayServer


@pytest.fixture
def replay() -> Iterator[ReplayServer]:
    with ReplayServer().running() as server:
        yield server


def linked_file(tmp_path: Path) -> tuple[Path, Path]:
    target = tmp_path / "private" / "salaries.csv"
    target.parent.mkdir()
    target.write_text("name,salary\nAda,1\n", encoding="utf-8")
    link = tmp_path / "report.csv"
    link.symlink_to(target)
    return link, target.resolve()


def test_a_remote_engine_is_named_with_every_file_before_the_text_is_sent(
    replay: ReplayServer, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    link, target = linked_file(tmp_path)
    sent_before_the_note: list[list[str]] = []
    real = attach.say_where_documents_go

    def noting(session: object, documents: object) -> None:
        sent_before_the_note.append([r.path for r in replay.requests])
        real(session, documents)  # type: ignore[arg-type]

    monkeypatch.setattr(attach, "say_where_documents_go", noting)
    assert main(["engines", "add", "r", "--url", replay.base_url, "--model", "m"]) == 0
    capsys.readouterr()
    replay.queue_file("vllm_stream.sse")
    code = main(["chat", "--engine", "r", "--attach", str(link), "What is in the report?"])
    _, err = capsys.readouterr()
    assert code == 0, err
    assert f"· attached report.csv (a link to {target}) (CSV)" in err
    note = (
        f"hearth: note: The text of this file will leave this computer for engine r ({replay.base_url}) when sent: "
        f"report.csv (a link to {target})."
    )
    assert note in err
    assert sent_before_the_note == [[]]  # said once, before any request reached the engine
    assert replay.requests[-1].path.endswith("/chat/completions")


def test_a_local_model_gets_no_such_note(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    link, _ = linked_file(tmp_path)
    session = SimpleNamespace(backend=SimpleNamespace(info=ModelInfo("SmolLM2-135M-Instruct", "q4_1", "cpu", 8192)))
    say_where_documents_go(session, [extract_document(link)])
    assert capsys.readouterr().err == ""
