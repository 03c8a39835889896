"""One runtime behind every front end (issue 31): the same greedy request gives the same tokens through `hearth chat`,
the window's worker, the window's Server switch and `hearth serve`, all on the torch-free runtime."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai
import pytest
from PySide6.QtCore import QObject, Signal, Slot

from app.core.chat.events import ChatMessage, ReplyStats
from app.core.chat.sampling import SamplingParams
from app.core.engines.backend import LoadRequest, ReplyRequest
from app.core.fastpath import kernel
from app.ui.worker import GenerateRequest, WorkerHost
from tests.helpers.serve_process import hearth_serve

KERNEL = kernel.load_library()
pytestmark = pytest.mark.skipif(isinstance(KERNEL, str), reason=f"no kernel library here: {KERNEL}")
REPO = Path(__file__).resolve().parents[2]
SYSTEM = "You are a helpful assistant."  # the settings' default system prompt, which `hearth chat` sends
PROMPT = "Write the opening sentence of a story about a lighthouse keeper."
TOKENS = 40


class Relay(QObject):
    """The worker's signals, received in the GUI thread as the window receives them."""

    loaded = Signal(object)
    finished = Signal(int, str, str, str)
    server_started = Signal(str)

    def __init__(self, host: WorkerHost) -> None:
        super().__init__()
        self.stats: list[ReplyStats] = []
        host.worker.model_loaded.connect(self.on_loaded)
        host.worker.stats.connect(self.on_stats)
        host.worker.finished.connect(self.on_finished)
        host.worker.server_started.connect(self.on_server_started)

    @Slot(object)
    def on_loaded(self, info: object) -> None:
        self.loaded.emit(info)

    @Slot(int, object)
    def on_stats(self, rid: int, stats: object) -> None:
        assert isinstance(stats, ReplyStats)
        self.stats.append(stats)

    @Slot(int, str, str, str)
    def on_finished(self, rid: int, reason: str, text: str, error: str) -> None:
        self.finished.emit(rid, reason, text, error)

    @Slot(str)
    def on_server_started(self, address: str) -> None:
        self.server_started.emit(address)


def through_the_cli(home: Path) -> tuple[str, int, str]:
    result = subprocess.run(
        [sys.executable, "-m", "app", "chat", PROMPT, "--device", "cpu", "--temperature", "0", "--max-tokens",
         str(TOKENS), "--no-response-cache", "--json"],
        capture_output=True, text=True, cwd=REPO, env={**os.environ, "HEARTH_HOME": str(home)}, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    events = [json.loads(line) for line in result.stdout.splitlines()]
    stats = next(e for e in events if e["type"] == "stats")
    return "".join(e["text"] for e in events if e["type"] == "token"), stats["generated_tokens"], stats["decode_path"]


def through_the_api(base_url: str) -> tuple[str, int]:
    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=600)
    reply = client.chat.completions.create(
        model="x", messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPT}],
        temperature=0, max_tokens=TOKENS,
    )  # fmt: skip
    assert reply.usage is not None
    return reply.choices[0].message.content or "", reply.usage.completion_tokens


def test_the_same_greedy_reply_through_every_front_end(qtbot: Any, tmp_path: Path) -> None:
    from app.core.engines.lite.backend import lite_candidate

    assert not isinstance(lite_candidate(LoadRequest(None, device="cpu")), str)  # the runtime takes the GGUF
    cli_text, cli_tokens, cli_path = through_the_cli(tmp_path / "cli-home")
    assert cli_path == "lite-gguf" and cli_tokens > 5

    with hearth_serve(tmp_path / "serve-home", "--device", "cpu") as served:
        assert served.runtime.startswith("hearth: runtime: torch-free")
        assert through_the_api(served.base_url) == (cli_text, cli_tokens)

    host = WorkerHost()  # the window's worker with the window's own load path
    relay = Relay(host)
    try:
        with qtbot.waitSignal(relay.loaded, timeout=300_000):
            host.load(LoadRequest(None, device="cpu", response_cache=False))
        request = ReplyRequest((ChatMessage("system", SYSTEM), ChatMessage("user", PROMPT)),
                               SamplingParams(temperature=0, max_new_tokens=TOKENS), conversation_id=1)  # fmt: skip
        with qtbot.waitSignal(relay.finished, timeout=300_000) as finished:
            host.generate(GenerateRequest(host.next_request_id(), request))
        assert finished.args[2] == cli_text
        assert (relay.stats[-1].generated_tokens, relay.stats[-1].decode_path) == (cli_tokens, "lite-gguf")

        with qtbot.waitSignal(relay.server_started, timeout=60_000) as started:  # the window's Server switch
            host.start_server(0)
        assert through_the_api(started.args[0]) == (cli_text, cli_tokens)
    finally:
        host.shutdown()
