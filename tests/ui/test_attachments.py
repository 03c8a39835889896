"""The attachment bar with real files, real drop/paste events and real worker threads (offscreen Qt)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QEvent, QMimeData, QPoint, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QGuiApplication, QKeyEvent
from PySide6.QtWidgets import QApplication, QDialog, QPlainTextEdit, QWidget
from pytestqt.qtbot import QtBot

from app.core.documents import ExtractedDocument, FitDecision, document_block
from app.ui.attachment_chip import AttachmentChip, FitChoiceDialog
from app.ui.attachments import AttachmentBar, local_paths_from_mime
from tests.helpers.document_files import SECRET, filler_paragraphs, write_docx, write_pdf


def count_words(text: str) -> int:
    return len(text.split())


@pytest.fixture
def bar(qtbot: QtBot) -> Iterator[AttachmentBar]:
    widget = AttachmentBar()
    qtbot.addWidget(widget)
    widget.show()
    yield widget
    widget.shutdown()


def file_mime(*paths: Path) -> QMimeData:
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    return mime


def drop(target: QWidget, mime: QMimeData) -> QDropEvent:
    """A drag entering `target`, then the drop: Qt delivers a drop only to the widget that took the drag."""
    enter = QDragEnterEvent(
        QPoint(5, 5), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier
    )
    QApplication.sendEvent(target, enter)
    event = QDropEvent(
        QPointF(5, 5), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier
    )
    QApplication.sendEvent(target, event)
    return event


def wait_idle(qtbot: QtBot, bar: AttachmentBar) -> None:
    qtbot.waitUntil(lambda: not bar.busy, timeout=20_000)


def test_dropping_several_files_makes_a_chip_each(qtbot: QtBot, bar: AttachmentBar, tmp_path: Path) -> None:
    pdf = write_pdf(tmp_path / "report.pdf", ["Intro page.", SECRET])
    csv = tmp_path / "table.csv"
    csv.write_text("a,b\n1,2\n3,4\n", encoding="utf-8")
    bar.set_token_counter(count_words)
    bar.set_remaining_context(1000)
    with qtbot.waitSignal(bar.attachments_changed, timeout=20_000):
        event = drop(bar, file_mime(pdf, csv))
    assert event.isAccepted()
    wait_idle(qtbot, bar)
    assert [d.name for d in bar.documents()] == ["report.pdf", "table.csv"]
    pdf_chip, csv_chip = bar.chips()
    tokens = bar.token_counts()[0]
    assert tokens is not None and tokens > 0
    assert pdf_chip.name_label.full_text() == "report.pdf"
    assert pdf_chip.detail_label.text() == f"PDF, 2 pages · {tokens:,} tokens · {tokens / 1000:.0%} of free context"
    assert csv_chip.detail_label.text().startswith("CSV · ")
    assert not pdf_chip.progress.isVisible()


def test_drag_enter_accepts_files_only(bar: AttachmentBar, tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_text("hello", encoding="utf-8")
    args = (QPoint(5, 5), Qt.DropAction.CopyAction)
    mime = file_mime(path)  # the event does not own its mime data: keep it alive
    files = QDragEnterEvent(*args, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(bar, files)
    assert files.isAccepted()
    text = QMimeData()
    text.setText("just some words")
    words = QDragEnterEvent(*args, text, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(bar, words)
    assert not words.isAccepted()


def test_drop_on_the_input_box_attaches_and_keeps_the_typed_text(
    qtbot: QtBot, bar: AttachmentBar, tmp_path: Path
) -> None:
    editor = QPlainTextEdit()
    qtbot.addWidget(editor)
    editor.setPlainText("my half-typed question")
    bar.install_drop_target(editor)
    path = write_docx(tmp_path / "memo.docx", [SECRET])
    event = drop(editor.viewport(), file_mime(path))
    assert event.isAccepted()
    wait_idle(qtbot, bar)
    assert [d.name for d in bar.documents()] == ["memo.docx"]
    assert editor.toPlainText() == "my half-typed question"


def test_pasting_a_path_attaches_it_and_plain_text_still_pastes(
    qtbot: QtBot, bar: AttachmentBar, tmp_path: Path
) -> None:
    editor = QPlainTextEdit()
    qtbot.addWidget(editor)
    editor.show()
    editor.setFocus()
    bar.install_drop_target(editor)
    path = tmp_path / "notes.md"
    path.write_text("# Notes\n\n" + SECRET, encoding="utf-8")
    QGuiApplication.clipboard().setText(str(path))
    paste = QKeyEvent(QEvent.Type.KeyPress, Qt.Key.Key_V, Qt.KeyboardModifier.ControlModifier)
    QApplication.sendEvent(editor, paste)
    wait_idle(qtbot, bar)
    assert [d.name for d in bar.documents()] == ["notes.md"]
    assert editor.toPlainText() == ""
    QGuiApplication.clipboard().setText("ordinary words")
    QApplication.sendEvent(editor, QKeyEvent(QEvent.Type.KeyPress, Qt.Key.Key_V, Qt.KeyboardModifier.ControlModifier))
    assert editor.toPlainText() == "ordinary words"
    assert len(bar.documents()) == 1


def test_attach_button_uses_the_file_picker(qtbot: QtBot, bar: AttachmentBar, tmp_path: Path) -> None:
    path = tmp_path / "code.py"
    path.write_text("print('hi')\n", encoding="utf-8")
    bar.file_picker = lambda: [str(path)]
    qtbot.mouseClick(bar.attach_button, Qt.MouseButton.LeftButton)
    wait_idle(qtbot, bar)
    assert bar.documents()[0].type_label == "Python"


def test_bad_files_get_their_own_message_inline(qtbot: QtBot, bar: AttachmentBar, tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    binary = tmp_path / "blob.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    corrupt = tmp_path / "broken.pdf"
    corrupt.write_bytes(b"%PDF-1.7\n garbage that is not a pdf")
    good = tmp_path / "good.txt"
    good.write_text(SECRET, encoding="utf-8")
    editor = QPlainTextEdit("keep me")
    qtbot.addWidget(editor)
    bar.install_drop_target(editor)
    shown: list[str] = []
    bar.error_shown.connect(shown.append)
    drop(editor.viewport(), file_mime(folder, empty, binary, corrupt, good))
    wait_idle(qtbot, bar)
    assert [d.name for d in bar.documents()] == ["good.txt"]
    assert sorted(shown) == sorted(bar.errors())
    by_name = {chip.name_label.full_text(): chip.detail_label.text() for chip in bar.chips()}
    assert by_name["folder"] == "folder is a folder; attach the files inside it instead."
    assert by_name["empty.txt"] == "empty.txt is empty; there is nothing to attach."
    assert by_name["blob.bin"].startswith("blob.bin is a binary file, not text")
    assert by_name["broken.pdf"].startswith("broken.pdf is a damaged or incomplete PDF")
    assert editor.toPlainText() == "keep me"


def test_over_the_size_limit(qtbot: QtBot, tmp_path: Path) -> None:
    small_limit = AttachmentBar(max_bytes=1000)
    qtbot.addWidget(small_limit)
    path = tmp_path / "big.txt"
    path.write_text("x " * 5000, encoding="utf-8")
    small_limit.add_paths([path])
    wait_idle(qtbot, small_limit)
    assert small_limit.errors()[0].startswith("big.txt is 0.0 MB, over the 0.0 MB limit")
    small_limit.shutdown()


def test_reading_and_counting_happen_off_the_gui_thread_with_progress(
    qtbot: QtBot, bar: AttachmentBar, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "large.txt"
    path.write_text("a line of a large text file\n" * 150_000, encoding="utf-8")  # ~4 MiB: four chunks
    threads: list[threading.Thread] = []
    fractions: list[float] = []
    monkeypatch.setattr(AttachmentChip, "set_progress", lambda chip, fraction: fractions.append(fraction))

    def counter(text: str) -> int:
        threads.append(threading.current_thread())
        return count_words(text)

    bar.set_token_counter(counter)
    bar.add_paths([path])
    wait_idle(qtbot, bar)
    assert threads and all(t is not threading.main_thread() for t in threads)
    assert any(0 < f < 1 for f in fractions) and fractions[-1] == 1.0


def test_send_waits_while_files_are_being_read(qtbot: QtBot, bar: AttachmentBar, tmp_path: Path) -> None:
    release = threading.Event()

    def slow_counter(text: str) -> int:
        release.wait(10)
        return count_words(text)

    path = tmp_path / "a.txt"
    path.write_text(SECRET, encoding="utf-8")
    bar.set_token_counter(slow_counter)
    with qtbot.waitSignal(bar.busy_changed):
        bar.add_paths([path])
    assert bar.documents_for_send("what?") is None
    assert "Still reading" in bar.status_label.text()
    release.set()
    wait_idle(qtbot, bar)
    assert bar.documents_for_send("what?") == bar.documents()


def test_remove_cancels_and_drops_the_chip(qtbot: QtBot, bar: AttachmentBar, tmp_path: Path) -> None:
    first = tmp_path / "one.txt"
    first.write_text("one", encoding="utf-8")
    second = tmp_path / "two.txt"
    second.write_text("two", encoding="utf-8")
    bar.add_paths([first, second])
    wait_idle(qtbot, bar)
    qtbot.mouseClick(bar.chips()[0].remove_button, Qt.MouseButton.LeftButton)
    assert [d.name for d in bar.documents()] == ["two.txt"]
    bar.clear()
    assert bar.documents() == [] and bar.chips() == []


def test_new_tokenizer_recounts(qtbot: QtBot, bar: AttachmentBar, tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_text("one two three four", encoding="utf-8")
    bar.add_paths([path])
    wait_idle(qtbot, bar)
    assert bar.token_counts() == [None]
    assert "counted when a model is loaded" in bar.chips()[0].detail_label.text()
    bar.set_token_counter(count_words)
    wait_idle(qtbot, bar)
    assert bar.token_counts()[0] == count_words(document_block(bar.documents()[0])) + 2 == 10


def big_document(tmp_path: Path) -> Path:
    paragraphs = filler_paragraphs(200)
    paragraphs.insert(150, SECRET)
    path = tmp_path / "log.txt"
    path.write_text("\n\n".join(paragraphs), encoding="utf-8")
    return path


@pytest.mark.parametrize("choice", ["trim", "relevant"])
def test_fit_choice_is_explicit_and_reported(qtbot: QtBot, bar: AttachmentBar, tmp_path: Path, choice: str) -> None:
    bar.set_token_counter(count_words)
    bar.set_remaining_context(500)
    bar.add_paths([big_document(tmp_path)])
    wait_idle(qtbot, bar)
    assert "When you send, you choose" in bar.status_label.text()
    asked: list[FitDecision] = []

    def chooser(decision: FitDecision, documents: object) -> str:
        asked.append(decision)
        return choice

    bar.fit_chooser = chooser
    documents = bar.documents_for_send("What is the secret code word?")
    assert asked and not asked[0].fits
    assert documents is not None
    (sent,) = documents
    assert sent.dropped_tokens > 0 and sent.fit_note in bar.status_label.text()
    assert ("PINEAPPLE-42" in sent.text) == (choice == "relevant")
    assert bar.documents()[0].dropped_tokens == 0  # the attached original is unchanged


def test_cancelling_the_fit_sends_nothing(qtbot: QtBot, bar: AttachmentBar, tmp_path: Path) -> None:
    bar.set_token_counter(count_words)
    bar.set_remaining_context(500)
    bar.add_paths([big_document(tmp_path)])
    wait_idle(qtbot, bar)
    bar.fit_chooser = lambda decision, documents: "cancel"
    assert bar.documents_for_send("question?") is None
    assert bar.status_label.text().startswith("Not sent: the documents do not fit.")


def test_documents_that_fit_are_sent_without_asking(qtbot: QtBot, bar: AttachmentBar, tmp_path: Path) -> None:
    path = tmp_path / "small.txt"
    path.write_text(SECRET, encoding="utf-8")
    bar.set_token_counter(count_words)
    bar.set_remaining_context(5000)
    bar.add_paths([path])
    wait_idle(qtbot, bar)
    bar.fit_chooser = lambda decision, documents: pytest.fail("asked although it fits")
    assert bar.documents_for_send("q") == bar.documents()


def test_fit_dialog_buttons(qtbot: QtBot) -> None:
    document = ExtractedDocument("log.txt", "text/plain", "Text", 10, "0" * 64, "text")
    decision = FitDecision(document_tokens=(3000,), question_tokens=10, remaining_tokens=1026)
    dialog = FitChoiceDialog(decision, [document])
    qtbot.addWidget(dialog)
    assert "log.txt needs 3,000 tokens, but only 1,000 are free" in dialog.summary.text()
    assert "drop about 2,000 tokens (67%)" in dialog.trim_button.text()
    dialog.show()
    qtbot.mouseClick(dialog.relevant_button, Qt.MouseButton.LeftButton)
    assert dialog.choice == "relevant" and dialog.result() == QDialog.DialogCode.Accepted
    dialog.show()
    qtbot.mouseClick(dialog.cancel_button, Qt.MouseButton.LeftButton)
    assert dialog.choice == "cancel" and dialog.result() == QDialog.DialogCode.Rejected


def test_pasted_text_that_is_not_a_path_is_left_alone(tmp_path: Path) -> None:
    existing = tmp_path / "x.txt"
    existing.write_text("x", encoding="utf-8")
    mime = QMimeData()
    mime.setText(f"{existing}\nnot a path")
    assert local_paths_from_mime(mime) == []
    mime.setText(f"'{existing}'\n{QUrl.fromLocalFile(str(existing)).toString()}")
    assert local_paths_from_mime(mime) == [existing, existing]


def test_removing_a_file_while_it_is_read(qtbot: QtBot, bar: AttachmentBar, tmp_path: Path) -> None:
    release = threading.Event()

    def slow_counter(text: str) -> int:
        release.wait(10)
        return count_words(text)

    path = tmp_path / "a.txt"
    path.write_text(SECRET, encoding="utf-8")
    bar.set_token_counter(slow_counter)
    bar.add_paths([path])
    assert bar.busy
    with qtbot.waitSignal(bar.busy_changed) as busy:
        bar.remove(bar.chips()[0].key)
    assert busy.args == [False]
    release.set()
    bar.shutdown()
    qtbot.wait(50)  # the late report is delivered and ignored
    assert bar.documents() == [] and bar.chips() == [] and bar.errors() == []
