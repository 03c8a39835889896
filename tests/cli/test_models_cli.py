"""`hearth models`, `hearth pull`, `hearth rm`, `hearth token`: output, exit codes and error lines."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from keyring.backends import fail

from app.cli import main
from app.core.storage import secrets
from tests.helpers import fake_hub as fake_hub_module
from tests.helpers import memory_keyring
from tests.helpers.fake_hub import FakeHub, FakeRepo

TOKEN = "hf_CliTestToken0123456789abcdefABCDEF"


@pytest.fixture(autouse=True)
def isolated_hub_cache(hearth_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hearth_home / "hf-cache"))
    monkeypatch.setattr(secrets, "_session_token", None)


@pytest.fixture
def hub(tiny_model_dir, hearth_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:  # type: ignore[no-untyped-def]
    with fake_hub_module.serving(monkeypatch, hearth_home / "hf-cache", valid_tokens={TOKEN}) as server:
        server.add("org/tiny", FakeRepo.from_folder(tiny_model_dir("llama")))
        server.add("org/gated", FakeRepo.from_folder(tiny_model_dir("llama"), gated=True, allowed_tokens={TOKEN}))
        header = b"GGUF\x03\x00\x00\x00" + bytes(16)
        server.add("org/two-GGUF", FakeRepo(files={"a-Q4_K_M.gguf": header, "a-Q8_0.gguf": header * 2}))
        yield server


def test_models_lists_the_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "--no-verdict"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("NAME")
    assert "SmolLM2-135M-Instruct (default)" in out and "llama" in out and "135M" in out
    assert " 98.4 MB " in out.splitlines()[1]  # the file's size as the library window shows it


def test_models_json_has_a_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "--json", "--quant", "bf16", "--device", "cpu"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    default = rows[0]
    assert default["kind"] == "default" and default["context_length"] == 8192
    assert default["fits"] in ("yes", "offload", "no") and default["needs_bytes"] > 0
    assert (default["quantization"], default["device"]) == ("bf16", "cpu")


def test_models_recommended(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "--recommended", "--no-verdict"]) == 0
    out = capsys.readouterr().out
    assert "meta-llama/Llama-3.1-8B-Instruct" in out and "Llama 3.1 Community License" in out
    assert "hearth token set" in out


def test_models_add_reports_a_missing_path(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["models", "--add", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.startswith("hearth: No model at")


def test_pull_shows_progress_then_rm_deletes(hub: FakeHub, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pull", "org/tiny"]) == 0
    err = capsys.readouterr().err
    assert "org/tiny:" in err and "Memory (" in err
    assert "model.safetensors" in err and "100%" in err and "ETA" in err
    assert "Chat with it: hearth chat --model org/tiny" in err
    assert main(["models", "--no-verdict"]) == 0
    assert "org/tiny" in capsys.readouterr().out
    assert main(["rm", "org/tiny"]) == 0
    assert capsys.readouterr().out.startswith("Deleted org/tiny")
    assert main(["rm", "org/tiny"]) == 2
    assert "No model named 'org/tiny'" in capsys.readouterr().err


def test_pull_errors_are_one_line(hub: FakeHub, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pull", "org/gated"]) == 2
    assert capsys.readouterr().err.startswith("hearth: org/gated is gated: accept its licence")
    assert main(["pull", "org/two-GGUF"]) == 2
    assert "choose one with --file: a-Q4_K_M.gguf" in capsys.readouterr().err
    assert main(["pull", "org/two-GGUF", "--file", "a-Q8_0.gguf"]) == 0
    assert main(["pull", "not a repo"]) == 2
    assert "is not a Hugging Face repo id" in capsys.readouterr().err


def test_pull_a_gated_repo_with_a_token_from_the_keyring(hub: FakeHub, capsys: pytest.CaptureFixture[str]) -> None:
    with memory_keyring.installed(memory_keyring.MemoryKeyring()):
        secrets.save_hub_token(TOKEN)
        assert main(["pull", "org/gated"]) == 0
    assert TOKEN not in capsys.readouterr().err


def test_rm_refuses_the_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rm", "default"]) == 2
    assert "cannot be deleted" in capsys.readouterr().err


def test_token_set_status_clear(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    with memory_keyring.installed(memory_keyring.MemoryKeyring()) as backend:
        monkeypatch.setattr("sys.stdin", io.StringIO(TOKEN + "\n"))
        assert main(["token", "set"]) == 0
        assert backend.store == {("hearth", secrets.HUB_TOKEN_USERNAME): TOKEN}  # type: ignore[attr-defined]
        assert main(["token", "status"]) == 0
        assert "saved in the system keyring" in capsys.readouterr().out
        assert main(["token", "clear"]) == 0
        assert "removed" in capsys.readouterr().out
        assert main(["token", "clear"]) == 0
        assert "no Hub token to remove" in capsys.readouterr().out


def test_token_set_without_a_keyring_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with memory_keyring.installed(fail.Keyring()):
        monkeypatch.setattr("sys.stdin", io.StringIO(TOKEN + "\n"))
        assert main(["token", "set"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("hearth: No system keyring is available") and "HF_TOKEN" in err
        assert main(["token", "status"]) == 0
        assert "not set" in capsys.readouterr().out
