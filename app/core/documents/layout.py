"""Where documents go in the prompt: FIRST in the user message, in a fixed format, question last.

The engine reuses the KV cache of the longest common token prefix. With the documents ahead of the
question, (a) a follow-up question in the same conversation reuses everything before it (the documents
stay in the first user message, unchanged), and (b) editing or re-asking the question of a message that
carries documents still reuses the system prompt and every document token. Nothing here depends on the
time, the order of a set or anything else that could change between turns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar


class DocumentLike(Protocol):
    """An ExtractedDocument, or the history store's Attachment: what the layout needs of either."""

    @property
    def name(self) -> str: ...
    @property
    def mime_type(self) -> str: ...
    @property
    def text(self) -> str: ...
    @property
    def sha256(self) -> str: ...


DocT = TypeVar("DocT", bound=DocumentLike)


def _attribute(value: str) -> str:
    return value.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;")


def document_header(document: DocumentLike) -> str:
    return f'<document name="{_attribute(document.name)}" type="{document.mime_type}">'


DOCUMENT_FOOTER = "</document>"


def document_block(document: DocumentLike) -> str:
    return f"{document_header(document)}\n{document.text}\n{DOCUMENT_FOOTER}"


def compose_user_message(question: str, documents: Sequence[DocumentLike]) -> str:
    """The user message: each document in attach order, then the question. No documents: the question.

    Works on history Attachments too: build the prompt of a stored message with
    `compose_user_message(message.content, message.attachments)` and it is the same text, token for token."""
    if not documents:
        return question
    blocks = "\n\n".join(document_block(document) for document in documents)
    return f"{blocks}\n\n{question}"


def not_yet_in_conversation(documents: Sequence[DocT], earlier_hashes: set[str]) -> list[DocT]:
    """Documents already sent earlier in the conversation (same sha256) are not repeated: the model
    still sees them in the earlier message, and the prompt does not grow by a second copy."""
    seen = set(earlier_hashes)
    fresh: list[DocT] = []
    for document in documents:
        if document.sha256 not in seen:
            fresh.append(document)
            seen.add(document.sha256)
    return fresh
