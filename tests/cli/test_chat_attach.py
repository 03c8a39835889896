"""`hearth chat --attach`: bad files fail before the model loads, the fit choices with the real tokenizer,
and the default model answering from a document, with the KV cache reused for the next question."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from app.cli import main
from app.cli.attach import message_with_documents
from app.core.chat.events import DoneEvent, StatsEvent
from app.core.chat.sampling import SamplingParams
from app.core.documents import DocumentsDoNotFitError, compose_user_message, extract_document
from app.core.engines.engine import PREFILL_GRID
from tests.helpers.document_files import SECRET, filler_paragraphs, write_pdf

QUESTION = "What is the secret code word?"
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=16)


def session_for(loaded: Any, context_window: int | None = None) -> Any:
    from app.core.engines.engine import Engine
    from app.core.engines.local import EngineBackend
    from app.core.engines.session import ChatSession

    engine = Engine(loaded)
    if context_window is not None:
        engine.context_window = context_window  # what --context N gives, without loading the model again
    return ChatSession(
        EngineBackend.wrap(engine),
        system_prompt="You are a helpful assistant.",
        params=GREEDY,
        use_response_cache=False,
    )


def ask(session: Any, text: str) -> tuple[str, StatsEvent]:
    stats: StatsEvent | None = None
    reply = ""
    for event in session.ask(text):
        if isinstance(event, StatsEvent):
            stats = event
        elif isinstance(event, DoneEvent):
            reply = event.text
    assert stats is not None
    return reply, stats


def notes_file(tmp_path: Path, paragraphs: int = 2) -> Path:
    lines = filler_paragraphs(paragraphs)
    lines.insert(paragraphs // 2, SECRET)
    path = tmp_path / "notes.txt"
    path.write_text("\n\n".join(lines), encoding="utf-8")
    return path


# -- user errors: before any model is loaded ---------------------------------------------------------
def bad_file(folder: Path, kind: str) -> Path:
    if kind == "missing":
        return folder / "gone.txt"
    if kind == "folder":
        return folder
    path = folder / ("e.txt" if kind == "empty" else "x.bin")
    path.write_bytes(b"" if kind == "empty" else bytes(range(256)))
    return path


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("missing", "hearth: gone.txt does not exist."),
        ("folder", "is a folder; attach the files inside it instead."),
        ("empty", "hearth: e.txt is empty; there is nothing to attach."),
        ("binary", "hearth: x.bin is a binary file, not text"),
    ],
)
def test_bad_attachment_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, message: str
) -> None:
    assert main(["chat", "--attach", str(bad_file(tmp_path, kind)), QUESTION]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_attach_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = notes_file(tmp_path, paragraphs=40)
    assert main(["chat", "--attach", str(path), "--attach-limit", "0.001", QUESTION]) == 2
    assert "notes.txt is 0.0 MB, over the 0.0 MB limit for attachments" in capsys.readouterr().err
    assert main(["chat", "--attach", str(path), "--attach-limit", "0", QUESTION]) == 2
    assert "--attach-limit must be a positive number of MB (got 0)." in capsys.readouterr().err


def test_fit_flag_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["chat", "--attach", "a.txt", "--fit", "drop", QUESTION])
    assert info.value.code == 2
    assert "invalid choice: 'drop'" in capsys.readouterr().err


# -- with the real default model -----------------------------------------------------------------
def test_default_model_answers_from_the_document_and_reuses_its_cache(default_loaded: Any, tmp_path: Path) -> None:
    document = extract_document(notes_file(tmp_path, paragraphs=8))
    session = session_for(default_loaded)
    first_message = message_with_documents(session, QUESTION, [document], "error")
    assert first_message == compose_user_message(QUESTION, [document])
    reply, first = ask(session, first_message)
    assert "PINEAPPLE-42" in reply
    document_tokens = session.backend.engine.count_tokens(document.text)
    assert first.stats.cached_tokens == 0 and first.stats.prompt_tokens > document_tokens
    session.params = SamplingParams(temperature=0.0, max_new_tokens=1)  # only the prefill matters from here
    _, second = ask(session, "Please repeat the secret code word.")
    # The whole first turn (system prompt, document, question, reply) is reused: only the new question is new.
    assert second.stats.cached_tokens >= first.stats.prompt_tokens
    assert second.stats.new_prompt_tokens < 40
    # Re-asking the first message with another question keeps the document prefix cached too, up to the start of
    # the prefill call the question's first token was in (calls are cut on a PREFILL_GRID grid: issue 28).
    edited = compose_user_message("Which station recorded the rain?", [document])
    stats = next(e for e in session.edit(0, edited) if isinstance(e, StatsEvent))
    assert document_tokens > 2 * PREFILL_GRID
    assert stats.stats.cached_tokens >= document_tokens - PREFILL_GRID


def test_documents_that_do_not_fit_are_an_error_by_default(default_loaded: Any, tmp_path: Path) -> None:
    document = extract_document(notes_file(tmp_path, paragraphs=60))
    session = session_for(default_loaded, context_window=512)
    with pytest.raises(DocumentsDoNotFitError) as info:
        message_with_documents(session, QUESTION, [document], "error")
    message = str(info.value)
    assert "of the 512-token context window. Nothing was dropped: choose --fit trim" in message
    assert info.value.document_tokens > info.value.available_tokens > 0
    assert session.messages == []


@pytest.mark.parametrize("fit", ["trim", "relevant"])
def test_fit_choices_fit_the_real_prompt(
    default_loaded: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], fit: str
) -> None:
    from app.core.chat.chat_format import format_prompt
    from app.core.chat.events import ChatMessage

    document = extract_document(notes_file(tmp_path, paragraphs=60))  # the secret sits in the middle
    session = session_for(default_loaded, context_window=512)
    message = message_with_documents(session, QUESTION, [document], fit)
    assert message.endswith(QUESTION) and message.startswith('<document name="notes.txt"')
    prompt = format_prompt(
        session.backend.engine.tokenizer, [ChatMessage("system", session.system_prompt), ChatMessage("user", message)]
    )
    assert len(prompt.ids) + min(GREEDY.max_new_tokens, 512 // 4) <= 512
    assert ("PINEAPPLE-42" in message) == (fit == "relevant")
    note = capsys.readouterr().err
    assert note.startswith("hearth: note: ") and "dropped" in note


def test_chat_attach_end_to_end_in_a_subprocess(tmp_path: Path) -> None:
    pdf = write_pdf(tmp_path / "notes.pdf", ["Meeting notes about the weather station.", SECRET])
    result = subprocess.run(
        [
            *(sys.executable, "-m", "app", "chat", "--json", "-t", "0", "--max-tokens", "14"),  # the default runtime
            *("--no-response-cache", "--attach", str(pdf), QUESTION),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "· attached notes.pdf (PDF, 2 pages)" in result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    assert "PINEAPPLE-42" in "".join(str(e["text"]) for e in events if e["type"] == "token")
    (stats,) = (e for e in events if e["type"] == "stats")
    assert int(stats["prompt_tokens"]) > 30  # the document went into the prompt


def test_a_backend_without_a_tokenizer_fits_documents_by_estimate(tmp_path: Path) -> None:
    """A remote engine (here the scripted backend: no tokenizer, a known window) estimates tokens to fit."""
    from app.core.engines.backend import ScriptedBackend
    from app.core.engines.session import ChatSession

    session = ChatSession(ScriptedBackend(context_window=512), system_prompt="Be brief.", params=GREEDY)
    small = extract_document(notes_file(tmp_path, paragraphs=1))
    assert message_with_documents(session, QUESTION, [small], "error") == compose_user_message(QUESTION, [small])
    big = extract_document(notes_file(tmp_path, paragraphs=60))
    with pytest.raises(DocumentsDoNotFitError, match="of the 512-token context window"):
        message_with_documents(session, QUESTION, [big], "error")
    trimmed = message_with_documents(session, QUESTION, [big], "trim")
    assert trimmed.endswith(QUESTION) and len(trimmed) < len(compose_user_message(QUESTION, [big]))
