"""Where an attached document's text came from, and where it goes: a link is never followed silently, and before a
remote engine gets documents, the window and `hearth chat --attach` say which files' text will leave this machine.
"""

from __future__ import annotations

from collections.abc import Sequence

from app.core.documents.extract import ExtractedDocument


def source_label(document: ExtractedDocument) -> str:
    """The document's name, and the file it really is when a link led there: "notes.txt (a link to /etc/hosts)"."""
    return f"{document.name} (a link to {document.real_path})" if document.via_link else document.name


def remote_send_notice(documents: Sequence[ExtractedDocument], destination: str) -> str:
    """One sentence naming every file whose text a remote engine will receive; "" without documents."""
    if not documents:
        return ""
    files = "; ".join(source_label(document) for document in documents)
    text = "The text of this file" if len(documents) == 1 else f"The text of these {len(documents)} files"
    return f"{text} will leave this computer for {destination} when sent: {files}."
