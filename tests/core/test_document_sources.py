"""An attached file reached through a symbolic link is never read silently: the document says which file it really is,
and before a remote engine gets documents, one sentence names every file whose text leaves the computer."""

from __future__ import annotations

from pathlib import Path

from app.core.documents import extract_document, remote_send_notice, source_label


def test_a_link_to_a_file_elsewhere_says_where_it_leads(tmp_path: Path) -> None:
    secret = tmp_path / "elsewhere" / "id_ed25519"
    secret.parent.mkdir()
    secret.write_text("not really a key\n", encoding="utf-8")
    link = tmp_path / "docs" / "notes.txt"
    link.parent.mkdir()
    link.symlink_to(secret)
    document = extract_document(link)
    assert document.via_link and document.path == str(link) and document.real_path == str(secret.resolve())
    assert source_label(document) == f"notes.txt (a link to {secret.resolve()})"


def test_a_linked_folder_on_the_way_counts_as_a_link(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "plan.md").write_text("# Plan\n", encoding="utf-8")
    (tmp_path / "shortcut").symlink_to(tmp_path / "real", target_is_directory=True)
    document = extract_document(tmp_path / "shortcut" / "plan.md")
    assert document.via_link and document.real_path == str((tmp_path / "real" / "plan.md").resolve())


def test_a_plain_file_is_its_own_name(tmp_path: Path) -> None:
    path = tmp_path / "plain.txt"
    path.write_text("hello\n", encoding="utf-8")
    document = extract_document(path)
    assert not document.via_link and source_label(document) == "plain.txt"


def test_the_remote_notice_names_every_file_and_where_links_lead(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a\n", encoding="utf-8")
    (tmp_path / "target.csv").write_text("x,y\n1,2\n", encoding="utf-8")
    (tmp_path / "b.csv").symlink_to(tmp_path / "target.csv")
    documents = [extract_document(tmp_path / "a.txt"), extract_document(tmp_path / "b.csv")]
    notice = remote_send_notice(documents, "engine gpu-box (http://10.0.0.5:8000/v1)")
    assert notice == (
        "The text of these 2 files will leave this computer for engine gpu-box (http://10.0.0.5:8000/v1) when sent: "
        f"a.txt; b.csv (a link to {(tmp_path / 'target.csv').resolve()})."
    )
    assert remote_send_notice(documents[:1], "engine x").startswith("The text of this file will leave")
    assert remote_send_notice([], "engine x") == ""
