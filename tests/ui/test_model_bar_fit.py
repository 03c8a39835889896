"""The window fits a 1366x768 laptop screen whatever the model bar says, and a loaded model's objects are frozen."""

from __future__ import annotations

import gc
import sys

from app.core.engines.backend import ModelInfo
from app.core.settings import Settings
from app.ui.model_bar import ModelBar
from app.ui.worker import settle_after_load

LONG = "Converting SmolLM2-135M-Instruct.Q4_1.gguf once (cached for later launches)… " * 3
TASKBAR = 60  # room for a panel or taskbar on the screen


def test_long_status_elides_and_keeps_the_whole_text_in_the_tooltip(qtbot) -> None:
    bar = ModelBar(Settings())
    qtbot.addWidget(bar)
    bar.set_loading(LONG, -1.0)
    bar.resize(900, bar.sizeHint().height())
    bar.show()
    qtbot.waitExposed(bar)
    assert bar.minimumSizeHint().width() <= 1366
    assert bar.status.text() != LONG and "…" in bar.status.text()
    assert bar.status.toolTip() == LONG
    assert bar.status.full_text() == LONG


def test_main_window_minimum_size_fits_a_laptop_screen_after_a_long_status(qtbot, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HEARTH_HOME", str(tmp_path))
    from app.ui.main_window import MainWindow

    window = MainWindow(Settings(), autoload=False)
    qtbot.addWidget(window)
    window.show()
    qtbot.waitExposed(window)
    window.model_bar.set_loading(LONG, 0.3)
    info = ModelInfo(name="x" * 200, quantization="q4_1", device="cpu", context_window=8192)
    window.model_bar.set_loaded(info)
    minimum = window.minimumSizeHint().expandedTo(window.minimumSize())
    assert minimum.width() <= 1366 and minimum.height() <= 768 - TASKBAR, minimum
    window.resize(1366, 768 - TASKBAR)
    assert window.width() <= 1366
    assert "x" * 200 in window.model_bar.status.toolTip()


def test_settling_after_a_load_freezes_objects_and_imports_the_renderer() -> None:
    gc.unfreeze()
    sys.modules.pop("app.ui.markdown", None)
    before = gc.get_freeze_count()
    keep = [[i] for i in range(1000)]  # long-lived objects the collector would otherwise keep walking
    settle_after_load()
    try:
        assert gc.get_freeze_count() >= before + len(keep)
        assert "app.ui.markdown" in sys.modules
    finally:
        gc.unfreeze()
