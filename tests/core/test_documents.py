"""Extraction of real files (built here with fpdf2, pypdf and python-docx), the bad inputs, the fit choices
and the prompt layout. Token counts use a word counter; the real tokenizer is used in tests/cli."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from app.core.documents import (
    BinaryDocumentError,
    CorruptPdfError,
    DocumentNotFoundError,
    DocumentsDoNotFitError,
    DocumentTooLargeError,
    DocumentVanishedError,
    EmptyDocumentError,
    EncryptedPdfError,
    ExtractedDocument,
    ExtractionCancelledError,
    FolderNotSupportedError,
    UnreadableDocxError,
    UnsupportedDocumentError,
    apply_fit,
    compose_user_message,
    document_block,
    extract_document,
    not_yet_in_conversation,
    plan_fit,
    rank_passages,
    remaining_context,
    split_passages,
    trim_to_tokens,
)
from app.core.documents import extract as extract_module
from app.core.errors import HearthError
from tests.helpers.document_files import (
    SECRET,
    filler_paragraphs,
    write_docx,
    write_encrypted_pdf,
    write_pdf,
)


def count_words(text: str) -> int:
    return len(text.split())


# -- extraction of real files ---------------------------------------------------------------------
def test_pdf_written_with_fpdf2_is_read_page_by_page(tmp_path: Path) -> None:
    path = write_pdf(tmp_path / "report.pdf", ["First page about apples.", f"Second page. {SECRET}"])
    progress: list[float] = []
    document = extract_document(path, progress=progress.append)
    assert document.mime_type == "application/pdf"
    assert document.type_label == "PDF"
    assert document.pages == 2
    assert "apples" in document.text and "PINEAPPLE-42" in document.text
    assert document.text.index("apples") < document.text.index("PINEAPPLE")
    assert document.size_bytes == path.stat().st_size
    assert document.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert progress[-1] == 1.0 and progress == sorted(progress)


def test_pdf_detected_by_content_whatever_the_extension(tmp_path: Path) -> None:
    pdf = write_pdf(tmp_path / "a.pdf", [SECRET])
    renamed = tmp_path / "notes.txt"
    renamed.write_bytes(pdf.read_bytes())
    assert extract_document(renamed).mime_type == "application/pdf"


def test_docx_paragraphs_and_tables_in_reading_order(tmp_path: Path) -> None:
    path = write_docx(tmp_path / "q3.docx", ["Revenue grew.", SECRET], table=[["region", "sales"], ["north", "12"]])
    document = extract_document(path)
    assert document.type_label == "Word"
    assert document.mime_type.endswith("wordprocessingml.document")
    lines = document.text.splitlines()
    assert lines[0] == "Quarterly report"
    assert "PINEAPPLE-42" in document.text
    assert "region\tsales" in lines and "north\t12" in lines
    assert lines.index("north\t12") < lines.index("End of report.")


def test_docx_detected_by_content_without_extension(tmp_path: Path) -> None:
    source = write_docx(tmp_path / "a.docx", [SECRET])
    renamed = tmp_path / "download"
    renamed.write_bytes(source.read_bytes())
    assert extract_document(renamed).type_label == "Word"


def test_utf16_with_bom(tmp_path: Path) -> None:
    text = "Grüße aus Köln — 東京 ✓\nZweite Zeile.\n"
    path = tmp_path / "u16.txt"
    path.write_bytes(text.encode("utf-16"))
    document = extract_document(path)
    assert document.text == text
    assert document.type_label == "Text (UTF-16)"


def test_utf16_without_bom_found_by_charset_detection(tmp_path: Path) -> None:
    text = "Hello world, this file is UTF-16 little endian without a byte order mark.\n" * 4
    path = tmp_path / "u16le.txt"
    path.write_bytes(text.encode("utf-16-le"))
    assert extract_document(path).text == text


def test_latin1_text(tmp_path: Path) -> None:
    text = (
        "Le garçon a mangé une crème brûlée à côté de la fenêtre.\n"
        "Déjà vu : la naïveté du café était évidente.\n"
        "Señor Núñez visitó São Paulo en diciembre.\n"
    )
    path = tmp_path / "notes.txt"
    path.write_bytes(text.encode("latin-1"))
    document = extract_document(path)
    assert document.text == text
    assert document.type_label == "Text (Latin-1)"


def test_cyrillic_code_page_through_charset_normalizer(tmp_path: Path) -> None:
    text = "Привет, мир. Это тестовый текст на русском языке, чтобы проверить кодировку файла.\n" * 3
    path = tmp_path / "ru.txt"
    path.write_bytes(text.encode("cp1251"))
    assert extract_document(path).text == text


def test_csv_and_tsv(tmp_path: Path) -> None:
    csv_path = tmp_path / "people.csv"
    csv_path.write_text("name,age,city\nAnn,34,Oslo\nBob,29,Lima\n", encoding="utf-8")
    document = extract_document(csv_path)
    assert (document.mime_type, document.type_label) == ("text/csv", "CSV")
    assert "Bob,29,Lima" in document.text
    sniffed = tmp_path / "export"
    sniffed.write_text("name\tage\nAnn\t34\nBob\t29\n", encoding="utf-8")
    assert extract_document(sniffed).mime_type == "text/tab-separated-values"


def test_prose_with_commas_is_not_taken_for_csv(tmp_path: Path) -> None:
    path = tmp_path / "story.txt"
    path.write_text(
        "Once, long ago, there was a fox.\nIt ran, jumped, and slept all day long in the sun.\n"
        "Then, one morning, it woke up.\n",
        encoding="utf-8",
    )
    assert extract_document(path).mime_type == "text/plain"


def test_json_markdown_code_and_windows_newlines(tmp_path: Path) -> None:
    data = tmp_path / "config"
    data.write_text(json.dumps({"answer": 42, "list": [1, 2]}), encoding="utf-8")
    assert extract_document(data).mime_type == "application/json"
    markdown = tmp_path / "README.md"
    markdown.write_bytes(b"# Title\r\n\r\nSome *text*.\r\n")
    document = extract_document(markdown)
    assert document.type_label == "Markdown" and document.text == "# Title\n\nSome *text*.\n"
    code = tmp_path / "main.py"
    code.write_text("def main() -> None:\n    print('hi')\n", encoding="utf-8")
    assert extract_document(code).type_label == "Python"


def test_html_becomes_readable_text(tmp_path: Path) -> None:
    path = tmp_path / "page"  # no extension: found by content
    path.write_text(
        "<!DOCTYPE html><html><head><title>Menu</title><style>p{color:red}</style></head>"
        "<body><h1>Dinner</h1><p>Soup &amp; bread</p><script>alert(1)</script>"
        "<ul><li>tea</li><li>cake</li></ul></body></html>",
        encoding="utf-8",
    )
    document = extract_document(path)
    assert document.mime_type == "text/html"
    assert document.text.splitlines()[0] == "Menu"
    assert "Soup & bread" in document.text and "- tea" in document.text
    assert "alert" not in document.text and "color" not in document.text and "<" not in document.text


# -- bad input: each gets its own message -----------------------------------------------------------
def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.txt"
    path.write_bytes(b"")
    with pytest.raises(EmptyDocumentError, match=r"empty\.txt is empty; there is nothing to attach\."):
        extract_document(path)


def test_whitespace_only_file(tmp_path: Path) -> None:
    path = tmp_path / "blank.txt"
    path.write_text("  \n\n\t\n", encoding="utf-8")
    with pytest.raises(EmptyDocumentError, match=r"blank\.txt has no text"):
        extract_document(path)


def test_binary_file(tmp_path: Path) -> None:
    path = tmp_path / "data.bin"
    path.write_bytes(bytes(range(256)) * 8)
    with pytest.raises(BinaryDocumentError, match=r"data\.bin is a binary file, not text"):
        extract_document(path)


def test_image_is_named_in_the_message(tmp_path: Path) -> None:
    path = tmp_path / "photo.txt"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100))
    with pytest.raises(BinaryDocumentError, match=r"photo\.txt is a PNG image"):
        extract_document(path)


def test_huge_file_over_the_configured_limit(tmp_path: Path) -> None:
    path = tmp_path / "big.txt"
    path.write_text("word " * 100_000, encoding="utf-8")
    with pytest.raises(DocumentTooLargeError, match=r"big\.txt is 0\.5 MB, over the 0\.1 MB limit") as info:
        extract_document(path, max_bytes=100_000)
    assert info.value.size_bytes == 500_000 and info.value.limit_bytes == 100_000
    assert extract_document(path, max_bytes=600_000).text.startswith("word word")


def test_password_protected_pdf(tmp_path: Path) -> None:
    source = write_pdf(tmp_path / "plain.pdf", [SECRET])
    locked = write_encrypted_pdf(tmp_path / "locked.pdf", source, user_password="hunter2")
    with pytest.raises(EncryptedPdfError, match=r"locked\.pdf is a password-protected PDF"):
        extract_document(locked)


def test_pdf_with_only_an_owner_password_opens(tmp_path: Path) -> None:
    source = write_pdf(tmp_path / "plain.pdf", [SECRET])
    restricted = write_encrypted_pdf(tmp_path / "restricted.pdf", source, user_password="", owner_password="boss")
    assert "PINEAPPLE-42" in extract_document(restricted).text


def test_truncated_pdf(tmp_path: Path) -> None:
    source = write_pdf(tmp_path / "plain.pdf", [SECRET] * 3)
    broken = tmp_path / "broken.pdf"
    broken.write_bytes(source.read_bytes()[:300])
    with pytest.raises(CorruptPdfError, match=r"broken\.pdf is a damaged or incomplete PDF \(.+\); it could not"):
        extract_document(broken)


def test_pdf_extension_without_pdf_content(tmp_path: Path) -> None:
    fake = tmp_path / "fake.pdf"
    fake.write_text("this is not a pdf", encoding="utf-8")
    with pytest.raises(CorruptPdfError, match="it does not start like a PDF"):
        extract_document(fake)


def test_pdf_without_text_layer(tmp_path: Path) -> None:
    path = write_pdf(tmp_path / "scan.pdf", [""])
    with pytest.raises(EmptyDocumentError, match=r"scan\.pdf has no text layer \(a scanned PDF\?\)"):
        extract_document(path)


def test_unreadable_docx(tmp_path: Path) -> None:
    not_zip = tmp_path / "letter.docx"
    not_zip.write_text("plain text with a docx name", encoding="utf-8")
    with pytest.raises(UnreadableDocxError, match=r"letter\.docx is not a readable Word document"):
        extract_document(not_zip)
    import zipfile

    wrong_zip = tmp_path / "other.docx"
    with zipfile.ZipFile(wrong_zip, "w") as archive:
        archive.writestr("hello.txt", "hi")
    with pytest.raises(UnreadableDocxError, match=r"word/document\.xml is missing"):
        extract_document(wrong_zip)
    broken_xml = tmp_path / "broken.docx"
    with zipfile.ZipFile(broken_xml, "w") as archive:
        archive.writestr("[Content_Types].xml", "<Types")
        archive.writestr("word/document.xml", "<not xml")
    with pytest.raises(UnreadableDocxError, match=r"broken\.docx is not a readable Word document"):
        extract_document(broken_xml)


def test_zip_archive_that_is_not_a_document(tmp_path: Path) -> None:
    import zipfile

    path = tmp_path / "bundle.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("a.txt", "hello")
    with pytest.raises(UnsupportedDocumentError, match=r"bundle\.zip is a ZIP archive"):
        extract_document(path)


def test_folder(tmp_path: Path) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    with pytest.raises(FolderNotSupportedError, match="docs is a folder; attach the files inside it instead"):
        extract_document(folder)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DocumentNotFoundError, match=r"gone\.txt does not exist\."):
        extract_document(tmp_path / "gone.txt")


def test_file_that_vanishes_mid_read(tmp_path: Path) -> None:
    path = tmp_path / "moving.txt"
    path.write_text("line of text\n" * 300_000, encoding="utf-8")  # ~3.9 MB: several read chunks

    def delete_after_first_chunk(fraction: float) -> None:
        if fraction < 0.5 and path.exists():
            path.unlink()

    with pytest.raises(DocumentVanishedError, match=r"moving\.txt was moved, deleted or changed while it was being"):
        extract_document(path, progress=delete_after_first_chunk)


def test_file_rewritten_mid_read(tmp_path: Path) -> None:
    path = tmp_path / "log.txt"
    path.write_text("entry\n" * 600_000, encoding="utf-8")

    def append(fraction: float) -> None:
        if fraction < 0.5:
            with open(path, "a", encoding="utf-8") as handle:
                handle.write("new entry\n")

    with pytest.raises(DocumentVanishedError):
        extract_document(path, progress=append)


def test_cancel_stops_a_big_read(tmp_path: Path) -> None:
    path = tmp_path / "big.txt"
    path.write_text("text\n" * 1_000_000, encoding="utf-8")
    cancel = threading.Event()
    with pytest.raises(ExtractionCancelledError, match=r"Reading big\.txt was cancelled\."):
        extract_document(path, progress=lambda fraction: cancel.set(), cancel=cancel)


def test_every_document_error_is_a_hearth_error(tmp_path: Path) -> None:
    with pytest.raises(HearthError):
        extract_document(tmp_path)


def test_permission_denied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The read itself is refused, as the OS refuses it for a file the user may not read (a chmod would not stop
    # root, which CI runs as).
    path = tmp_path / "secret.txt"
    path.write_text("hidden", encoding="utf-8")
    real_open = open

    def refusing_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        if Path(file) == path:
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(extract_module, "open", refusing_open, raising=False)
    with pytest.raises(HearthError, match=r"secret\.txt could not be read \(permission denied\)"):
        extract_document(path)


# -- fitting ---------------------------------------------------------------------------------------
def make_doc(name: str, text: str) -> ExtractedDocument:
    return ExtractedDocument(name, "text/plain", "Text", len(text), hashlib.sha256(text.encode()).hexdigest(), text)


def test_plan_fit_counts_blocks_and_shares() -> None:
    small = make_doc("small.txt", "one two three")
    big = make_doc("big.txt", " ".join(["word"] * 500))
    decision = plan_fit([small, big], "what is it?", count_tokens=count_words, remaining_tokens=1000)
    assert decision.fits
    assert decision.document_tokens[1] == count_words(document_block(big)) + 2
    assert decision.share_of_remaining(1) == pytest.approx(decision.document_tokens[1] / 1000)
    tight = plan_fit([small, big], "what is it?", count_tokens=count_words, remaining_tokens=300)
    assert not tight.fits
    assert tight.overflow_tokens == tight.total_document_tokens - tight.available_for_documents > 0
    assert remaining_context(8192, 1000, 512) == 6680
    assert remaining_context(100, 90, 50) == 0


def test_cancel_raises_with_the_numbers_and_the_options() -> None:
    big = make_doc("big.txt", " ".join(["word"] * 500))
    decision = plan_fit([big], "q", count_tokens=count_words, remaining_tokens=200)
    with pytest.raises(DocumentsDoNotFitError) as info:
        apply_fit([big], "q", "cancel", count_tokens=count_words, available_tokens=decision.available_for_documents)
    message = str(info.value)
    assert f"need {decision.total_document_tokens:,} tokens but only {decision.available_for_documents:,}" in message
    assert "Nothing was dropped" in message and "--fit trim" in message and "--fit relevant" in message
    assert "8,192-token context window" in str(decision.error(8192))


def test_trim_keeps_small_documents_whole_and_marks_what_was_dropped() -> None:
    small = make_doc("small.txt", "alpha beta gamma")
    big = make_doc("big.txt", "\n".join(f"line {i} of the long file" for i in range(400)))
    budget = 300
    result = apply_fit([small, big], "q", "trim", count_tokens=count_words, available_tokens=budget)
    kept_small, kept_big = result.documents
    assert kept_small is small
    assert kept_big.text.startswith("line 0 of the long file")
    assert "line 399" not in kept_big.text
    total = count_words(big.text)
    assert kept_big.dropped_tokens == result.dropped_tokens > 0
    assert f"{kept_big.dropped_tokens:,} of {total:,} tokens dropped" in kept_big.text
    assert result.notes == (kept_big.fit_note,)
    assert "trimmed big.txt: kept the first" in kept_big.fit_note
    used = sum(count_words(document_block(d)) + 2 for d in result.documents)
    assert used <= budget


def test_trim_to_tokens_cuts_at_a_word_boundary() -> None:
    text = "alpha beta gamma delta epsilon zeta eta theta"
    assert trim_to_tokens(text, 3, count_words) == "alpha beta gamma"
    assert trim_to_tokens(text, 100, count_words) == text
    assert trim_to_tokens(text, 0, count_words) == ""


def test_relevant_passages_keep_the_one_with_the_answer() -> None:
    paragraphs = filler_paragraphs(300)
    paragraphs.insert(217, "Unrelated to weather: " + SECRET + " Remember the secret code word.")
    document = make_doc("log.txt", "\n\n".join(paragraphs))
    question = "What is the secret code word?"
    result = apply_fit([document], question, "relevant", count_tokens=count_words, available_tokens=400)
    (kept,) = result.documents
    assert "PINEAPPLE-42" in kept.text
    assert count_words(document_block(kept)) + 2 <= 400
    assert kept.dropped_tokens > 0 and "ranked by BM25 against the question" in kept.fit_note
    assert "[…]" in kept.text
    trimmed = apply_fit([document], question, "trim", count_tokens=count_words, available_tokens=400)
    assert "PINEAPPLE-42" not in trimmed.documents[0].text  # the answer is past the start


def test_relevant_passages_stay_in_reading_order() -> None:
    paragraphs = filler_paragraphs(120)
    paragraphs[10] = "The zebra count was 17 in March."
    paragraphs[90] = "The zebra count was 30 in June."
    document = make_doc("zoo.txt", "\n\n".join(paragraphs))
    result = apply_fit([document], "zebra count", "relevant", count_tokens=count_words, available_tokens=600)
    text = result.documents[0].text
    assert text.index("17 in March") < text.index("30 in June")


def test_question_that_matches_nothing_keeps_passages_in_order() -> None:
    document = make_doc("log.txt", "\n\n".join(filler_paragraphs(200)))
    result = apply_fit([document], "xylophone?", "relevant", count_tokens=count_words, available_tokens=300)
    assert result.documents[0].text.startswith("Paragraph 0 about")
    assert "matched no words" in result.documents[0].fit_note


def test_split_and_rank_passages() -> None:
    text = "short one\n\nshort two\n\n" + "x" * 3000
    passages = split_passages(text, max_chars=1000)
    assert passages[0] == "short one\n\nshort two"
    assert all(len(p) <= 1000 for p in passages) and "".join(passages[1:]) == "x" * 3000
    assert rank_passages(["cats purr", "dogs bark loudly", "birds sing"], "why do dogs bark?")[0] == 1
    assert rank_passages([], "anything") == []


def test_unknown_fit_choice() -> None:
    with pytest.raises(ValueError, match="unknown fit choice"):
        apply_fit([make_doc("a", "b")], "q", "shrug", count_tokens=count_words, available_tokens=10)


# -- prompt layout ---------------------------------------------------------------------------------
def test_documents_come_first_in_a_stable_format() -> None:
    first = make_doc('a "quoted" name.txt', "alpha")
    second = make_doc("b.csv", "x,y")
    message = compose_user_message("What is alpha?", [first, second])
    assert message == (
        '<document name="a &quot;quoted&quot; name.txt" type="text/plain">\nalpha\n</document>\n\n'
        '<document name="b.csv" type="text/plain">\nx,y\n</document>\n\n'
        "What is alpha?"
    )
    assert compose_user_message("What is alpha?", [first, second]) == message  # deterministic
    other = compose_user_message("And beta?", [first, second])
    shared = next(i for i, (a, b) in enumerate(zip(message, other, strict=False)) if a != b)
    assert shared == message.index("What")  # everything before the question is the same
    assert compose_user_message("plain", []) == "plain"


def test_documents_already_sent_are_not_repeated() -> None:
    first = make_doc("a.txt", "alpha")
    copy = make_doc("a-copy.txt", "alpha")
    second = make_doc("b.txt", "beta")
    assert not_yet_in_conversation([first, copy, second], {first.sha256}) == [second]
    assert not_yet_in_conversation([first, copy], set()) == [first]


def test_history_attachment_from_a_document(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text(SECRET, encoding="utf-8")
    document = extract_document(path)
    attachment = document.as_history_attachment(token_count=12)
    assert (attachment.name, attachment.mime_type, attachment.size_bytes) == ("notes.txt", "text/plain", len(SECRET))
    assert attachment.sha256 == document.sha256 and attachment.text == SECRET and attachment.token_count == 12
    # A stored message rebuilds exactly the prompt it was sent with (same tokens, so the KV cache is reused).
    assert compose_user_message("q?", [attachment]) == compose_user_message("q?", [document])


def test_path_under_a_file_is_unreadable(tmp_path: Path) -> None:
    parent = tmp_path / "plain.txt"
    parent.write_text("x", encoding="utf-8")
    with pytest.raises(HearthError, match=r"child\.txt could not be read \(Not a directory\)"):
        extract_document(parent / "child.txt")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_named_pipe_is_refused(tmp_path: Path) -> None:
    from app.core.documents import NotARegularFileError

    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    with pytest.raises(NotARegularFileError, match="pipe is not a regular file"):
        extract_document(pipe)
