"""End to end with the real default model (SmolLM2-135M, bf16 on the CPU): type, stream, stats, memory."""

from __future__ import annotations

import threading

from PySide6.QtCore import Qt

from app.core.chat.sampling import SamplingParams
from app.core.engines.backend import LoadRequest
from app.core.engines.local import EngineBackend
from app.core.settings import Settings


def test_real_model_streams_an_answer_with_stats_and_memory(make_window, qtbot, default_loaded) -> None:
    def factory(request: LoadRequest, progress, cancel: threading.Event) -> EngineBackend:  # type: ignore[no-untyped-def]
        return EngineBackend(default_loaded)  # the session's model: never loaded twice

    settings = Settings(sampling=SamplingParams(temperature=0.0, max_new_tokens=40), response_cache=False)
    window = make_window(factory=factory, settings=settings)
    assert window.model_info is not None and window.model_info.name == "SmolLM2-135M-Instruct"
    text_updates: list[int] = []
    window.chat_model.dataChanged.connect(lambda top, bottom, roles: text_updates.append(top.row()))
    with qtbot.waitSignal(window.reply_finished, timeout=120_000) as blocker:
        # A reply of some length: a one-word answer can finish within one 40 ms batch on a fast CPU
        window.input_box.editor.setPlainText("Describe Paris, the capital of France, in a few sentences.")
        qtbot.keyClick(window.input_box.editor, Qt.Key.Key_Return)
    assert blocker.args[0] in ("stop", "length")
    reply = window.chat_model.item(1)
    assert reply.role == "assistant" and "paris" in reply.content.lower()
    stats = reply.stats
    assert stats is not None and stats["prompt_tokens"] > 10
    assert stats["generated_tokens"] >= 20  # long enough to span several batches on any CPU this runs on
    assert text_updates.count(1) >= 3  # streamed into the view in several batches, not in one block
    assert stats["decode_tokens_per_s"] > 0 and stats["ttft_s"] > 0
    stats_label = window.chat_view.widgets()[1].stats_label
    # The decode path that ran (fused-q4 on an AVX2 CPU with a C compiler) is named, and why on hover.
    assert "decode" in stats_label.text() and f"({stats['decode_path']})" in stats_label.text()
    assert stats["decode_path_note"] and stats_label.toolTip() == (
        f"{stats['decode_path_note']}\nprompt lookup off (the torch runtime has no exact multi-token check)"
    )
    reading = window.memory_panel.reading
    assert reading is not None
    device = reading.devices[0]
    assert device.weights_bytes > 100 * 2**20 and device.kv_bytes > 0
    usage = window.memory_panel.usage
    assert usage is not None and usage.window == default_loaded.context_window and usage.current > 5
    # a second turn reuses the KV cache of the first
    with qtbot.waitSignal(window.reply_finished, timeout=120_000):
        window.chat.send("And of Italy?")
    assert window.chat_model.item(3).stats["cached_tokens"] > 0
