"""`hearth serve`: refusals before anything loads, the key in the keyring, and the real command end to end."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.cli import main
from app.cli.serve import KEY_PREFIX, config_from_args
from tests.helpers import memory_keyring

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def keys() -> Iterator[memory_keyring.MemoryKeyring]:
    with memory_keyring.installed(memory_keyring.MemoryKeyring()) as backend:
        yield backend


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--host", "0.0.0.0"], "Refusing to listen on 0.0.0.0: other machines could use the model."),
        (["--host", "10.1.2.3", "--allow-network"], "Refusing to listen on 10.1.2.3 without an API key"),
        (["--new-key"], "--new-key needs --api-key-name NAME"),
        (["--port", "70000"], "--port must be between 0 and 65535 (got 70000)."),
        (["--max-queue", "-1"], "--max-queue must be 0 or more."),
        (["--parallel", "0"], "--parallel must be between 1 and 16 (got 0)."),
    ],
)
def test_refusals_are_one_line_before_loading(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(["serve", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_missing_key_name_is_explained(keys: memory_keyring.MemoryKeyring, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--api-key-name", "laptop"]) == 2
    assert "No API key named 'laptop' in the system keyring; make one with" in capsys.readouterr().err


def test_new_key_goes_to_the_keyring_and_is_printed_once(
    keys: memory_keyring.MemoryKeyring, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.cli import build_parser

    args = build_parser().parse_args(["serve", "--api-key-name", "lan", "--new-key", "--host", "0.0.0.0",
                                      "--allow-network"])  # fmt: skip
    config = config_from_args(args)
    stored = keys.store[("hearth", KEY_PREFIX + "lan")]
    assert config.api_key == stored and stored.startswith("hearth-")
    assert capsys.readouterr().out.count(stored) == 1
    assert stored not in repr(config)
    again = config_from_args(build_parser().parse_args(["serve", "--api-key-name", "lan"]))
    assert again.api_key == stored  # read back, not made anew


def _default_sigint() -> None:
    """As a terminal's foreground process gets it: a shell that started the test run in the background passes
    SIGINT on as ignored, and Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize(
    ("stop_signal", "flags", "running"),
    [
        (signal.SIGINT, ["--quant", "bf16"], "one reply at a time"),  # the torch path decodes no batches
        (signal.SIGTERM, [], "4 replies decoded together"),  # the GGUF file's torch-free runtime
    ],
    ids=["ctrl-c-torch", "sigterm-torch-free"],
)
def test_serve_command_answers_the_openai_client(
    tmp_path: Path, stop_signal: signal.Signals, flags: list[str], running: str
) -> None:
    """The real command, in its own process, on the embedded model: starts, answers, stops on Ctrl+C or SIGTERM
    (SIGTERM with the signal dispositions this test run has, whatever they are)."""
    import openai

    env = {**os.environ, "PYTHONPATH": str(REPO), "HEARTH_HOME": str(tmp_path / "home")}
    process = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--port", "0", *flags, "--device", "cpu"],
        cwd=REPO, env=env, stderr=subprocess.PIPE, text=True,
        preexec_fn=_default_sigint if stop_signal == signal.SIGINT else None,
    )  # fmt: skip
    try:
        address = None
        lines = []
        deadline = time.monotonic() + 300
        assert process.stderr is not None
        while address is None and time.monotonic() < deadline:
            line = process.stderr.readline()
            if not line:
                break
            lines.append(line)
            if found := re.search(r"at (http://127\.0\.0\.1:\d+/v1) · no key", line):
                address = found.group(1)
        assert address is not None, "".join(lines)
        assert f"· {running} ·" in lines[-1]
        client = openai.OpenAI(base_url=address, api_key="none", max_retries=0)
        reply = client.chat.completions.create(
            model="x", messages=[{"role": "user", "content": "Say hi."}], max_tokens=5, temperature=0
        )
        assert reply.usage is not None and reply.usage.completion_tokens >= 1
        assert process.stderr.readline().startswith("127.0.0.1 POST /v1/chat/completions 200")
    finally:
        process.send_signal(stop_signal)
        # Keep reading stderr while it stops: a full pipe would block the process's own last lines.
        try:
            _, rest = process.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            process.kill()
            _, rest = process.communicate()
            pytest.fail(
                f"hearth serve did not stop within 90 s of {stop_signal.name}; its last output:\n{rest[-2000:]}"
            )
    assert process.returncode == 0, rest[-2000:]
