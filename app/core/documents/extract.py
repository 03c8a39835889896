"""Read a file the user attached into text: the type comes from the content (magic bytes, zip members,
charset detection), the extension only breaks ties. Every bad input raises a specific DocumentError.

Big files report progress and can be cancelled between chunks (reading) and pages (PDF).
"""

from __future__ import annotations

import codecs
import csv
import hashlib
import io
import json
import os
import re
import stat
import threading
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from app.core.documents.errors import (
    BinaryDocumentError,
    CorruptPdfError,
    DocumentNotFoundError,
    DocumentTooLargeError,
    DocumentUnreadableError,
    DocumentVanishedError,
    EmptyDocumentError,
    EncryptedPdfError,
    ExtractionCancelledError,
    FolderNotSupportedError,
    NotARegularFileError,
    UnreadableDocxError,
    UnsupportedDocumentError,
)
from app.core.documents.html_text import html_to_text, looks_like_html

DEFAULT_MAX_BYTES = 50 * 2**20  # generous: a 50 MB PDF is a whole book
READ_CHUNK = 1 << 20
_NON_ASCII = re.compile(r"[^\x00-\x7f]")
CHARSET_SAMPLE = 1 << 20  # charset-normalizer looks at the first MiB

Progress = Callable[[float], None]

# Binary formats recognised by their first bytes, so the message can say what the file is.
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF87a", "a GIF image"),
    (b"GIF89a", "a GIF image"),
    (b"RIFF", "an audio, video or image (RIFF) file"),
    (b"\x7fELF", "a program (ELF executable)"),
    (b"\x1f\x8b", "a gzip archive"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"),
    (b"Rar!", "a RAR archive"),
    (b"\xfd7zXZ\x00", "an xz archive"),
    (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "an old-style Office file (.doc/.xls); save it as .docx"),
    (b"SQLite format 3\x00", "an SQLite database"),
    (b"OggS", "an Ogg audio/video file"),
    (b"ID3\x03", "an MP3 audio file"),
    (b"ID3\x04", "an MP3 audio file"),
    (b"fLaC", "a FLAC audio file"),
    (b"GGUF", "a GGUF model file"),
)
_BOMS: tuple[tuple[bytes, str], ...] = (
    (b"\xef\xbb\xbf", "utf-8-sig"),
    (b"\xff\xfe\x00\x00", "utf-32"),
    (b"\x00\x00\xfe\xff", "utf-32"),
    (b"\xff\xfe", "utf-16"),
    (b"\xfe\xff", "utf-16"),
)
_CODE_EXTENSIONS: dict[str, str] = {
    ".py": "Python", ".pyi": "Python", ".js": "JavaScript", ".mjs": "JavaScript", ".ts": "TypeScript",
    ".tsx": "TypeScript", ".jsx": "JavaScript", ".c": "C", ".h": "C", ".cc": "C++", ".cpp": "C++",
    ".hpp": "C++", ".cs": "C#", ".java": "Java", ".kt": "Kotlin", ".go": "Go", ".rs": "Rust", ".rb": "Ruby",
    ".php": "PHP", ".swift": "Swift", ".m": "Objective-C", ".scala": "Scala", ".sh": "Shell", ".bash": "Shell",
    ".zsh": "Shell", ".ps1": "PowerShell", ".sql": "SQL", ".r": "R", ".lua": "Lua", ".pl": "Perl",
    ".hs": "Haskell", ".ex": "Elixir", ".exs": "Elixir", ".erl": "Erlang", ".jl": "Julia", ".dart": "Dart",
    ".css": "CSS", ".scss": "SCSS", ".toml": "TOML", ".yaml": "YAML", ".yml": "YAML", ".ini": "INI",
    ".cfg": "INI", ".xml": "XML", ".tex": "LaTeX", ".vue": "Vue", ".svelte": "Svelte", ".cmake": "CMake",
}  # fmt: skip
_MARKDOWN_EXTENSIONS = {".md", ".markdown", ".mdown", ".mkd", ".rst"}


@dataclass(frozen=True)
class ExtractedDocument:
    """A file's text and identity, ready to go into a prompt and into the history."""

    name: str
    mime_type: str
    type_label: str  # what the chip shows: "PDF", "Word", "CSV", "Python", "Text (Latin-1)", …
    size_bytes: int
    sha256: str
    text: str
    encoding: str | None = None
    pages: int | None = None
    dropped_tokens: int = 0  # > 0 once trimmed or reduced to passages to fit the context
    fit_note: str = ""  # what was done to fit, shown to the user
    path: str = ""  # the path as given (absolute)
    real_path: str = ""  # the file actually read: differs from `path` when a link led elsewhere

    @property
    def via_link(self) -> bool:
        """A symbolic link (the file or a folder on its way) led to a file elsewhere: say where, never silently."""
        return bool(self.real_path) and self.real_path != self.path

    def with_text(self, text: str, *, dropped_tokens: int, fit_note: str) -> ExtractedDocument:
        return replace(self, text=text, dropped_tokens=dropped_tokens, fit_note=fit_note)

    def as_history_attachment(self, token_count: int) -> Any:
        """The history store's Attachment (extracted text plus name, type, size and hash)."""
        from app.core.storage.history import Attachment  # imported late: the history store is optional here

        return Attachment(
            name=self.name,
            mime_type=self.mime_type,
            size_bytes=self.size_bytes,
            sha256=self.sha256,
            text=self.text,
            token_count=token_count,
        )


def _check(cancel: threading.Event | None, name: str) -> None:
    if cancel is not None and cancel.is_set():
        raise ExtractionCancelledError(name)


def _report(progress: Progress | None, fraction: float) -> None:
    if progress is not None:
        progress(min(max(fraction, 0.0), 1.0))


def read_file_bytes(
    path: Path,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
) -> bytes:
    """The file's bytes, with the checks every attachment gets (exists, a file, not empty, not huge)."""
    name = path.name or str(path)
    try:
        info = os.stat(path)
    except FileNotFoundError as exc:
        raise DocumentNotFoundError(name) from exc
    except OSError as exc:
        raise DocumentUnreadableError(name, exc.strerror or str(exc)) from exc
    if stat.S_ISDIR(info.st_mode):
        raise FolderNotSupportedError(name)
    if not stat.S_ISREG(info.st_mode):
        raise NotARegularFileError(name)
    if info.st_size > max_bytes:
        raise DocumentTooLargeError(name, info.st_size, max_bytes)
    if info.st_size == 0:
        raise EmptyDocumentError(name)
    chunks: list[bytes] = []
    total = 0
    try:
        with open(path, "rb") as handle:
            while True:
                _check(cancel, name)
                chunk = handle.read(READ_CHUNK)
                if not chunk:
                    break
                total += len(chunk)
                if total > max_bytes:  # it grew after the stat
                    raise DocumentTooLargeError(name, total, max_bytes)
                chunks.append(chunk)
                _report(progress, total / info.st_size)
        after = os.stat(path)
    except FileNotFoundError as exc:
        raise DocumentVanishedError(name) from exc
    except PermissionError as exc:
        raise DocumentUnreadableError(name, "permission denied") from exc
    except OSError as exc:
        raise DocumentUnreadableError(name, exc.strerror or str(exc)) from exc
    # Gone, replaced or rewritten while we read it: what we hold may be half of two versions.
    if (after.st_ino, after.st_size, after.st_mtime_ns) != (info.st_ino, info.st_size, info.st_mtime_ns):
        raise DocumentVanishedError(name)
    if total != info.st_size:
        raise DocumentVanishedError(name)
    return b"".join(chunks)


def extract_document(
    path: str | os.PathLike[str],
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
) -> ExtractedDocument:
    """Read and convert one file. Progress goes 0→1 (reading is the first half for PDF/DOCX)."""
    path = Path(path)
    name = path.name or str(path)
    head_bytes = _peek(path)
    container = head_bytes.startswith((b"%PDF-", b"PK\x03\x04")) or b"%PDF-" in head_bytes[:1024]

    def read_progress(fraction: float) -> None:
        _report(progress, fraction * (0.5 if container else 0.9))

    data = read_file_bytes(path, max_bytes=max_bytes, progress=read_progress, cancel=cancel)
    digest = hashlib.sha256(data).hexdigest()
    suffix = path.suffix.lower()
    if b"%PDF-" in data[:1024]:
        text, pages = _pdf_text(data, name, progress, cancel)
        document = ExtractedDocument(name, "application/pdf", "PDF", len(data), digest, text, pages=pages)
    elif data.startswith(b"PK\x03\x04") or suffix == ".docx":
        text = _docx_text(data, name, suffix)
        mime = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
        document = ExtractedDocument(name, mime, "Word", len(data), digest, text)
    else:
        if suffix == ".pdf":
            raise CorruptPdfError(name, "it does not start like a PDF")
        document = _text_document(data, name, suffix, digest)
    _check(cancel, name)
    if not document.text.strip():
        reason = "has no text layer (a scanned PDF?)" if document.mime_type == "application/pdf" else "has no text"
        raise EmptyDocumentError(name, reason)
    _report(progress, 1.0)
    return replace(document, path=os.path.abspath(path), real_path=os.path.realpath(path))


def _peek(path: Path) -> bytes:
    try:
        if not path.is_file():  # never open a pipe or a device: it could block forever
            return b""
        with open(path, "rb") as handle:
            return handle.read(1024)
    except OSError:
        return b""  # read_file_bytes gives the specific error


# -- PDF ------------------------------------------------------------------------------------------
def _pdf_text(data: bytes, name: str, progress: Progress | None, cancel: threading.Event | None) -> tuple[str, int]:
    import logging

    from pypdf import PdfReader
    from pypdf.errors import FileNotDecryptedError, PdfReadError

    logging.getLogger("pypdf").setLevel(logging.ERROR)  # damaged-but-readable files log a lot
    try:
        reader = PdfReader(io.BytesIO(data), strict=False)
        if reader.is_encrypted:
            # Owner-password-only PDFs (print/copy restrictions) open with the empty user password.
            try:
                opened = reader.decrypt("")
            except Exception as exc:  # unsupported crypto (AES without the cryptography package), broken tables
                raise EncryptedPdfError(name) from exc
            if not opened:
                raise EncryptedPdfError(name)
        page_count = len(reader.pages)
    except EncryptedPdfError:
        raise
    except FileNotDecryptedError as exc:
        raise EncryptedPdfError(name) from exc
    except (PdfReadError, ValueError, KeyError, TypeError, AttributeError, IndexError, OSError) as exc:
        raise CorruptPdfError(name, _short(exc)) from exc
    if page_count == 0:
        raise CorruptPdfError(name, "it has no pages")
    texts: list[str] = []
    for number in range(page_count):
        _check(cancel, name)
        try:
            page_text = reader.pages[number].extract_text() or ""
        except FileNotDecryptedError as exc:
            raise EncryptedPdfError(name) from exc
        except Exception as exc:  # pypdf raises many types on damaged content streams
            raise CorruptPdfError(name, f"page {number + 1}: {_short(exc)}") from exc
        texts.append(page_text.strip())
        _report(progress, 0.5 + 0.5 * (number + 1) / page_count)
    return "\n\n".join(t for t in texts if t), page_count


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:120]


# -- DOCX -----------------------------------------------------------------------------------------
def _docx_text(data: bytes, name: str, suffix: str) -> str:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        members = set(archive.namelist())
    except zipfile.BadZipFile as exc:
        if suffix == ".docx":
            raise UnreadableDocxError(name, "it is not a valid ZIP package") from exc
        raise UnsupportedDocumentError(name, "a damaged ZIP archive") from exc
    if "word/document.xml" not in members:
        if suffix == ".docx":
            raise UnreadableDocxError(name, "word/document.xml is missing")
        if "xl/workbook.xml" in members:
            raise UnsupportedDocumentError(name, "an Excel workbook (save it as CSV to attach it)")
        if "ppt/presentation.xml" in members:
            raise UnsupportedDocumentError(name, "a PowerPoint presentation")
        if "content.xml" in members:
            raise UnsupportedDocumentError(name, "an OpenDocument file (save it as .docx to attach it)")
        raise UnsupportedDocumentError(name, "a ZIP archive")
    from docx import Document
    from docx.table import Table

    try:
        document = Document(io.BytesIO(data))
        blocks: list[str] = []
        for block in document.iter_inner_content():
            if isinstance(block, Table):
                for row in block.rows:
                    blocks.append("\t".join(cell.text.strip() for cell in row.cells))
            else:
                blocks.append(block.text)
    except Exception as exc:  # python-docx raises KeyError, lxml XMLSyntaxError, PackageNotFoundError, …
        raise UnreadableDocxError(name, _short(exc)) from exc
    return "\n".join(blocks).strip()


# -- text -----------------------------------------------------------------------------------------
def _decode(data: bytes, name: str) -> tuple[str, str]:
    """(text, encoding). UTF-8 first (the common case, and fast), then BOMs, then charset-normalizer."""
    for magic, what in _MAGIC:
        if data.startswith(magic):
            raise BinaryDocumentError(name, what)
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            try:
                return data.decode(encoding), encoding.removesuffix("-sig")
            except UnicodeDecodeError as exc:
                raise BinaryDocumentError(name) from exc
    if b"\x00" not in data[:8192]:
        try:
            return data.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            pass
    western = _western_single_byte(data)
    if western is not None:
        return western
    from charset_normalizer import from_bytes

    sample = data
    if len(data) > CHARSET_SAMPLE:  # detection on a sample ending at a line break; decoding on all of it
        cut = data.rfind(b"\n", 0, CHARSET_SAMPLE)
        sample = data[: cut + 1] if cut > 0 else data[:CHARSET_SAMPLE]
    best = from_bytes(sample).best()
    if best is None:
        raise BinaryDocumentError(name)
    return data.decode(best.encoding, errors="replace"), best.encoding


def _western_single_byte(data: bytes) -> tuple[str, str] | None:
    """Latin-1 / Windows-1252 text (accented letters inside otherwise ASCII words), which charset
    detectors often mistake for a Baltic or a CJK code page on short or mostly-ASCII files."""
    try:
        text = data.decode("cp1252")
    except UnicodeDecodeError:
        return None
    sample = text[: 1 << 20]
    total = in_words = 0
    for match in _NON_ASCII.finditer(sample):
        index, char = match.start(), match.group()
        total += 1
        neighbours = sample[max(0, index - 1) : index] + sample[index + 1 : index + 2]
        if char.isalpha() and any(n.isascii() and n.isalpha() for n in neighbours):
            in_words += 1
    if total == 0 or in_words < 0.9 * total:
        return None
    plain_latin1 = re.search(rb"[\x80-\x9f]", data) is None
    return (data.decode("latin-1"), "latin-1") if plain_latin1 else (text, "cp1252")


def _control_ratio(text: str) -> float:
    sample = text[:65536]
    if not sample:
        return 0.0
    controls = sum(1 for ch in sample if (ord(ch) < 32 and ch not in "\t\n\r\f\v") or ch == "\ufffd")
    return controls / len(sample)


def _encoding_label(encoding: str) -> str:
    try:
        canonical = codecs.lookup(encoding).name
    except LookupError:
        canonical = encoding
    names = {"utf-8": "", "ascii": "", "utf-16": "UTF-16", "utf-16-le": "UTF-16", "utf-16-be": "UTF-16",
             "utf-32": "UTF-32", "utf-32-le": "UTF-32", "utf-32-be": "UTF-32", "iso8859-1": "Latin-1",
             "cp1252": "Windows-1252"}  # fmt: skip
    label = names.get(canonical, canonical)
    return f" ({label})" if label else ""


def _looks_tabular(text: str, delimiter: str) -> bool:
    """Content sniffing for files without a telling extension: 3+ rows with the same 2+ short fields."""
    lines = [line for line in text[:16384].splitlines()[:20] if line.strip()]
    if len(lines) < 3:
        return False
    try:
        rows = list(csv.reader(lines, delimiter=delimiter))
    except csv.Error:
        return False
    widths = {len(row) for row in rows}
    if len(widths) != 1 or widths.pop() < 2:
        return False
    fields = [field for row in rows for field in row]
    later = [field for row in rows for field in row[1:]]
    prose = sum(field.startswith(" ") for field in later) > len(later) / 2  # "Once, long ago, …"
    sentences = sum(row[-1].rstrip().endswith((".", "!", "?")) for row in rows) > len(rows) / 2
    return not prose and not sentences and sum(map(len, fields)) / len(fields) < 24


def _text_document(data: bytes, name: str, suffix: str, digest: str) -> ExtractedDocument:
    text, encoding = _decode(data, name)
    if _control_ratio(text) > 0.01:
        raise BinaryDocumentError(name)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    enc = _encoding_label(encoding)
    size = len(data)

    def make(mime: str, label: str, body: str | None = None) -> ExtractedDocument:
        return ExtractedDocument(name, mime, label + enc, size, digest, text if body is None else body, encoding)

    stripped = text.lstrip()
    if suffix == ".json" or (stripped[:1] in ("{", "[") and suffix not in _CODE_EXTENSIONS):
        try:
            json.loads(text)
            return make("application/json", "JSON")
        except ValueError:
            if suffix == ".json":
                return make("application/json", "JSON (invalid)")
    if suffix in (".html", ".htm", ".xhtml") or looks_like_html(text):
        return make("text/html", "HTML", html_to_text(text))
    if suffix == ".tsv" or (suffix in ("", ".txt", ".tab") and _looks_tabular(text, "\t")):
        return make("text/tab-separated-values", "TSV")
    if suffix == ".csv" or (suffix in ("", ".txt") and _looks_tabular(text, ",")):
        return make("text/csv", "CSV")
    if suffix in _MARKDOWN_EXTENSIONS:
        return make("text/markdown", "Markdown")
    if suffix in _CODE_EXTENSIONS:
        language = _CODE_EXTENSIONS[suffix]
        return make(f"text/x-{language.lower().replace('+', 'p').replace('#', 'sharp')}", language)
    if stripped.startswith("#!"):
        return make("text/x-script", "Script")
    return make("text/plain", "Text")
