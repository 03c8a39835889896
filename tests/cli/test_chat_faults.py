"""Fault round cases seen from `hearth chat` and `hearth serve` as real processes: a full disk under HEARTH_HOME
(2.2), a chat template that tries to leave the sandbox (2.5), log records kept off the terminal (2.10)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.core.chat.response_cache import CachedReply, ResponseCache
from tests.helpers.full_disk import fill, small_filesystem
from tests.helpers.kernel_cache import seed_kernel

REPO = Path(__file__).resolve().parents[2]
ESCAPE = "{{ ''.__class__.__mro__[1].__subclasses__() }}"


def hearth(*args: str, home: Path, cache: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`hearth ARGS` in its own process; the cache under HEARTH_HOME unless `cache` is given. The plain decode path:
    nothing is packed (a model folder made for one test must not leave packed copies behind)."""
    env = {k: v for k, v in os.environ.items() if k != "HEARTH_CACHE_DIR"}
    env.update(PYTHONPATH=str(REPO), HEARTH_HOME=str(home), HEARTH_DECODE_PATH="eager")
    if cache is not None:
        env["HEARTH_CACHE_DIR"] = str(cache)
    return subprocess.run(
        [sys.executable, "-m", "app", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_chat_on_a_full_disk_replies_and_leaves_the_cache_untouched(tmp_path: Path, default_model_folder: Path) -> None:
    """2.2: before, the healthy responses.sqlite was moved aside as damaged and the reply crashed."""
    with small_filesystem(tmp_path / "home", size="4m") as home:
        cache_file = home / "cache" / "responses.sqlite"
        cache = ResponseCache(cache_file)
        cache.put("earlier", CachedReply(["An earlier reply."], "stop", 3))
        cache.close()
        before = hashlib.sha256(cache_file.read_bytes()).hexdigest()
        fill(home)
        result = hearth(
            "chat", "--model", str(default_model_folder), "--quant", "bf16", "-t", "0", "--max-tokens", "6", "Say hi.",
            home=home,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip()  # the reply was shown
        assert "Traceback" not in result.stderr and "WARNING" not in result.stderr
        notes = [line for line in result.stderr.splitlines() if "response cache" in line]
        assert len(notes) == 1
        assert notes[0].startswith(
            f"hearth: note: The response cache is off for this session: the disk holding {cache_file.parent} is full ("
        )
        assert hashlib.sha256(cache_file.read_bytes()).hexdigest() == before
        assert not list(cache_file.parent.glob("*.damaged*"))


def test_library_warnings_go_to_the_log_file_not_the_terminal(tmp_path: Path) -> None:
    """2.10: a damaged response cache is logged as a WARNING (to hearth.log) and told as a `hearth: note:`; the raw
    WARNING line reaches the terminal only with --verbose."""
    cache = tmp_path / "cache"
    seed_kernel(cache)
    (cache / "responses.sqlite").write_bytes(b"not a database at all" * 100)
    args = ("chat", "-t", "0", "--max-tokens", "3", "Hi")  # the default model, on the torch-free runtime
    quiet = hearth(*args, home=tmp_path / "home", cache=cache)
    assert quiet.returncode == 0, quiet.stderr
    assert not [line for line in quiet.stderr.splitlines() if line.startswith(("WARNING", "ERROR", "INFO"))]
    assert any(line.startswith("hearth: note: The response cache") for line in quiet.stderr.splitlines())
    log = (tmp_path / "home" / "logs" / "hearth.log").read_text(encoding="utf-8")
    assert "WARNING MainThread app.core.chat.response_cache: response cache" in log
    (cache / "responses.sqlite").write_bytes(b"damaged again" * 100)
    verbose = hearth("--verbose", *args, home=tmp_path / "home", cache=cache)
    assert "WARNING app.core.chat.response_cache: response cache" in verbose.stderr


def hostile_model(tmp_path: Path, default_model_folder: Path, in_jinja: bool) -> Path:
    """The default model with a chat template that reaches for Python's classes (weights linked, not copied)."""
    folder = tmp_path / "hostile-model"
    folder.mkdir()
    for item in default_model_folder.iterdir():
        if item.suffix == ".safetensors":
            (folder / item.name).symlink_to(item)
        elif item.name != "chat_template.jinja" or in_jinja:
            shutil.copy(item, folder / item.name)
    if in_jinja:
        (folder / "chat_template.jinja").write_text(ESCAPE, encoding="utf-8")
    else:
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": ESCAPE}), encoding="utf-8")
    return folder


@pytest.mark.parametrize(
    ("command", "in_jinja"),
    [(["serve", "--port", "0"], True), (["chat", "-t", "0", "Hi"], False)],
    ids=["serve-chat_template.jinja", "chat-tokenizer_config.json"],
)
def test_a_template_that_escapes_the_sandbox_is_refused_at_load(
    tmp_path: Path, default_model_folder: Path, command: list[str], in_jinja: bool
) -> None:
    """2.5: one `hearth:` line naming the file and the template, exit 2; the server never starts on it."""
    folder = hostile_model(tmp_path, default_model_folder, in_jinja)
    file_name = "chat_template.jinja" if in_jinja else "tokenizer_config.json"
    result = hearth(command[0], "--model", str(folder), "--quant", "bf16", *command[1:], home=tmp_path / "home",
                    timeout=300)  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "SecurityError" not in result.stderr
    assert "Serving" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"hearth: The chat template in {folder / file_name} tries to reach outside the template sandbox (it reads "
        "the attribute '__class__'); Hearth will not use this model with it."
    )


def test_a_gguf_whose_template_escapes_the_sandbox_is_refused_at_load(tmp_path: Path) -> None:
    """2.5 for a GGUF (the template in its header), on the runtime that takes it: one line naming the file, exit 2."""
    import dataclasses

    from tests.helpers.gguf_files import byte_level_bpe, llama_gguf_tensors, tiny_llama, write_gguf

    model, values = tiny_llama()
    spec = dataclasses.replace(byte_level_bpe(), chat_template=ESCAPE)
    path = write_gguf(tmp_path / "hostile.gguf", spec, llama_gguf_tensors(model.state_dict(), values, 0, None),
                      shape=values)  # fmt: skip
    seed_kernel(tmp_path / "cache")  # the runtime loads the kernel before it reads the template: no -O3 compile here
    result = hearth("chat", "--model", str(path), "--device", "cpu", "-t", "0", "Hi", home=tmp_path / "home",
                    cache=tmp_path / "cache", timeout=300)  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith(
            f"hearth: The chat template in {path} tries to reach outside the template sandbox (it reads the attribute "
            "'__class__'); Hearth will not use this model with it."
        )
    )
