"""`hearth engines add|list|rm|test` and `hearth chat --engine`, in-process, against a real HTTP server on 127.0.0.1
(the replay server) and an in-memory keyring."""

from __future__ import annotations

import io
import json
import socket
from collections.abc import Iterator

import pytest

from app.cli import main
from app.core.engines.remote import engines as reg
from tests.helpers import memory_keyring
from tests.helpers.replay_server import ReplayServer

KEY = "sk-proj-cli-test-key-0123456789"


@pytest.fixture
def keys() -> Iterator[memory_keyring.MemoryKeyring]:
    with memory_keyring.installed(memory_keyring.MemoryKeyring()) as backend:
        yield backend  # type: ignore[misc]


@pytest.fixture
def replay() -> Iterator[ReplayServer]:
    with ReplayServer().running() as server:
        yield server


def hearth(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_add_with_a_key_from_stdin_then_list(
    keys: memory_keyring.MemoryKeyring, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(KEY + "\n"))
    code, out, _ = hearth(capsys, "engines", "add", "openai", "--preset", "openai", "--key", "--model", "gpt-4o-mini")
    assert code == 0 and "key in the system keyring" in out
    assert keys.store[("hearth", "engine-key:openai")] == KEY
    code, out, _ = hearth(capsys, "engines", "list")
    assert code == 0 and "openai: openai-compatible at https://api.openai.com/v1 · key in keyring" in out
    code, out, _ = hearth(capsys, "engines", "list", "--json")
    row = json.loads(out)[0]
    assert row["key"] == "in keyring" and row["price_provider"] == "openai" and not row["response_cache"]
    assert KEY not in out and KEY not in reg.engines_path().read_text()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["engines", "add", "x"], "Give the engine's base URL with --url"),
        (["engines", "add", "x", "--preset", "anthropic"], "preset needs an API key: add --key"),
        (["engines", "add", "bad name", "--url", "http://h/v1"], "engine name must be letters, digits"),
        (["engines", "add", "x", "--url", "ftp://h"], "base URL must start with http:// or https://"),
        (["engines", "rm", "nope"], "There is no engine named 'nope'"),
        (["engines", "test", "nope"], "There is no engine named 'nope'"),
        (["chat", "--engine", "nope", "Hi"], "There is no engine named 'nope'"),
    ],
)
def test_user_errors_are_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    code, _, err = hearth(capsys, *argv)
    assert code == 2 and err.startswith("hearth: ") and message in err and err.count("\n") == 1


def test_adding_a_key_without_a_keyring_fails_before_asking(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.core.storage import secrets

    monkeypatch.setattr(secrets, "keyring_available", lambda: False)
    code, _, err = hearth(capsys, "engines", "add", "x", "--url", "http://h/v1", "--key")
    assert code == 2 and "never writes keys to files" in err
    assert not reg.engines_path().exists()


def test_test_lists_models_and_runs_a_tiny_completion(replay: ReplayServer, capsys: pytest.CaptureFixture[str]) -> None:
    replay.models = ["alpha", "beta"]
    replay.queue_file("ollama_stream.sse")
    assert hearth(capsys, "engines", "add", "local", "--url", replay.base_url)[0] == 0
    code, out, err = hearth(capsys, "engines", "test", "local")
    assert code == 0, err
    assert "GET /v1/models: 2 models" in err
    assert "Engine 'local' works. Models: alpha, beta. Test reply from alpha: 'Hi there'" in out
    assert replay.requests[-1].body is not None and replay.requests[-1].body["max_tokens"] == 8


def test_test_against_nothing_listening(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    hearth(capsys, "engines", "add", "gone", "--url", f"http://127.0.0.1:{port}/v1", "--model", "m")
    code, _, err = hearth(capsys, "engines", "test", "gone")
    assert code == 2 and "connection refused" in err and err.startswith("hearth: Cannot reach Engine 'gone'")


def test_test_with_a_rejected_key(
    replay: ReplayServer, keys: memory_keyring.MemoryKeyring, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setattr("sys.stdin", io.StringIO(KEY + "\n"))
    hearth(capsys, "engines", "add", "r", "--url", replay.base_url, "--key", "--model", "m")
    replay.queue_file("openai_401.json", status=401)
    code, _, err = hearth(capsys, "engines", "test", "r")
    assert code == 2 and "rejected the API key (401 Unauthorized)" in err
    assert replay.requests[-1].headers["authorization"] == f"Bearer {KEY}"  # the keyring's key was sent


def test_chat_with_an_engine_streams_json_with_cost(replay: ReplayServer, capsys: pytest.CaptureFixture[str]) -> None:
    hearth(capsys, "engines", "add", "r", "--url", replay.base_url, "--price-as", "openai")
    replay.queue_file("vllm_stream.sse")
    code, out, err = hearth(capsys, "chat", "--engine", "r", "--model", "gpt-4o-mini", "--json", "-t", "0", "Hi")
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert "".join(e["text"] for e in lines if e["type"] == "token") == "Paris is the capital."
    stats = next(e for e in lines if e["type"] == "stats")
    assert stats["prompt_tokens"] == 1200 and stats["cached_tokens"] == 1152 and stats["memory_device"] == "remote"
    cost = stats["cost"]
    # gpt-4o-mini: 48 new × $0.15/M + 1,152 cached × $0.075/M + 4 out × $0.60/M
    assert cost["total_usd"] == pytest.approx(48 * 0.15e-6 + 1152 * 0.075e-6 + 4 * 0.6e-6)
    assert cost["estimate"] is True and cost["conversation_total_usd"] == pytest.approx(cost["total_usd"])
    assert lines[-1] == {"type": "done", "finish_reason": "stop"}
    sent = replay.requests[-1].body
    assert sent is not None and sent["model"] == "gpt-4o-mini" and sent["temperature"] == 0.0


def test_chat_stats_line_shows_the_cost(replay: ReplayServer, capsys: pytest.CaptureFixture[str]) -> None:
    hearth(capsys, "engines", "add", "r", "--url", replay.base_url, "--price-as", "openai", "--model", "gpt-4o-mini")
    replay.queue_file("vllm_stream.sse")
    code, out, err = hearth(capsys, "chat", "--engine", "r", "--stats", "Hi")
    assert code == 0 and out.startswith("Paris is the capital.")
    assert "cost ~$0.0001 on openai/gpt-4o-mini (estimate)" in err and "caching saved" in err


def test_chat_engine_errors(replay: ReplayServer, capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    hearth(capsys, "engines", "add", "r", "--url", replay.base_url)
    replay.models = ["small", "large"]
    code, _, err = hearth(capsys, "chat", "--engine", "r", "Hi")
    assert code == 2 and err == (
        "hearth: Choose a model for engine 'r' with --model, or set one with `hearth engines add --model`: "
        "it serves large, small.\n"  # sorted, as GET /v1/models lists them here
    )
    replay.models = []
    code, _, err = hearth(capsys, "chat", "--engine", "r", "Hi")
    assert code == 2 and err.endswith("`hearth engines add --model`: it lists no models.\n")
    replay.queue_file("openai_404.json", status=404)
    code, _, err = hearth(capsys, "chat", "--engine", "r", "--model", "no-such-model", "Hi")
    assert code == 2 and err.startswith("hearth: Engine 'r'") and "has no model 'no-such-model'" in err
    replay.queue_file("error_chunk.sse")
    code, out, err = hearth(capsys, "chat", "--engine", "r", "--model", "m", "Hi")
    assert code == 1 and out.startswith("Half a") and "the reply failed: Engine 'r'" in err


def test_chat_with_an_engine_that_serves_one_model_uses_it_and_says_so(
    replay: ReplayServer, capsys: pytest.CaptureFixture[str]
) -> None:  # fmt: skip
    hearth(capsys, "engines", "add", "r", "--url", replay.base_url)  # no --model
    replay.models = ["only-model"]
    replay.queue_file("vllm_stream.sse")
    code, out, err = hearth(capsys, "chat", "--engine", "r", "Hi")
    assert code == 0 and out.startswith("Paris is the capital."), err
    assert "hearth: note: engine 'r' serves one model, only-model: using it (--model picks another)" in err
    assert replay.requests[-1].body is not None and replay.requests[-1].body["model"] == "only-model"


def test_chat_with_an_engine_whose_model_list_cannot_be_read(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    hearth(capsys, "engines", "add", "gone", "--url", f"http://127.0.0.1:{port}/v1")
    code, _, err = hearth(capsys, "chat", "--engine", "gone", "Hi")
    assert code == 2 and err.startswith("hearth: Choose a model for engine 'gone' with --model")
    assert "its model list could not be read:" in err and len(err.splitlines()) == 1


def test_chat_with_an_engine_sends_attached_documents(
    replay: ReplayServer, capsys: pytest.CaptureFixture[str], tmp_path
) -> None:  # fmt: skip
    hearth(capsys, "engines", "add", "r", "--url", replay.base_url, "--model", "m")
    doc = tmp_path / "notes.txt"
    doc.write_text("The secret code word is PINEAPPLE-42.")
    replay.queue_file("vllm_stream.sse")
    code, out, err = hearth(capsys, "chat", "--engine", "r", "--attach", str(doc), "What is the code word?")
    assert code == 0 and out.startswith("Paris is the capital."), err
    sent = replay.requests[-1].body
    assert sent is not None
    user = sent["messages"][-1]
    assert user["role"] == "user" and user["content"].startswith('<document name="notes.txt"')
    assert "PINEAPPLE-42" in user["content"] and user["content"].endswith("What is the code word?")
    assert "the engine's context window is unknown here, so the documents go whole" in err
