"""`hearth-gui` itself: the window paints before torch is imported; crash-hook errors reach the window."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from app.core.settings import Settings
from app.ui.settings_dialog import SettingsDialog
from tests.helpers.gui_process import run_gui_and_probe

REPO = Path(__file__).resolve().parents[2]


def test_first_paint_happens_before_torch_is_imported(tmp_path: Path) -> None:
    env = {**os.environ, "HEARTH_HOME": str(tmp_path), "QT_QPA_PLATFORM": "offscreen"}
    result = subprocess.run(
        [sys.executable, "-m", "app.gui", "--first-paint-report"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    line = next(item for item in result.stdout.splitlines() if item.startswith("first_paint_s="))
    assert "torch_imported=False" in line


def test_broken_settings_file_still_opens_the_window_and_says_why(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.mkdir(parents=True)
    (config / "settings.json").write_text("{broken", encoding="utf-8")
    result = run_gui_and_probe(tmp_path, "print('BANNER=' + w.banner.label.text())")
    assert result.returncode == 0, result.stderr
    banner = next(line for line in result.stdout.splitlines() if line.startswith("BANNER="))
    assert "is not valid JSON" in banner and "settings.json" in banner


def test_uncaught_error_in_any_thread_reaches_the_window_banner(make_window, qtbot) -> None:
    from app.core.crash import install_hooks

    window = make_window(load=False)
    handler = install_hooks(window.errors.report)
    try:

        def fail() -> None:
            raise RuntimeError("background task broke")

        thread = threading.Thread(target=fail)
        thread.start()
        thread.join()
        qtbot.waitUntil(window.banner.isVisible, timeout=5000)
    finally:
        handler.uninstall()
    assert window.banner.label.text() == "Unexpected error: RuntimeError: background task broke"


def test_settings_dialog_builds_the_typed_settings(qtbot) -> None:
    dialog = SettingsDialog(Settings())
    qtbot.addWidget(dialog)
    dialog.system_prompt.setPlainText("Be brief.")
    dialog.model.setText("  ")
    dialog.theme.setCurrentText("dark")
    dialog.temperature.setValue(0.0)
    dialog.max_new_tokens.setValue(64)
    dialog.seed.setValue(7)
    dialog.accept()
    result = dialog.result_settings
    assert result is not None
    assert (result.system_prompt, result.model, result.theme) == ("Be brief.", None, "dark")
    assert (result.sampling.temperature, result.sampling.max_new_tokens, result.sampling.seed) == (0.0, 64, 7)
