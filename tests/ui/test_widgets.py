"""Widgets on their own: the chat model (qtmodeltester), Markdown rendering, the memory panel's drawing and hover."""

from __future__ import annotations

from types import SimpleNamespace

from PySide6.QtCore import QPoint
from PySide6.QtGui import QImage

from app.core.engines.backend import ContextUsage, MemoryReading
from app.core.memory.types import DeviceMemory
from app.ui import theme
from app.ui.chat_model import ChatItem, ChatModel, Roles
from app.ui.chat_view import format_stats
from app.ui.markdown import MarkdownRenderer
from app.ui.memory_panel import MemoryPanel, StackedBar, format_bytes


def test_chat_model_passes_qt_model_tester_and_streams_one_role(qtmodeltester) -> None:
    model = ChatModel()
    model.reset([ChatItem("user", "hi", message_id=1), ChatItem("assistant", "", message_id=2, streaming=True)])
    qtmodeltester.check(model)
    changes: list[tuple[int, list[int]]] = []
    model.dataChanged.connect(lambda top, bottom, roles: changes.append((top.row(), list(roles))))
    model.append_text(1, "Hel")
    model.append_text(1, "lo")
    assert model.data(model.index(1), Roles.Text) == "Hello"
    assert changes == [(1, [int(Roles.Text)]), (1, [int(Roles.Text)])]
    assert model.row_of(2) == 1 and model.row_of(99) is None
    model.remove(0)
    qtmodeltester.check(model)
    assert model.rowCount() == 1


def test_markdown_renders_code_with_highlighting_and_tables() -> None:
    renderer = MarkdownRenderer(theme.LIGHT)
    rendered = renderer.render("Hi *you*\n\n```python\nx = 1  # one\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |\n")
    assert rendered.code_blocks == ("x = 1  # one",)
    assert "<em>you</em>" in rendered.html and "<table" in rendered.html and 'href="copy:0"' in rendered.html
    assert "color:" in rendered.html.split("<pre", 1)[1]  # pygments inline colours
    assert "&lt;script&gt;" in renderer.render("<script>alert(1)</script>").html  # raw HTML is escaped


def test_stats_line_lists_every_number() -> None:
    stats = {
        "ttft_s": 0.25,
        "prompt_tokens": 120,
        "cached_tokens": 100,
        "prefill_tokens_per_s": 800.0,
        "decode_tokens_per_s": 15.5,
        "generated_tokens": 42,
    }
    assert format_stats(stats, "length") == (
        "first token 0.25 s  ·  prompt 120 tok (100 cached / 20 new)  ·  prefill 800 tok/s  ·  decode 15.5 tok/s"
        "  ·  42 generated  ·  stopped at the length limit"
    )
    with_path = format_stats({**stats, "decode_path": "fused-q4", "decode_path_note": "fused Q4_1 ..."}, "stop")
    assert "decode 15.5 tok/s (fused-q4)" in with_path


def test_memory_panel_draws_bars_and_explains_segments_on_hover(qtbot) -> None:
    panel = MemoryPanel(theme.LIGHT)
    qtbot.addWidget(panel)
    panel.resize(320, 500)
    reading = MemoryReading(
        (DeviceMemory("cuda:0", 4 * 2**30, 2**30, 2**29, 2 * 2**30), DeviceMemory("cpu", 2**30, 0, 2**28, 8 * 2**30)),
        kv_bytes_per_token=131072,
        forecast_kv_full_at_tokens=24576,
    )
    panel.set_memory(reading)
    panel.set_context(ContextUsage(system=20, history=300, current=50, reply=130, window=4096))
    panel.set_plan(SimpleNamespace(fits="offload", total_bytes=9 * 2**30, free_bytes=8 * 2**30, max_context=6000))
    panel.show()
    qtbot.waitExposed(panel)
    assert list(panel.device_bars) == ["cuda:0", "cpu"]
    assert panel.forecast_label.text() == "KV cache fills memory at 24,576 tokens (128 KiB per token)."
    assert "largest context that fits: 6,000 tokens" in panel.plan_label.text()
    assert "part offloaded" in panel.plan_label.text()
    bar: StackedBar = panel.device_bars["cuda:0"]
    image = QImage(bar.size(), QImage.Format.Format_ARGB32)
    bar.render(image)
    # the first segment (weights, half the bar) is drawn in the weights colour
    assert image.pixelColor(QPoint(bar.width() // 4, int(bar._bar_rect().center().y()))).name() == theme.LIGHT.weights
    kv_point = QPoint(int(bar.width() * 0.55), int(bar._bar_rect().center().y()))
    segment = bar.segment_at(kv_point)
    assert segment is not None and segment.label == "KV cache"
    assert bar.tooltip_for(segment) == "KV cache: 1.0 GiB (13.3% of 7.5 GiB)"
    assert panel.context_bar.caption == "500 / 4,096"
    panel.set_memory(None)
    assert panel.no_model.isVisibleTo(panel) and not panel.device_bars


def test_format_bytes() -> None:
    assert [format_bytes(v) for v in (512, 2048, 5 * 2**20, 3 * 2**30 // 2)] == [
        "512 B",
        "2.0 KiB",
        "5.0 MiB",
        "1.5 GiB",
    ]


def test_memory_panel_shows_the_prompt_cache_and_clears_it(qtbot, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HEARTH_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "cache" / "prompt-cache"
    folder.mkdir(parents=True)
    for name in ("a", "b"):
        (folder / f"{name}.kvb").write_bytes(b"x" * 3 * 2**20)
    panel = MemoryPanel(theme.LIGHT)
    qtbot.addWidget(panel)
    device = DeviceMemory("cpu", 2**30, 0, 2**28, 8 * 2**30)
    panel.set_memory(MemoryReading((device,), prompt_cache_bytes=6 * 2**20))
    panel.show()
    assert panel.prompt_cache_row.isVisibleTo(panel)
    assert panel.prompt_cache_label.text() == "Prompt cache on disk: 6.0 MiB"
    panel.clear_prompt_cache.click()
    assert not folder.exists()
    assert panel.prompt_cache_label.text() == "Prompt cache cleared (2 blocks, 6.0 MiB)"
    panel.set_memory(MemoryReading((device,)))  # an engine that keeps none (torch, a remote one): no row
    assert not panel.prompt_cache_row.isVisibleTo(panel)


def test_the_plan_before_loading_says_what_serving_would_take(qtbot) -> None:
    panel = MemoryPanel(theme.LIGHT)
    qtbot.addWidget(panel)
    batched = SimpleNamespace(
        fits="yes", served_together=8, served_kv_budget_bytes=2**30, kv_bytes_per_token=2**16, context=8192
    )
    panel.set_plan(batched)
    assert "served: 4 replies at once, each up to 4,096 tokens (KV at most 1.0 GiB)" in panel.plan_label.text()
    panel.set_served_replies(12)  # the runtime's own most bounds what is asked
    assert "served: 8 replies at once, each up to 2,048 tokens" in panel.plan_label.text()
    panel.set_served_replies(1)
    assert "served: one reply at a time, up to 8,192 tokens" in panel.plan_label.text()
    panel.set_plan(SimpleNamespace(fits="yes", total_bytes=2**30, free_bytes=2**33))  # a torch runtime's plan
    assert panel.plan_label.text().endswith("served: one request at a time")
    panel.set_plan_message("runs on the remote engine 'hosted'")
    panel.set_served_replies(3)  # no plan shown: the message stays
    assert panel.plan_label.text() == "runs on the remote engine 'hosted'"
