"""The window's "Load anyway" (the command line's --ignore-fit): the real loader and planner refuse a tiny model asked
for with a context no machine has memory for; the banner offers to load it regardless, and that load succeeds."""

from __future__ import annotations

from app.core.engines.backend import LoadRequest, ScriptedBackend
from app.core.errors import HearthError
from app.ui.main_window import LOAD_ANYWAY_HINT
from app.ui.worker import default_backend_factory

HUGE_CONTEXT = 2**24  # tokens: the most a config may state (model_source.check_config_sizes)
# 64 layers of 4 KV heads: 16 KiB of KV cache per token, 256 GiB at HUGE_CONTEXT (the weights stay tiny)
DEEP = {"num_hidden_layers": 64, "num_key_value_heads": 4}


def test_a_model_the_planner_refuses_can_be_loaded_anyway(make_window, qtbot, tiny_model_dir) -> None:
    folder = tiny_model_dir("llama", max_position_embeddings=HUGE_CONTEXT, **DEEP)
    window = make_window(load=False, factory=default_backend_factory())
    window.load_model(LoadRequest(str(folder), "bf16", "cpu", HUGE_CONTEXT))
    button = window.banner.action_button
    qtbot.waitUntil(lambda: button.isVisible(), timeout=120_000)
    text = window.banner.label.text()
    assert text.startswith(f"{folder.name} (bf16) needs ") and "free on the CPU" in text
    assert "--ignore-fit" not in text and text.endswith(LOAD_ANYWAY_HINT)
    assert button.text() == "Load anyway" and window.model_info is None
    assert window.model_bar.load_button.text() == "Load"

    with qtbot.waitSignal(window.model_ready, timeout=120_000):
        button.click()
    assert window.load_request is not None and window.load_request.ignore_fit
    assert window.model_info is not None and window.model_info.name == folder.name
    assert not button.isVisible()  # offered once


def test_other_load_failures_offer_no_load_anyway(make_window, qtbot) -> None:
    def missing(request, progress, cancel):  # type: ignore[no-untyped-def]
        raise HearthError("No model named 'missing' was found.")

    window = make_window(load=False, factory=missing)
    window.load_model(LoadRequest("missing"))
    qtbot.waitUntil(lambda: window.banner.isVisible(), timeout=5000)
    assert window.banner.label.text() == "No model named 'missing' was found."
    assert not window.banner.action_button.isVisible()


def test_a_new_load_withdraws_the_offer(make_window, qtbot) -> None:
    from app.core.errors import ModelTooLargeError

    backend = ScriptedBackend()

    def refuse_unless_ignored(request, progress, cancel):  # type: ignore[no-untyped-def]
        if request.model == "big" and not request.ignore_fit:
            raise ModelTooLargeError("big needs 9 GiB. To load it anyway, use --ignore-fit.", 9 * 2**30, 2**30)
        return backend

    window = make_window(load=False, factory=refuse_unless_ignored)
    window.load_model(LoadRequest("big"))
    qtbot.waitUntil(lambda: window.banner.action_button.isVisible(), timeout=5000)
    assert window.banner.label.text() == f"big needs 9 GiB. {LOAD_ANYWAY_HINT}"
    with qtbot.waitSignal(window.model_ready, timeout=5000):
        window.load_model(LoadRequest("small"))  # the user chose another model instead
    assert not window.banner.action_button.isVisible()
