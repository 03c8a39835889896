"""Attachments in the window never follow a link silently: the chip shows the file it really is, and with a remote
engine loaded the attachment bar names every file whose text will leave the computer, before Send."""

from __future__ import annotations

from pathlib import Path

from pytestqt.qtbot import QtBot

from app.ui.attachments import AttachmentBar


def linked_files(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A plain file, and a link to a file in another folder."""
    plain = tmp_path / "notes.md"
    plain.write_text("# Notes\nShip on Friday.\n", encoding="utf-8")
    target = tmp_path / "private" / "budget-2027.csv"
    target.parent.mkdir()
    target.write_text("item,cost\nlaptop,1200\n", encoding="utf-8")
    link = tmp_path / "budget.csv"
    link.symlink_to(target)
    return plain, link, target.resolve()


def read(qtbot: QtBot, bar: AttachmentBar, paths: list[Path]) -> None:
    """Attach `paths` and wait until each is read."""
    bar.add_paths(paths)
    qtbot.waitUntil(lambda: not bar.busy and len(bar.documents()) == len(paths), timeout=10_000)


def test_a_linked_file_shows_the_file_it_really_is(qtbot: QtBot, tmp_path: Path) -> None:
    plain, link, target = linked_files(tmp_path)
    bar = AttachmentBar()
    qtbot.addWidget(bar)
    bar.show()
    read(qtbot, bar, [plain, link])
    plain_chip, link_chip = bar.chips()
    assert plain_chip.name_label.full_text() == "notes.md" and plain_chip.real_path == ""
    assert link_chip.name_label.full_text() == "budget.csv" and link_chip.link_label.isVisible()
    assert link_chip.link_label.full_text() == str(target)
    shown = link_chip.link_label.text()  # a narrow chip keeps the arrow and the file, cuts the path's start
    assert shown.startswith("→ ") and shown.endswith("budget-2027.csv")
    assert link_chip.real_path == str(target) and str(target) in link_chip.name_label.toolTip()
    assert not plain_chip.link_label.isVisible()
    assert not bar.destination_label.isVisible()  # a model on this computer: nothing leaves it


def test_with_a_remote_destination_the_bar_names_every_file_before_send(qtbot: QtBot, tmp_path: Path) -> None:
    plain, link, target = linked_files(tmp_path)
    bar = AttachmentBar()
    qtbot.addWidget(bar)
    bar.show()
    read(qtbot, bar, [plain, link])
    bar.set_destination("engine gpu-box (http://10.0.0.5:8000/v1)")
    assert bar.destination_label.isVisible()
    text = bar.destination_label.text()
    assert text.startswith("The text of these 2 files will leave this computer for engine gpu-box")
    assert f"notes.md; budget.csv (a link to {target})" in text
    bar.remove(bar.chips()[1].key)
    assert "The text of this file" in bar.destination_label.text() and "budget" not in bar.destination_label.text()
    bar.clear()
    assert not bar.destination_label.isVisible()
