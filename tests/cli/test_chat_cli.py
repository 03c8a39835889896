"""`hearth chat` end to end in a subprocess, and its user errors in-process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import main
from app.cli.selftest import PROMPT as SELFTEST_PROMPT
from tests.helpers.fresh_process import run_fresh


def hearth(*args: str, stdin: str | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def events(stdout: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def test_chat_streams_a_real_answer_as_json_lines() -> None:
    result = hearth("chat", "--json", "-t", "0", "--max-tokens", "24", SELFTEST_PROMPT)  # a wide margin (selftest.py)
    assert result.returncode == 0, result.stderr
    lines = events(result.stdout)
    tokens = [e for e in lines if e["type"] == "token"]
    assert len(tokens) > 3 and "Tokyo" in "".join(str(e["text"]) for e in tokens)
    stats = next(e for e in lines if e["type"] == "stats")
    for field in (
        "ttft_s",
        "prompt_tokens",
        "cached_tokens",
        "prefill_tokens_per_s",
        "decode_tokens_per_s",
        "generated_tokens",
    ):
        assert field in stats
    assert lines[-1]["type"] == "done" and lines[-1]["finish_reason"] in ("stop", "length")
    assert "Traceback" not in result.stderr


def test_json_stdin_turns_share_one_conversation_and_its_cache() -> None:
    result = hearth(
        "chat", "--json", "-t", "0", "--max-tokens", "8", "--no-response-cache",
        stdin="My name is Ada.\nWhat is my name?\n",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    stats = [e for e in events(result.stdout) if e["type"] == "stats"]
    dones = [e for e in events(result.stdout) if e["type"] == "done"]
    assert len(stats) == 2 and len(dones) == 2
    assert stats[0]["cached_tokens"] == 0
    assert int(stats[1]["cached_tokens"]) > 10  # turn 2 reused turn 1's KV cache


def test_a_turn_that_cannot_run_is_explained_and_the_chat_goes_on() -> None:
    too_long = "word " * 200  # over the 64-token window: refused whole, never truncated
    flags = ("chat", "-t", "0", "--context", "64", "--max-tokens", "4", "--no-response-cache")
    plain = hearth(*flags, stdin=f"{too_long}\nSay hi.\n")
    assert plain.returncode == 0, plain.stderr
    refusal = [line for line in plain.stderr.splitlines() if line.startswith("hearth: The prompt is")]
    assert len(refusal) == 1 and "context window is 64 tokens" in refusal[0], plain.stderr
    assert plain.stdout.strip()  # the next turn was answered
    as_json = hearth(*flags, "--json", stdin=f"{too_long}\nSay hi.\n")
    assert as_json.returncode == 0, as_json.stderr
    lines = events(as_json.stdout)
    assert lines[0]["type"] == "error" and "context window is 64 tokens" in str(lines[0]["message"])
    assert [e["type"] for e in lines[1:]][-1] == "done" and any(e["type"] == "token" for e in lines[1:])


def test_stats_flag_prints_the_figures(tmp_path: Path) -> None:
    """On the torch runtime (--quant bf16); the tests above run the default, torch-free one."""
    result = hearth(
        "chat", "--stats", "-t", "0", "--quant", "bf16", "--max-tokens", "4", "--no-response-cache", "Hello"
    )
    assert result.returncode == 0, result.stderr
    assert "first token" in result.stderr and "cached" in result.stderr and "peak" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["chat", "--model", "/definitely/not/here", "hi"], "No model at /definitely/not/here"),
        (["chat", "--temperature", "-1", "hi"], "temperature must be 0 or more"),
        (["chat", "--top-p", "2", "hi"], "top-p must be in (0, 1]"),
        (["chat", "--max-tokens", "0", "hi"], "max new tokens must be at least 1"),
        (["chat", "--context", "3", "hi"], "context length must be at least 16"),
        (["chat", "--quant", "q9", "hi"], "invalid choice: 'q9'"),
        (["chat", "--device", "tpu", "hi"], "invalid choice: 'tpu'"),
    ],
)
def test_user_errors_print_one_line_and_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(args)
    except SystemExit as exit_:  # argparse's own refusals (a bad choice) exit from inside main
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.startswith("hearth:") and err.count("\n") == 1, err  # one line, no usage text, no traceback


def test_missing_gpu_is_reported_not_silently_replaced(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    assert main(["chat", "--device", "cuda", "hi"]) == 2
    assert "--device cpu" in capsys.readouterr().err


def test_pickle_folder_refused_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    (tmp_path / "pytorch_model.bin").write_bytes(b"x")
    assert main(["chat", "--model", str(tmp_path), "hi"]) == 2
    assert "--allow-pickle" in capsys.readouterr().err


def test_empty_prompt_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["chat", "--quant", "bf16", "   "]) == 2
    assert "The prompt is empty" in capsys.readouterr().err


def test_a_model_that_is_not_there_is_said_before_torch_is_imported() -> None:
    """The torch-free runtime declines a path it can't find; the load must not import torch (~3 s) to say so."""
    done = run_fresh("from app.cli import main\nprint(main(['chat', '--model', '/definitely/not/here.gguf', 'hi']))\n")
    assert done.out == "2" and "torch" not in done.imported
    assert done.err == "hearth: No model at /definitely/not/here.gguf: the path does not exist."
