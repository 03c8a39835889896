"""Downloads through huggingface_hub against a Hub-shaped server on 127.0.0.1 serving a tiny model."""

from __future__ import annotations

import errno
import hashlib
import logging
import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.core.models import hub
from app.core.models.hub import HubClient
from app.core.models.hub_repo import (
    BadRepoReferenceError,
    CorruptDownloadError,
    DiskFullError,
    DownloadCancelled,
    DownloadProgress,
    FileChoiceNeededError,
    GatedModelError,
    HubFileNotFoundError,
    HubUnreachableError,
    InvalidHubTokenError,
    NoSafeWeightsError,
    RepoNotFoundError,
    parse_repo_reference,
)
from app.core.storage import paths, secrets
from tests.helpers import fake_hub as fake_hub_module
from tests.helpers import memory_keyring
from tests.helpers.fake_hub import FakeHub, FakeRepo

GOOD_TOKEN = "hf_GoodTokenForTestsOnly0123456789abcd"
NO_ACCESS_TOKEN = "hf_NoAccessTokenForTests0123456789abcd"
REPO = "test-org/tiny-llama"
GATED = "test-org/tiny-gated"


@pytest.fixture(scope="module")
def tiny_folder(tiny_model_dir) -> Path:  # type: ignore[no-untyped-def]
    return tiny_model_dir("llama")


@pytest.fixture
def fake_hub(tiny_folder: Path, hearth_home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    monkeypatch.setattr(secrets, "_session_token", None)
    with fake_hub_module.serving(
        monkeypatch, hearth_home / "hf-cache", valid_tokens={GOOD_TOKEN, NO_ACCESS_TOKEN}
    ) as server:
        server.add(REPO, FakeRepo.from_folder(tiny_folder))
        server.repos[REPO].files["pytorch_model.bin"] = b"pickle weights must never be fetched"
        server.repos[REPO].files["onnx/model.onnx"] = b"not for us"
        gated = FakeRepo.from_folder(tiny_folder, gated=True, allowed_tokens={GOOD_TOKEN}, license="llama3.2")
        server.add(GATED, gated)
        yield server


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_repo_references_accept_ids_and_urls() -> None:
    assert parse_repo_reference("org/name").repo_id == "org/name"
    assert parse_repo_reference("https://huggingface.co/org/name").repo_id == "org/name"
    ref = parse_repo_reference("https://huggingface.co/org/name-GGUF/blob/main/model-Q4_K_M.gguf")
    assert (ref.repo_id, ref.filename, ref.revision) == ("org/name-GGUF", "model-Q4_K_M.gguf", "main")
    assert parse_repo_reference("hf.co/org/name/tree/dev").revision == "dev"
    with pytest.raises(BadRepoReferenceError, match="not a Hugging Face repo id"):
        parse_repo_reference("not a repo/with/too many parts")
    with pytest.raises(BadRepoReferenceError, match="Give a Hugging Face repo id"):
        parse_repo_reference("  ")


def test_config_comes_first_then_only_safe_weights(fake_hub: FakeHub, tiny_folder: Path) -> None:
    client = HubClient()  # endpoint from HF_ENDPOINT, read now (not at import)
    plan = client.prepare(REPO)
    # The planner's input is here before a single weight byte was requested.
    assert plan.config is not None and plan.config["hidden_size"] == 64
    assert fake_hub.downloads_of("model.safetensors") == []
    names = {f.name for f in plan.files}
    assert "model.safetensors" in names and "config.json" in names and "tokenizer.json" in names
    assert "pytorch_model.bin" not in names and "onnx/model.onnx" not in names

    events: list[DownloadProgress] = []
    snapshot = client.download(plan, progress=events.append)

    assert sha256_of(snapshot / "model.safetensors") == sha256_of(tiny_folder / "model.safetensors")
    assert not (snapshot / "pytorch_model.bin").exists()
    assert fake_hub.downloads_of("pytorch_model.bin") == []
    done = [e.done_bytes for e in events]
    assert done == sorted(done), "progress never goes backwards"
    assert events[-1].stage == "done" and events[-1].done_bytes == plan.total_bytes
    assert any(e.bytes_per_s for e in events), "a speed is reported while downloading"
    assert any(e.eta_s is not None and e.stage == "downloading" for e in events)
    assert len([e for e in events if e.file == "model.safetensors"]) >= 3
    assert hub.pending_downloads() == []

    # The repo id now resolves offline and loads through the real loader.
    from app.core.models.model_source import resolve_model

    source = resolve_model(REPO)
    assert source.kind == "hub" and source.path == snapshot


def test_downloaded_model_loads(fake_hub: FakeHub) -> None:
    from app.core.engines.loader import load_model

    client = HubClient()
    client.download(client.prepare(REPO))
    loaded = load_model(REPO, quantization="fp32", device="cpu")
    assert loaded.model.config.hidden_size == 64


def test_pause_then_resume_after_restart_uses_a_range_request(fake_hub: FakeHub, tiny_folder: Path) -> None:
    cancel = threading.Event()

    def pause_midway(event: DownloadProgress) -> None:
        if event.file == "model.safetensors" and event.done_bytes > event.total_bytes // 3:
            cancel.set()

    client = HubClient()
    plan = client.prepare(REPO)
    with pytest.raises(DownloadCancelled):
        client.download(plan, progress=pause_midway, cancel=cancel)
    partials = list((hub.hub_cache_dir()).rglob(f"*{hub.PARTIAL_SUFFIX}"))
    assert len(partials) == 1
    kept = partials[0].stat().st_size
    assert 0 < kept < (tiny_folder / "model.safetensors").stat().st_size
    assert [p.repo_id for p in hub.pending_downloads()] == [REPO]

    # A new client and a fresh plan, as after a restart: the plan knows what is on disk already.
    restarted = HubClient()
    again = restarted.prepare(REPO)
    assert again.present_bytes >= kept
    snapshot = restarted.download(again)
    ranges = [r.range for r in fake_hub.downloads_of("model.safetensors")]
    assert ranges[-1] == f"bytes={kept}-"
    assert sha256_of(snapshot / "model.safetensors") == sha256_of(tiny_folder / "model.safetensors")
    assert not list(hub.hub_cache_dir().rglob(f"*{hub.PARTIAL_SUFFIX}"))
    assert hub.pending_downloads() == []


def test_a_server_ignoring_the_range_request_still_gives_a_whole_file(fake_hub: FakeHub, tiny_folder: Path) -> None:
    cancel = threading.Event()
    client = HubClient()
    plan = client.prepare(REPO)
    with pytest.raises(DownloadCancelled):
        client.download(
            plan, progress=lambda e: cancel.set() if e.file.endswith(".safetensors") else None, cancel=cancel
        )
    fake_hub.ignore_range = True
    snapshot = client.download(client.prepare(REPO))  # 200 instead of 206: the partial file is rewritten from 0
    assert fake_hub.downloads_of("model.safetensors")[-1].range is not None
    assert sha256_of(snapshot / "model.safetensors") == sha256_of(tiny_folder / "model.safetensors")


def test_discard_deletes_the_partial_file(fake_hub: FakeHub) -> None:
    cancel = threading.Event()
    client = HubClient()
    plan = client.prepare(REPO)
    with pytest.raises(DownloadCancelled):
        client.download(
            plan, progress=lambda e: cancel.set() if e.file.endswith(".safetensors") else None, cancel=cancel
        )
    client.discard(plan)
    assert not list(hub.hub_cache_dir().rglob(f"*{hub.PARTIAL_SUFFIX}"))
    assert hub.pending_downloads() == []


def test_a_dropped_connection_resumes_where_it_stopped(fake_hub: FakeHub, tiny_folder: Path) -> None:
    fake_hub.stop_after_bytes = 3 << 20
    client = HubClient()
    snapshot = client.download(client.prepare(REPO))
    ranges = [r.range for r in fake_hub.downloads_of("model.safetensors")]
    assert ranges[0] is None and ranges[-1] is not None and ranges[-1].startswith("bytes=")
    assert sha256_of(snapshot / "model.safetensors") == sha256_of(tiny_folder / "model.safetensors")


def test_a_corrupted_download_is_caught_and_deleted(fake_hub: FakeHub) -> None:
    fake_hub.repos[REPO].corrupt.add("model.safetensors")
    client = HubClient()
    with pytest.raises(CorruptDownloadError, match="corrupted \\(checksum mismatch\\)"):
        client.download(client.prepare(REPO))
    cache = hub.hub_cache_dir()
    assert not list(cache.rglob(f"*{hub.PARTIAL_SUFFIX}"))
    assert not list(cache.rglob("model.safetensors"))
    # The next try, with the server fixed, succeeds from scratch.
    fake_hub.repos[REPO].corrupt.clear()
    snapshot = client.download(client.prepare(REPO))
    assert (snapshot / "model.safetensors").is_file()


def test_gated_repo_without_a_token_says_what_to_do(fake_hub: FakeHub) -> None:
    with pytest.raises(GatedModelError, match=r"is gated: accept its licence .* `hearth token set`"):
        HubClient(token=None).prepare(GATED)
    assert fake_hub.downloads_of("model.safetensors") == []


def test_gated_repo_with_a_token_lacking_access(fake_hub: FakeHub) -> None:
    with pytest.raises(GatedModelError, match="your Hub token has no access"):
        HubClient(token=NO_ACCESS_TOKEN).prepare(GATED)


def test_an_invalid_token_is_reported_as_such(fake_hub: FakeHub) -> None:
    with pytest.raises(InvalidHubTokenError, match="rejected your token"):
        HubClient(token="hf_ThisTokenDoesNotExist000000000000").prepare(REPO)


def test_gated_repo_with_the_keyring_token_downloads_and_leaks_nothing(
    fake_hub: FakeHub, hearth_home: Path, isolated_cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with memory_keyring.installed(memory_keyring.MemoryKeyring()):
        secrets.save_hub_token(GOOD_TOKEN)
        client = HubClient.default()
        assert client.token == GOOD_TOKEN
        log_file = paths.log_dir() / "hearth.log"
        handler = logging.FileHandler(log_file)
        handler.setFormatter(logging.Formatter("%(name)s %(message)s"))
        root = logging.getLogger()
        root.addHandler(handler)
        previous_level = root.level
        root.setLevel(logging.DEBUG)
        try:
            with caplog.at_level(logging.DEBUG):
                snapshot = client.download(client.prepare(GATED))
                logging.getLogger("hearth.test").warning("header was Bearer %s", GOOD_TOKEN)
        finally:
            root.removeHandler(handler)
            root.setLevel(previous_level)
            handler.close()
    assert (snapshot / "model.safetensors").is_file()
    assert all(r.authorized for r in fake_hub.requests if r.path.startswith(f"/{GATED}/resolve"))
    assert GOOD_TOKEN not in caplog.text and secrets.REDACTED in caplog.text
    scanned = 0
    for root_dir in (hearth_home, isolated_cache):
        for path in root_dir.rglob("*"):
            if path.is_file():
                scanned += 1
                assert GOOD_TOKEN.encode() not in path.read_bytes(), f"token written to {path}"
    assert scanned >= 5 and log_file.is_file()


def test_disk_full_is_caught_before_anything_downloads(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    client = HubClient()
    plan = client.prepare(REPO)
    usage = shutil.disk_usage(".")
    monkeypatch.setattr(hub.shutil, "disk_usage", lambda _path: usage._replace(free=1_000_000))
    with pytest.raises(DiskFullError, match=r"Not enough disk space .* nothing was downloaded") as caught:
        client.download(plan)
    assert caught.value.needed_bytes == plan.remaining_bytes
    assert fake_hub.downloads_of("model.safetensors") == []
    assert not list(hub.hub_cache_dir().rglob(f"*{hub.PARTIAL_SUFFIX}"))


def test_disk_filling_up_mid_download_keeps_the_partial_file(
    fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = hub._PartialFile.write

    def write_until_full(self: hub._PartialFile, data: bytes) -> int:
        if self.tell() >= 2 << 20:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(self, data)

    monkeypatch.setattr(hub._PartialFile, "write", write_until_full)
    client = HubClient()
    with pytest.raises(DiskFullError, match="is full: free some space"):
        client.download(client.prepare(REPO))
    partials = list(hub.hub_cache_dir().rglob(f"*{hub.PARTIAL_SUFFIX}"))
    assert len(partials) == 1 and partials[0].stat().st_size == 2 << 20


def test_network_down_is_a_clear_error(fake_hub: FakeHub) -> None:
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    with pytest.raises(HubUnreachableError, match="Cannot reach the Hugging Face Hub"):
        HubClient(endpoint=f"http://127.0.0.1:{closed_port}").prepare(REPO)


def test_offline_mode_is_named(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(HubUnreachableError, match="offline mode is on"):
        HubClient().prepare(REPO)


def test_unknown_repo_and_unknown_file(fake_hub: FakeHub) -> None:
    with pytest.raises(RepoNotFoundError, match="There is no model test-org/nope"):
        HubClient().prepare("test-org/nope")
    with pytest.raises(HubFileNotFoundError, match=r"has no file 'missing\.gguf'"):
        HubClient().prepare(REPO, file="missing.gguf")


def test_gguf_repos_need_a_file_choice(fake_hub: FakeHub) -> None:
    gguf_header = b"GGUF\x03\x00\x00\x00" + bytes(16)
    fake_hub.add(
        "test-org/tiny-GGUF",
        FakeRepo(files={"m-Q4_K_M.gguf": gguf_header * 3, "m-Q8_0.gguf": gguf_header * 5, "README.md": b"hi"}),
    )
    with pytest.raises(FileChoiceNeededError, match="holds 2 GGUF files; choose one with --file") as caught:
        HubClient().prepare("test-org/tiny-GGUF")
    assert caught.value.choices == ["m-Q4_K_M.gguf", "m-Q8_0.gguf"]
    plan = HubClient().prepare("test-org/tiny-GGUF", file="m-Q8_0.gguf")
    assert [f.name for f in plan.files] == ["m-Q8_0.gguf"] and plan.config is None
    snapshot = HubClient().download(plan)
    assert (snapshot / "m-Q8_0.gguf").read_bytes() == gguf_header * 5
    # A URL naming the file picks it too.
    by_url = HubClient().prepare(f"{fake_hub.endpoint}/test-org/tiny-GGUF/blob/main/m-Q4_K_M.gguf")
    assert [f.name for f in by_url.files] == ["m-Q4_K_M.gguf"]


def test_pickle_only_repos_are_refused(fake_hub: FakeHub) -> None:
    fake_hub.add("test-org/old", FakeRepo(files={"config.json": b"{}", "pytorch_model.bin": b"x" * 10}))
    with pytest.raises(NoSafeWeightsError, match="only pickle weights"):
        HubClient().prepare("test-org/old")
