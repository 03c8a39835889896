"""When a load takes the torch-free runtime (app/core/engines/lite/backend.py and app/core/engines/opening.py), and
what it says when it can't: the reasons, HEARTH_RUNTIME, the memory check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.core.engines.backend import LoadRequest, RemoteModel
from app.core.engines.lite import backend as lite_backend
from app.core.engines.lite.backend import LiteBackend, LiteRefused, open_lite_backend
from app.core.engines.opening import open_backend
from app.core.errors import HearthError, ModelTooLargeError
from app.core.fastpath import kernel

KERNEL = kernel.load_library()
pytestmark = pytest.mark.skipif(isinstance(KERNEL, str), reason=f"no kernel library here: {KERNEL}")


@pytest.fixture(scope="module")
def packed_default(default_model_folder: Path) -> str:
    """The default model as a folder, with its packed copy written by a q4 load through torch (until the runtime reads
    the GGUF itself, it runs the folder's packed copy)."""
    from app.core.engines.loader import load_model

    load_model(str(default_model_folder), quantization="q4", device="cpu")
    return str(default_model_folder)


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        (LoadRequest(None, quantization="bf16", device="cpu"), "bf16 weights run through torch"),
        (LoadRequest(None, device="cuda"), "device cuda runs through torch"),
        (LoadRequest(None, device="cpu", trust_remote_code=True), "run their own code or pickled weights"),
        (LoadRequest(None, remote=RemoteModel("box", "m")), "a remote model"),
    ],
)
def test_loads_it_does_not_take_say_why(request_: LoadRequest, reason: str) -> None:
    assert reason in str(open_lite_backend(request_))


def test_a_model_without_a_packed_copy_goes_through_torch_which_writes_one(
    isolated_cache: Path, tiny_model_dir: Any
) -> None:
    request = LoadRequest(str(tiny_model_dir("llama")), device="cpu", response_cache=False)
    assert "no packed Q4_1 copy yet" in str(open_lite_backend(request))
    first = open_backend(request)
    assert type(first).__name__ == "EngineBackend" and first.info.quantization == "q4"
    first.close()
    second = open_backend(request)
    assert isinstance(second, LiteBackend)
    second.close()


def test_hearth_runtime_chooses_and_refuses_clearly(packed_default: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEARTH_RUNTIME", "lite")
    with pytest.raises(
        LiteRefused, match="The torch-free runtime can't run this model: bf16 weights run through torch"
    ):
        open_backend(LoadRequest(packed_default, quantization="bf16", device="cpu"))
    monkeypatch.setenv("HEARTH_RUNTIME", "fast")
    with pytest.raises(HearthError, match="HEARTH_RUNTIME=fast is not one of auto, torch, lite"):
        open_backend(LoadRequest(packed_default, device="cpu"))
    monkeypatch.setenv("HEARTH_RUNTIME", "torch")
    backend = open_backend(LoadRequest(packed_default, device="cpu", response_cache=False))
    assert type(backend).__name__ == "EngineBackend"
    backend.close()


def test_auto_on_a_machine_without_a_gpu_says_so_as_the_torch_loader_does(
    packed_default: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lite_backend, "gpu_reason", lambda: "no CUDA GPU was found")
    backend = open_lite_backend(LoadRequest(packed_default, response_cache=False))
    assert isinstance(backend, LiteBackend)
    assert backend.info.notices == (
        "Running on the CPU: no CUDA GPU was found. Replies will be much slower than on a GPU.",
    )
    backend.close()
    monkeypatch.setattr(lite_backend, "gpu_reason", lambda: "")
    assert open_lite_backend(LoadRequest(packed_default)) == "a GPU may be present"


class FakeMemory:
    def __init__(self, available: int) -> None:
        self.available = available
        self.total = 2 * available


def test_a_model_that_does_not_fit_is_refused_with_the_numbers(
    packed_default: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lite_backend.psutil, "virtual_memory", lambda: FakeMemory(120 << 20))
    with pytest.raises(ModelTooLargeError, match=r"\(q4\) needs .* but only 120.0 MiB is free on the CPU"):
        open_lite_backend(LoadRequest(packed_default, device="cpu", context_length=8192))
    # without --context: the window shrinks to what fits, and says so
    monkeypatch.setattr(lite_backend.psutil, "virtual_memory", lambda: FakeMemory(300 << 20))
    backend = open_lite_backend(LoadRequest(packed_default, device="cpu", response_cache=False))
    assert isinstance(backend, LiteBackend)
    assert 2048 <= backend.info.context_window < 8192
    assert any("The context window is limited to" in notice for notice in backend.info.notices)
    backend.close()
    # --ignore-fit loads anyway
    monkeypatch.setattr(lite_backend.psutil, "virtual_memory", lambda: FakeMemory(10 << 20))
    forced = open_lite_backend(LoadRequest(packed_default, device="cpu", ignore_fit=True, response_cache=False))
    assert isinstance(forced, LiteBackend) and forced.info.context_window == 8192
    forced.close()


def test_the_plan_before_loading_is_the_runtime_s_own(packed_default: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.core.engines.lite.backend import lite_plan

    plan = lite_plan(LoadRequest(packed_default, device="cpu", context_length=4096))
    assert not isinstance(plan, str)
    assert plan.quantization == "q4" and plan.context == 4096 and plan.kv_dtype == "bf16"
    assert 94e6 < plan.weights_bytes < 96e6  # the packed copy (Q4_1 matrices, int8 lm_head) and the norms
    assert plan.kv_bytes == 4096 * 30 * 2 * 3 * 64 * 2 and plan.fits == "yes"
    assert (plan.served_together, plan.served_kv_budget_bytes) == (1, 0)  # a packed copy serves one at a time
    monkeypatch.setenv("HEARTH_RUNTIME", "torch")
    assert lite_plan(LoadRequest(packed_default, device="cpu")) == "HEARTH_RUNTIME=torch"


@pytest.mark.parametrize("load", ["first", "warm"])
def test_a_load_reads_and_hashes_the_tokenizer_copy_once(
    load: str, isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tokenizer.json a load builds the tokenizer from, or keeps, is the one the window counts tokens with: it is
    not looked up and hashed again."""
    from app.core.models import gguf_tokenizer

    request = LoadRequest(None, device="cpu", response_cache=False)
    if load == "warm":
        first = open_lite_backend(request)
        assert isinstance(first, LiteBackend)
        first.close()
    looked_up: list[str] = []
    find_verified = gguf_tokenizer._find_verified

    def counting(folder: Path, prefix: str, suffix: str, notices: list[str] | None) -> Path | None:
        looked_up.append(suffix)
        return find_verified(folder, prefix, suffix, notices)

    monkeypatch.setattr(gguf_tokenizer, "_find_verified", counting)
    backend = open_lite_backend(request)
    assert isinstance(backend, LiteBackend)
    try:
        assert looked_up.count(".json") == 1, looked_up
        [kept] = (isolated_cache / "gguf-tokenizers").glob("*.json")
        assert backend.info.tokenizer_file == str(kept)
    finally:
        backend.close()


def test_a_damaged_tokenizer_copy_is_told_in_the_load_s_notes(isolated_cache: Path) -> None:
    """The default model on its GGUF: the cached tokenizer's settings hand-edited between two loads."""
    request = LoadRequest(None, device="cpu", response_cache=False)
    first = open_lite_backend(request)
    assert isinstance(first, LiteBackend)
    first.close()
    [config] = (isolated_cache / "gguf-tokenizers").glob("*.settings")
    config.write_bytes(config.read_bytes() + b" ")
    again = open_lite_backend(request)
    assert isinstance(again, LiteBackend)
    try:
        [note] = [line for line in again.info.recovered if "tokenizer copy" in line]
        assert f"The tokenizer copy {config.name} was damaged" in note and "written again" in note
    finally:
        again.close()
