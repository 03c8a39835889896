"""A model on disk gets the verdict of the runtime its load would take: a GGUF's from the torch-free runtime's own
plan (what `hearth plan` prints), without importing torch; a folder's from the memory planner."""

from __future__ import annotations

from pathlib import Path

from app.core.engines.backend import LoadRequest
from app.core.engines.opening import plan_load
from app.core.engines.verdicts import library_verdict
from app.core.memory import verdict as fit
from app.core.models import library
from app.core.models.library import LibraryModel
from tests.helpers.fresh_process import run_fresh

FREE = 16 * 2**30


def default_entry() -> LibraryModel:
    [entry] = [model for model in library.list_models() if model.kind == "default"]
    return entry


def test_a_gguf_s_verdict_is_its_runtime_s_plan() -> None:
    verdict = library_verdict(default_entry(), free_bytes=FREE)
    plan = plan_load(LoadRequest(None, context_length=fit.VERDICT_CONTEXT), FREE)
    assert "torch-free runtime" in " ".join(plan.notes)
    assert (verdict.fits, verdict.total_bytes, verdict.parameters) == ("yes", plan.total_bytes, plan.parameters)
    assert verdict.max_context == plan.max_context == 8192 and "torch-free runtime" in verdict.note
    small = library_verdict(default_entry(), free_bytes=plan.total_bytes - 64 * 2**20)
    assert small.fits == "no" and 0 < small.max_context < 8192  # not at 8k; says how long a context fits


def test_a_folder_s_verdict_is_the_memory_planner_s(tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    folder = tiny_model_dir("llama")
    entry = LibraryModel(
        name="tiny", kind="folder", path=folder, size_bytes=1, spec=str(folder), config=library.read_config(folder)
    )
    assert library_verdict(entry, quantization="bf16", device="cpu", free_bytes=FREE) == fit.model_verdict(
        entry.config, quantization="bf16", device="cpu", free_bytes=FREE
    )


def test_a_gguf_that_cannot_be_read_is_unknown_with_the_reason(tmp_path: Path) -> None:
    path = tmp_path / "cut.gguf"
    path.write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(16))
    entry = LibraryModel(name="cut", kind="gguf", path=path, size_bytes=24, spec=str(path))
    verdict = library_verdict(entry, free_bytes=FREE)
    assert verdict.fits == "unknown" and "cut.gguf" in verdict.note


def test_listing_a_gguf_library_never_imports_torch() -> None:
    done = run_fresh("from app.cli import main\nassert main(['models']) == 0\n")
    assert "SmolLM2-135M-Instruct (default)" in done.out and "fits (" in done.out
    assert done.imported == set()


def test_the_summary_gives_the_plan_s_units() -> None:
    """One wording for `hearth models` and the library window: the memory in the units `hearth plan` prints."""
    assert fit.Verdict("yes", total_bytes=384_951_552).summary == "fits (367.1 MiB)"
    assert fit.Verdict("no", total_bytes=5 * 2**30).summary == "too large (5.00 GiB)"
    assert fit.Verdict("unknown", total_bytes=2**20, note="no config").summary == "unknown"
    assert fit.Verdict("offload").summary == "fits with offload"
