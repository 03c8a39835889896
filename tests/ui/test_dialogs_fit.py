"""Every dialog fits the screen, lays out without overlaps, says what it means, and closes with Escape (issue 27,
points 4, 10, 11 and 12): Settings, the model library, the download dialog, Connections and the fit choice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QDialog, QTableWidget, QWidget
from pytestqt.qtbot import QtBot

from app.core.documents import ExtractedDocument, FitDecision
from app.core.models import hub
from app.core.settings import Settings
from app.core.storage import paths
from app.ui.attachment_chip import FitChoiceDialog
from app.ui.connections import NO_ENGINES_HINT, ConnectionsDialog
from app.ui.download_dialog import DownloadDialog
from app.ui.library import LibraryWindow
from app.ui.settings_dialog import SettingsDialog
from app.ui.window_geometry import TITLE_BAR_ALLOWANCE
from tests.ui.layout_audit import problems


def room() -> QSize:
    screen = QGuiApplication.primaryScreen()
    assert screen is not None
    return screen.availableGeometry().marginsRemoved(TITLE_BAR_ALLOWANCE).size()


def shown(qtbot: QtBot, dialog: QWidget) -> QWidget:
    qtbot.addWidget(dialog)
    dialog.show()
    qtbot.waitExposed(dialog)
    qtbot.wait(20)
    return dialog


def every_tab_is_laid_out(qtbot: QtBot, dialog: SettingsDialog) -> list[str]:
    found: list[str] = []
    for index in range(dialog.tabs.count()):
        dialog.tabs.setCurrentIndex(index)
        qtbot.wait(10)
        found += [f"{dialog.tabs.tabText(index)}: {problem}" for problem in problems(dialog)]
    return found


def test_settings_fits_a_laptop_screen_with_every_field_apart(qtbot: QtBot) -> None:
    dialog = shown(qtbot, SettingsDialog(Settings()))
    assert dialog.height() <= room().height() and dialog.width() <= room().width()
    assert problems(dialog) == []  # was: "Default model" on top of a system prompt squeezed to a line and a half
    assert every_tab_is_laid_out(qtbot, dialog) == []
    assert dialog.system_prompt.height() >= 4 * dialog.system_prompt.fontMetrics().lineSpacing()


def test_settings_on_a_half_screen_scrolls_instead_of_squeezing(qtbot: QtBot, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("app.ui.dialogs.available_size", lambda widget: QSize(600, 330))  # a very short screen
    dialog = shown(qtbot, SettingsDialog(Settings()))
    assert dialog.height() <= 330
    assert every_tab_is_laid_out(qtbot, dialog) == []


def test_the_library_says_what_its_memory_column_means_and_cuts_no_cell(qtbot: QtBot) -> None:
    window = shown(qtbot, LibraryWindow(client_factory=lambda: hub.HubClient(token=None)))
    assert isinstance(window, LibraryWindow)
    qtbot.waitUntil(lambda: window.status_label.text().startswith("Memory: "), timeout=120_000)
    window.wait_for_workers()
    status = window.status_label.text()
    assert "automatic quantization (q4 on the CPU" in status and "8,192-token context" in status
    for table in (window.local_table, window.recommended_table):
        window.tabs.setCurrentWidget(table.parentWidget())
        qtbot.wait(10)
        assert_no_cell_is_cut(table)
    assert window.width() <= room().width() and window.height() <= room().height()
    assert problems(window) == []


def assert_no_cell_is_cut(table: QTableWidget) -> None:
    metrics = table.fontMetrics()
    for row in range(table.rowCount()):
        for column in range(1, table.columnCount()):  # the name column stretches; its tooltip has it whole
            item = table.item(row, column)
            assert item is not None and item.text() in item.toolTip()
            assert metrics.horizontalAdvance(item.text()) <= table.columnWidth(column), (row, column, item.text())
        name = table.item(row, 0)
        assert name is not None and name.text() in name.toolTip()


def test_the_library_lists_no_conversion_cache_as_a_model(qtbot: QtBot, isolated_cache: Path) -> None:
    folder = paths.converted_models_dir() / "SmolLM2-135M-Instruct.Q4_1-b179c9523d0e6a0f"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}), encoding="utf-8")
    (folder / "model.safetensors").write_bytes(b"w" * 64)
    window = shown(qtbot, LibraryWindow(client_factory=lambda: hub.HubClient(token=None)))
    assert isinstance(window, LibraryWindow)
    qtbot.waitUntil(lambda: window.status_label.text().startswith("Memory: "), timeout=120_000)
    window.wait_for_workers()
    names = [window.local_table.item(row, 0).text() for row in range(window.local_table.rowCount())]
    assert names == ["SmolLM2-135M-Instruct (default)"]


def test_the_library_closes_with_escape_and_with_its_close_button(qtbot: QtBot) -> None:
    window = shown(qtbot, LibraryWindow(client_factory=lambda: hub.HubClient(token=None)))
    assert isinstance(window, LibraryWindow)
    QTest.keyClick(window, Qt.Key.Key_Escape)
    assert not window.isVisible()
    window.show()
    window.close_button.click()
    assert not window.isVisible()
    window.wait_for_workers()


def test_an_offline_download_says_it_failed_with_no_half_drawn_bar(qtbot: QtBot) -> None:
    dialog = shown(qtbot, DownloadDialog("org/tiny", client_factory=lambda: hub.HubClient(token=None)))
    assert isinstance(dialog, DownloadDialog)
    qtbot.waitUntil(lambda: dialog.state == "failed", timeout=30_000)
    qtbot.wait(10)
    assert "offline" in dialog.error_label.text()
    assert dialog.summary.text() == "Could not look up org/tiny."  # not "Looking up…" any more
    assert not dialog.progress_bar.isTextVisible()  # no "0%" cut in half by a thin bar
    assert not dialog.progress_bar.isVisible()  # nothing to show progress of
    assert problems(dialog) == []


def test_connections_explains_an_empty_list_and_answers_under_its_buttons(qtbot: QtBot) -> None:
    dialog = shown(qtbot, ConnectionsDialog())
    assert isinstance(dialog, ConnectionsDialog)
    assert dialog.engine_list.count() == 0 and dialog.engines_hint.isVisible()
    assert dialog.engines_hint.text() == NO_ENGINES_HINT
    dialog.test_connection()  # no name yet: the answer appears where the user is looking
    assert dialog.status.text() == "Give the connection a name."
    buttons_bottom = dialog.test_button.mapTo(dialog, dialog.test_button.rect().bottomLeft()).y()
    status_top = dialog.status.mapTo(dialog, dialog.status.rect().topLeft()).y()
    models_top = dialog.models.mapTo(dialog, dialog.models.rect().topLeft()).y()
    assert buttons_bottom < status_top < models_top
    assert problems(dialog) == []


def fit_dialog() -> FitChoiceDialog:
    document = ExtractedDocument("log.txt", "text/plain", "Text", 10, "0" * 64, "text")
    return FitChoiceDialog(FitDecision(document_tokens=(3000,), question_tokens=10, remaining_tokens=1026), [document])


@pytest.mark.parametrize(
    "make",
    [
        lambda: SettingsDialog(Settings()),
        lambda: LibraryWindow(client_factory=lambda: hub.HubClient(token=None)),
        lambda: DownloadDialog("org/tiny", client_factory=lambda: hub.HubClient(token=None)),
        ConnectionsDialog,
        fit_dialog,
    ],
    ids=["settings", "library", "download", "connections", "fit-choice"],
)
def test_escape_closes_every_dialog(qtbot: QtBot, make) -> None:  # type: ignore[no-untyped-def]
    dialog = shown(qtbot, make())
    assert isinstance(dialog, QDialog)
    QTest.keyClick(dialog, Qt.Key.Key_Escape)
    assert not dialog.isVisible()
    for wait in ("wait_for_workers", "wait_idle"):
        if hasattr(dialog, wait):
            getattr(dialog, wait)()
