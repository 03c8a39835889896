"""Real document files for the documents tests, written with the real libraries (fpdf2, pypdf, python-docx)."""

from __future__ import annotations

from pathlib import Path

SECRET = "The secret code word is PINEAPPLE-42."


def write_pdf(path: Path, pages: list[str]) -> Path:
    from fpdf import FPDF

    pdf = FPDF()
    pdf.set_font("Helvetica", size=11)
    for text in pages:
        pdf.add_page()
        pdf.multi_cell(0, 6, text)
    pdf.output(str(path))
    return path


def write_encrypted_pdf(path: Path, source: Path, user_password: str, owner_password: str | None = None) -> Path:
    from pypdf import PdfWriter

    writer = PdfWriter(clone_from=str(source))
    writer.encrypt(user_password, owner_password=owner_password, algorithm="RC4-128")
    with open(path, "wb") as handle:
        writer.write(handle)
    return path


def write_docx(path: Path, paragraphs: list[str], table: list[list[str]] | None = None) -> Path:
    import docx

    document = docx.Document()
    document.add_heading("Quarterly report", level=1)
    for paragraph in paragraphs:
        document.add_paragraph(paragraph)
    if table:
        grid = document.add_table(rows=len(table), cols=len(table[0]))
        for r, row in enumerate(table):
            for c, value in enumerate(row):
                grid.cell(r, c).text = value
    document.add_paragraph("End of report.")
    document.save(str(path))
    return path


def filler_paragraphs(count: int, topic: str = "weather") -> list[str]:
    """Distinct, plausible paragraphs (BM25 needs real words, the tests need many tokens)."""
    subjects = ["rain", "wind", "clouds", "snow", "sunshine", "fog", "storms", "frost", "humidity", "pressure"]
    return [
        f"Paragraph {i} about the {topic}: the {subjects[i % len(subjects)]} was recorded by station {i * 7} "
        f"in the northern valley, where observers noted changes over {i % 12 + 1} days and filed report {i}."
        for i in range(count)
    ]
