"""Errors for attached documents: one clear sentence each, naming the file and what to do."""

from __future__ import annotations

from app.core.errors import HearthError


def _mib(size_bytes: int) -> str:
    return f"{size_bytes / 2**20:,.1f} MB"


class DocumentError(HearthError):
    """A file that cannot be attached; `name` is the file's name as the user knows it."""

    def __init__(self, name: str, message: str) -> None:
        self.name = name
        super().__init__(message)


class DocumentNotFoundError(DocumentError):
    def __init__(self, name: str) -> None:
        super().__init__(name, f"{name} does not exist.")


class FolderNotSupportedError(DocumentError):
    def __init__(self, name: str) -> None:
        super().__init__(name, f"{name} is a folder; attach the files inside it instead.")


class NotARegularFileError(DocumentError):
    def __init__(self, name: str) -> None:
        super().__init__(name, f"{name} is not a regular file (a device, socket or pipe) and cannot be attached.")


class EmptyDocumentError(DocumentError):
    def __init__(self, name: str, reason: str = "is empty") -> None:
        super().__init__(name, f"{name} {reason}; there is nothing to attach.")


class BinaryDocumentError(DocumentError):
    def __init__(self, name: str, what: str = "a binary file") -> None:
        super().__init__(
            name,
            f"{name} is {what}, not text; Hearth reads text, Markdown, code, CSV/TSV, JSON, HTML, PDF and DOCX.",
        )


class DocumentTooLargeError(DocumentError):
    def __init__(self, name: str, size_bytes: int, limit_bytes: int) -> None:
        self.size_bytes = size_bytes
        self.limit_bytes = limit_bytes
        super().__init__(
            name,
            f"{name} is {_mib(size_bytes)}, over the {_mib(limit_bytes)} limit for attachments; "
            "raise the limit in Settings (or --attach-limit) or attach a smaller file.",
        )


class EncryptedPdfError(DocumentError):
    def __init__(self, name: str) -> None:
        super().__init__(name, f"{name} is a password-protected PDF; save an unprotected copy and attach that.")


class CorruptPdfError(DocumentError):
    def __init__(self, name: str, detail: str) -> None:
        super().__init__(name, f"{name} is a damaged or incomplete PDF ({detail}); it could not be read.")


class UnreadableDocxError(DocumentError):
    def __init__(self, name: str, detail: str) -> None:
        super().__init__(name, f"{name} is not a readable Word document ({detail}); re-save it as .docx and retry.")


class UnsupportedDocumentError(DocumentError):
    def __init__(self, name: str, what: str) -> None:
        super().__init__(name, f"{name} is {what}, which Hearth cannot read as a document.")


class DocumentVanishedError(DocumentError):
    def __init__(self, name: str) -> None:
        super().__init__(name, f"{name} was moved, deleted or changed while it was being read; attach it again.")


class DocumentUnreadableError(DocumentError):
    def __init__(self, name: str, detail: str) -> None:
        super().__init__(name, f"{name} could not be read ({detail}).")


class ExtractionCancelledError(DocumentError):
    def __init__(self, name: str) -> None:
        super().__init__(name, f"Reading {name} was cancelled.")


class DocumentsDoNotFitError(HearthError):
    """The attached documents do not fit what is left of the context window; nothing was dropped."""

    def __init__(self, document_tokens: int, available_tokens: int, context_window: int | None = None) -> None:
        self.document_tokens = document_tokens
        self.available_tokens = available_tokens
        window = f" of the {context_window:,}-token context window" if context_window else ""
        super().__init__(
            f"The attached documents need {document_tokens:,} tokens but only {max(available_tokens, 0):,} are "
            f"left{window}. Nothing was dropped: choose --fit trim (keep the start of each document), "
            "--fit relevant (keep the passages most relevant to the question), attach less, or raise --context."
        )
