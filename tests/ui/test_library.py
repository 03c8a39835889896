"""The library window, the download dialog and the token box, offscreen, against real files and a fake Hub."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from keyring.backends import fail
from PySide6.QtCore import Qt, QUrl
from PySide6.QtWidgets import QMessageBox
from pytestqt.qtbot import QtBot

from app.core.fastpath.compile_notice import COMPILE_NOTICE, say_compiling
from app.core.models import hub, library
from app.core.storage import secrets
from app.ui.download_dialog import DownloadDialog
from app.ui.hub_token import HubTokenBox
from app.ui.library import LibraryWindow
from tests.helpers import fake_hub as fake_hub_module
from tests.helpers import memory_keyring
from tests.helpers.fake_hub import FakeHub, FakeRepo

TOKEN = "hf_UiTestToken0123456789abcdefABCDEFGH"


@pytest.fixture(autouse=True)
def isolated(hearth_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from huggingface_hub import constants

    cache = hearth_home / "hf-cache"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(secrets, "_session_token", None)
    return cache


@pytest.fixture
def fake(tiny_model_dir, isolated: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:  # type: ignore[no-untyped-def]
    with fake_hub_module.serving(monkeypatch, isolated, valid_tokens={TOKEN}) as server:
        server.add("org/tiny", FakeRepo.from_folder(tiny_model_dir("llama")))
        server.add("org/gated", FakeRepo.from_folder(tiny_model_dir("llama"), gated=True, allowed_tokens={TOKEN}))
        header = b"GGUF\x03\x00\x00\x00" + bytes(16)
        server.add("org/two-GGUF", FakeRepo(files={"a-Q4_K_M.gguf": header, "a-Q8_0.gguf": header * 2}))
        yield server


def make_window(qtbot: QtBot) -> LibraryWindow:
    window = LibraryWindow(quantization="bf16", device="cpu", client_factory=lambda: hub.HubClient(token=None))
    qtbot.addWidget(window)
    qtbot.waitUntil(lambda: window.status_label.text().startswith("Memory: what each model needs"), timeout=120_000)
    return window


def write_hub_repo(cache: Path, repo_id: str) -> None:
    storage = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = storage / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (storage / "refs").mkdir()
    (storage / "refs" / "main").write_text("a" * 40)
    (storage / "blobs").mkdir()
    for name, data in {
        "config.json": json.dumps({"model_type": "llama"}).encode(),
        "model.safetensors": b"w" * 99,
    }.items():
        blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / name).symlink_to(Path("../../blobs") / blob.name)


def cell(window: LibraryWindow, row: int, column: int, table: str = "local") -> str:
    widget = window.local_table if table == "local" else window.recommended_table
    item = widget.item(row, column)
    return item.text() if item is not None else ""


def test_window_lists_models_and_recommendations_with_verdicts(qtbot: QtBot) -> None:
    window = make_window(qtbot)
    assert cell(window, 0, 0) == "SmolLM2-135M-Instruct (default)"
    assert cell(window, 0, 3) == "llama" and cell(window, 0, 5) == "8,192"
    assert cell(window, 0, 6).startswith(("fits", "too large", "unknown"))
    assert cell(window, 0, 6) != "planning…"
    recommended = library.recommended_models()
    assert window.recommended_table.rowCount() == len(recommended)
    llama_row = next(i for i, e in enumerate(recommended) if e.repo_id == "meta-llama/Llama-3.1-8B-Instruct")
    assert cell(window, llama_row, 5, "recommended") == "yes: needs a token"
    assert cell(window, llama_row, 6, "recommended") not in ("", "planning…")
    # one line a row, elided where the name says most: a wrapped "HuggingFaceTB/" hid which model a row was
    for table in (window.local_table, window.recommended_table):
        assert not table.wordWrap()
    assert window.recommended_table.textElideMode() == Qt.TextElideMode.ElideLeft
    window.wait_for_workers()


def test_a_first_kernel_compile_while_planning_is_said_in_the_status_line(
    qtbot: QtBot, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from app.ui import library as library_window

    real = library_window.library_verdict
    gate = threading.Event()

    def compiling_verdict(*args: object, **kwargs: object) -> object:
        say_compiling()  # what the kernel module does before its one compile, on the planning thread
        gate.wait(10)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(library_window, "library_verdict", compiling_verdict)
    window = LibraryWindow(quantization="bf16", device="cpu", client_factory=lambda: hub.HubClient(token=None))
    qtbot.addWidget(window)
    qtbot.waitUntil(lambda: COMPILE_NOTICE in window.status_label.text(), timeout=30_000)
    assert window.status_label.text() == f"{library_window.PLANNING} {COMPILE_NOTICE}"
    gate.set()
    qtbot.waitUntil(lambda: window.status_label.text().startswith("Memory: what each model needs"), timeout=120_000)
    window.wait_for_workers()


def test_default_model_cannot_be_deleted_but_a_download_can(
    qtbot: QtBot, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_hub_repo(isolated, "org/old")
    window = make_window(qtbot)
    window.local_table.selectRow(0)
    assert not window.delete_button.isEnabled()
    row = next(i for i, m in enumerate(window.models) if m.spec == "org/old")
    window.local_table.selectRow(row)
    assert window.delete_button.isEnabled()
    asked: list[str] = []

    def answer_yes(*args: object) -> QMessageBox.StandardButton:
        asked.append(str(args[2]))
        return QMessageBox.StandardButton.Yes

    monkeypatch.setattr(QMessageBox, "question", answer_yes)
    window.delete_selected()
    assert asked and asked[0].startswith("Delete org/old from disk")
    assert not (isolated / "models--org--old").exists()
    qtbot.waitUntil(lambda: all(m.spec != "org/old" for m in window.models), timeout=60_000)
    window.wait_for_workers()


def test_reveal_in_folder_opens_the_model_folder(qtbot: QtBot, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[QUrl] = []
    monkeypatch.setattr("app.ui.library.QDesktopServices.openUrl", lambda url: opened.append(url) or True)
    window = make_window(qtbot)
    window.local_table.selectRow(0)
    window.reveal_selected()
    assert [Path(u.toLocalFile()) for u in opened] == [window.models[0].path.parent]
    window.wait_for_workers()


def test_adding_a_bad_folder_shows_why(qtbot: QtBot, tmp_path: Path) -> None:
    window = make_window(qtbot)
    (tmp_path / "empty").mkdir()
    window.add_path(tmp_path / "empty")
    assert "no config.json or .gguf file" in window.status_label.text()
    window.wait_for_workers()


def open_dialog(qtbot: QtBot, reference: str, token: str | None = None, **kwargs: object) -> DownloadDialog:
    dialog = DownloadDialog(
        reference, quantization="bf16", device="cpu", client_factory=lambda: hub.HubClient(token=token), **kwargs
    )  # type: ignore[arg-type]
    qtbot.addWidget(dialog)
    qtbot.waitUntil(lambda: dialog.state not in ("", "preparing"), timeout=60_000)
    return dialog


def test_download_shows_the_verdict_first_then_progress(qtbot: QtBot, fake: FakeHub) -> None:
    dialog = open_dialog(qtbot, "org/tiny")
    assert dialog.state == "ready"
    assert "org/tiny:" in dialog.summary.text() and "safetensors/GGUF only" in dialog.summary.text()
    assert dialog.verdict_label.text().startswith("Memory at bf16 on cpu: ")
    assert fake.downloads_of("model.safetensors") == []  # nothing heavy before the user says so
    with qtbot.waitSignal(dialog.finished_download, timeout=60_000) as finished:
        dialog.start_button.click()
    assert Path(finished.args[0], "model.safetensors").is_file()
    assert dialog.progress_bar.value() == 1000 and dialog.state == "done"
    dialog.wait_for_workers()


def test_pause_and_resume_in_the_dialog(qtbot: QtBot, fake: FakeHub) -> None:
    dialog = open_dialog(qtbot, "org/tiny")
    progress_seen: list[str] = []

    def pause_once_moving() -> None:
        text = dialog.speed_label.text()
        progress_seen.append(text)
        if dialog.state == "downloading" and "model.safetensors" in text:
            dialog.pause_button.click()

    dialog.start_button.click()
    qtbot.waitUntil(lambda: (pause_once_moving(), dialog.state == "paused")[1], timeout=60_000)
    assert dialog.pause_button.text() == "Resume"
    assert any(" left · " in text for text in progress_seen)
    kept = next(hub.hub_cache_dir().rglob(f"*{hub.PARTIAL_SUFFIX}")).stat().st_size
    with qtbot.waitSignal(dialog.finished_download, timeout=60_000):
        dialog.pause_button.click()
    assert fake.downloads_of("model.safetensors")[-1].range == f"bytes={kept}-"
    dialog.wait_for_workers()


def test_paused_downloads_can_be_resumed_from_the_window(qtbot: QtBot, fake: FakeHub) -> None:
    dialog = open_dialog(qtbot, "org/tiny")
    dialog.start_button.click()
    qtbot.waitUntil(lambda: dialog.state == "downloading" and "model.safetensors" in dialog.speed_label.text())
    dialog.close()  # closing pauses
    qtbot.waitUntil(lambda: dialog.state == "paused", timeout=60_000)
    dialog.wait_for_workers()
    window = make_window(qtbot)  # as after a restart: the window finds the paused download
    assert window.resume_button.isVisibleTo(window) and "Paused downloads: org/tiny" in window.status_label.text()
    window.resume_button.click()
    resumed = window.dialogs[-1]
    qtbot.waitUntil(lambda: resumed.state == "ready", timeout=60_000)
    assert "already downloaded" in resumed.summary.text()
    with qtbot.waitSignal(resumed.finished_download, timeout=60_000):
        resumed.start_button.click()
    window.wait_for_workers()


def test_cancel_deletes_the_partial_download(qtbot: QtBot, fake: FakeHub) -> None:
    dialog = open_dialog(qtbot, "org/tiny")
    dialog.start_button.click()
    qtbot.waitUntil(lambda: dialog.state == "downloading" and "model.safetensors" in dialog.speed_label.text())
    dialog.cancel_button.click()
    qtbot.waitUntil(lambda: dialog.state == "cancelled", timeout=60_000)
    assert not list(hub.hub_cache_dir().rglob(f"*{hub.PARTIAL_SUFFIX}"))
    dialog.wait_for_workers()


def test_gguf_repo_asks_for_a_file(qtbot: QtBot, fake: FakeHub) -> None:
    dialog = open_dialog(qtbot, "org/two-GGUF")
    assert dialog.state == "choose-file" and not dialog.file_choice.isHidden()
    assert [dialog.file_choice.itemData(i) for i in range(dialog.file_choice.count())] == [
        None,
        "a-Q4_K_M.gguf",
        "a-Q8_0.gguf",
    ]
    dialog.file_choice.setCurrentIndex(2)
    dialog.file_choice.activated.emit(2)
    qtbot.waitUntil(lambda: dialog.state == "ready", timeout=60_000)
    assert dialog.plan is not None and [f.name for f in dialog.plan.files] == ["a-Q8_0.gguf"]
    dialog.wait_for_workers()


def test_gated_without_token_shows_the_reason(qtbot: QtBot, fake: FakeHub) -> None:
    dialog = open_dialog(qtbot, "org/gated")
    assert dialog.state == "failed"
    assert "is gated: accept its licence" in dialog.error_label.text()
    assert not dialog.start_button.isEnabled()
    dialog.wait_for_workers()


def test_token_box_saves_to_the_keyring_and_removes(qtbot: QtBot) -> None:
    with memory_keyring.installed(memory_keyring.MemoryKeyring()) as backend:
        box = HubTokenBox()
        qtbot.addWidget(box)
        assert box.status_label.text().startswith("No token")
        assert not box.remove_button.isEnabled()
        box.token_edit.setText(TOKEN)
        with qtbot.waitSignal(box.token_changed):
            box.save_button.click()
        assert backend.store == {("hearth", secrets.HUB_TOKEN_USERNAME): TOKEN}  # type: ignore[attr-defined]
        assert box.token_edit.text() == "" and "saved in the system keyring" in box.status_label.text()
        box.remove_button.click()
        assert backend.store == {} and box.status_label.text().startswith("No token")  # type: ignore[attr-defined]


def test_token_box_without_a_keyring_offers_this_run_only(qtbot: QtBot) -> None:
    with memory_keyring.installed(fail.Keyring()):
        box = HubTokenBox()
        qtbot.addWidget(box)
        box.show()
        assert "No system keyring is available" in box.status_label.text()
        assert box.session_only.isVisible()
        box.token_edit.setText(TOKEN)
        box.save_button.click()
        assert "No system keyring" in box.error_label.text() and "Tick the box" in box.error_label.text()
        assert secrets.hub_token() is None
        box.session_only.setChecked(True)
        box.save_button.click()
        assert box.error_label.text() == ""
        assert "for this run only" in box.status_label.text() and secrets.hub_token() == TOKEN
        box.remove_button.click()
        assert secrets.hub_token() is None
