"""The model library: what is on disk, deleting it safely, the curated list and the planner's verdicts."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from app.core.errors import ModelNotFoundError
from app.core.memory import verdict as fit
from app.core.memory.planner import plan_memory
from app.core.models import library
from app.core.models.library import LibraryError
from app.core.storage import paths


@pytest.fixture
def hf_cache(hearth_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from huggingface_hub import constants

    cache = hearth_home / "hf-cache"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def write_hub_repo(cache: Path, repo_id: str, files: dict[str, bytes]) -> Path:
    """The Hub cache layout huggingface_hub writes: blobs by hash, snapshot symlinks, refs/main."""
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    storage = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = storage / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (storage / "blobs").mkdir()
    (storage / "refs").mkdir()
    (storage / "refs" / "main").write_text(commit)
    for name, data in files.items():
        blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / name).symlink_to(Path("../../blobs") / blob.name)
    return snapshot


def config_bytes(**overrides: object) -> bytes:
    config = {"model_type": "qwen2", "hidden_size": 64, "max_position_embeddings": 4096, **overrides}
    return json.dumps(config).encode()


def test_the_default_model_is_listed_first_with_its_numbers(hf_cache: Path) -> None:
    models = library.list_models()
    default = models[0]
    assert default.kind == "default" and default.spec == "default"
    assert default.architecture == "llama" and default.context_length == 8192
    assert default.parameters == 134_515_008  # SmolLM2-135M, counted from the GGUF's tensors
    assert default.size_bytes == default.path.stat().st_size
    assert not default.deletable
    with pytest.raises(LibraryError, match="part of the installation and cannot be deleted"):
        library.delete_model(default)
    assert default.path.exists()


def test_hub_cache_repos_are_listed_and_deleted(hf_cache: Path) -> None:
    weights = b"w" * 5000
    snapshot = write_hub_repo(hf_cache, "org/small", {"config.json": config_bytes(), "model.safetensors": weights})
    write_hub_repo(hf_cache, "org/paused", {"config.json": config_bytes()})
    by_spec = {m.spec: m for m in library.list_models()}
    small = by_spec["org/small"]
    assert small.kind == "hub" and small.path == snapshot and small.complete
    assert small.architecture == "qwen2" and small.context_length == 4096
    # Blobs plus refs/main (a 40-character commit); the snapshot symlinks are not counted again.
    assert small.size_bytes == len(weights) + len(config_bytes()) + 40
    assert not by_spec["org/paused"].complete

    message = library.delete_model(library.find_model("org/small"))
    assert message.startswith("Deleted org/small")
    assert not (hf_cache / "models--org--small").exists()
    assert (hf_cache / "models--org--paused").exists()
    assert "org/small" not in {m.spec for m in library.list_models()}


def test_converted_caches_are_no_models_but_are_listed_apart_and_deleted(isolated_cache: Path) -> None:
    folder = paths.converted_models_dir() / "tiny-0123456789abcdef"
    folder.mkdir()
    (folder / "config.json").write_bytes(config_bytes(model_type="llama"))
    (folder / "model.safetensors").write_bytes(b"x" * 100)
    (paths.converted_models_dir() / ".convert-staging").mkdir()  # a conversion in progress: not a model
    assert all(m.kind != "converted" for m in library.list_models())  # a copy of a model listed already
    converted = library.cached_conversions()
    assert [m.name for m in converted] == ["tiny-0123456789abcdef"]
    assert library.find_model("tiny-0123456789abcdef") == converted[0]  # `hearth rm` still finds it
    assert converted[0].architecture == "llama"
    library.delete_model(converted[0])
    assert not folder.exists()


def test_user_folders_are_added_and_forgotten_but_never_deleted(tmp_path: Path, tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    source = tiny_model_dir("qwen2")
    folder = tmp_path / "my-model"
    shutil.copytree(source, folder)
    added = library.add_path(folder)
    assert added.kind == "folder" and added.architecture == "qwen2" and added.context_length == 512
    assert json.loads((paths.config_dir() / "library.json").read_text())["paths"] == [str(folder.resolve())]
    assert library.find_model(str(folder.resolve())).name == "my-model"
    message = library.delete_model(added)
    assert "files at" in message and "were kept" in message
    assert (folder / "model.safetensors").is_file()
    assert all(m.kind != "folder" for m in library.list_models())


def test_adding_a_gguf_file_reads_its_metadata(tmp_path: Path) -> None:
    from app.core.models.model_source import default_model_gguf

    gguf = tmp_path / "copy.gguf"
    gguf.symlink_to(default_model_gguf())
    added = library.add_path(gguf)
    assert added.kind == "gguf" and added.architecture == "llama" and added.parameters == 134_515_008


def test_adding_bad_paths_is_refused_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="the path does not exist"):
        library.add_path(tmp_path / "nope")
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(LibraryError, match=r"neither a model folder nor a \.gguf file"):
        library.add_path(tmp_path / "notes.txt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(LibraryError, match=r"no config\.json or \.gguf file"):
        library.add_path(tmp_path / "empty")
    assert library.user_paths() == []


def test_a_truncated_gguf_is_listed_without_numbers(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x01" * 10)
    added = library.add_path(broken)
    assert added.architecture is None and added.parameters is None


def test_unknown_names_list_what_exists(hf_cache: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="No model named 'nope' in the library \\(models: default"):
        library.find_model("nope")


def estimated_parameters(config: dict[str, int]) -> int:
    """Count a decoder's parameters from its config (embeddings, attention, MLP, norms, head)."""
    hidden, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim", hidden // heads)
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    if config["model_type"] == "qwen2":
        attention += heads * head_dim + 2 * kv_heads * head_dim  # q/k/v biases
    norms = (4 if config["model_type"] == "gemma2" else 2) * hidden
    per_layer = attention + 3 * hidden * config["intermediate_size"] + norms
    head = 0 if config["tie_word_embeddings"] else vocab * hidden
    return vocab * hidden + layers * per_layer + hidden + head


def test_recommended_list_is_accurate_and_ordered() -> None:
    entries = library.recommended_models()
    assert len(entries) >= 12
    assert [e.parameters for e in entries] == sorted(e.parameters for e in entries)
    ids = {e.repo_id for e in entries}
    assert {
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        "Qwen/Qwen2.5-7B-Instruct",
        "meta-llama/Llama-3.1-8B-Instruct",
    } <= ids
    for entry in entries:
        # The stored config fields reproduce the published parameter count: they were copied right.
        assert estimated_parameters(entry.config) == pytest.approx(entry.parameters, rel=0.01), entry.repo_id
        assert entry.licence and entry.size_class in ("tiny", "small", "medium", "large")
        if entry.repo_id.startswith(("meta-llama/", "google/")):
            assert entry.gated, entry.repo_id
        if entry.gguf_repo:
            assert entry.gguf_file and entry.gguf_file.endswith(".gguf")
    assert {e.repo_id: e.licence for e in entries}["microsoft/Phi-3.5-mini-instruct"] == "MIT"


def test_verdict_without_a_config_is_unknown_with_the_reason() -> None:
    verdict = fit.model_verdict(None)
    assert verdict.fits == "unknown" and verdict.label == "unknown" and "no config.json" in verdict.note


def test_verdicts_come_from_the_memory_planner() -> None:
    entry = next(e for e in library.recommended_models() if e.repo_id == "Qwen/Qwen2.5-7B-Instruct")
    for free in (64 * 2**30, 2 * 2**30):
        verdict = fit.model_verdict(entry.config, quantization="nf4", device="cuda", free_bytes=free)
        plan = plan_memory(entry.config, quantization="nf4", context=8192, device="cuda", free_bytes=free)
        assert (verdict.fits, verdict.total_bytes, verdict.parameters) == (plan.fits, plan.total_bytes, plan.parameters)
    assert fit.model_verdict(entry.config, quantization="nf4", device="cuda", free_bytes=64 * 2**30).fits == "yes"
    # The verdict is for a chat-sized context (8k), and says how far the context could grow.
    roomy = fit.model_verdict(entry.config, quantization="nf4", device="cuda", free_bytes=12 * 2**30)
    assert roomy.fits == "yes" and roomy.max_context is not None and roomy.max_context > 8192
