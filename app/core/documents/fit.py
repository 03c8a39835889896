"""Fitting documents into what is left of the context window, never silently.

`plan_fit` measures; when the documents do not fit, the user picks one of three explicit choices:
- trim: keep the start of each document (small ones stay whole), with a visible marker saying how
  many tokens were dropped;
- relevant: split the documents into passages, rank them against the question with BM25 (the `bm25s`
  library) and keep the best ones that fit, in reading order, with a marker where text was skipped;
- cancel: nothing is sent (DocumentsDoNotFitError carries the numbers and the options).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from app.core.documents.errors import DocumentsDoNotFitError
from app.core.documents.extract import ExtractedDocument
from app.core.documents.layout import DOCUMENT_FOOTER, document_block, document_header

CountTokens = Callable[[str], int]
FitChoice = Literal["trim", "relevant", "cancel"]
FIT_CHOICES: tuple[str, ...] = get_args(FitChoice)

LAYOUT_SLACK = 16  # tokenizers merge differently across the joins between blocks; keep a small margin
MARKER_RESERVE = 24  # the "[… tokens trimmed …]" marker of a trimmed document
PASSAGE_CHARS = 1200  # ~300 tokens of English: big enough to carry a fact with its context
SKIP_MARKER = "\n[…]\n"


@dataclass(frozen=True)
class FitDecision:
    """What the documents need against what is left, per document and in total."""

    document_tokens: tuple[int, ...]  # each document's block as laid out in the prompt
    question_tokens: int
    remaining_tokens: int  # context left for this whole message (documents + question)

    @property
    def total_document_tokens(self) -> int:
        return sum(self.document_tokens)

    @property
    def available_for_documents(self) -> int:
        return max(0, self.remaining_tokens - self.question_tokens - LAYOUT_SLACK)

    @property
    def fits(self) -> bool:
        return self.total_document_tokens <= self.available_for_documents

    @property
    def overflow_tokens(self) -> int:
        return max(0, self.total_document_tokens - self.available_for_documents)

    def share_of_remaining(self, index: int) -> float:
        """One document's share of the remaining context (1.0 = all of it; above 1 does not fit alone)."""
        return self.document_tokens[index] / self.remaining_tokens if self.remaining_tokens > 0 else float("inf")

    def error(self, context_window: int | None = None) -> DocumentsDoNotFitError:
        return DocumentsDoNotFitError(self.total_document_tokens, self.available_for_documents, context_window)


@dataclass(frozen=True)
class FitResult:
    documents: tuple[ExtractedDocument, ...]
    dropped_tokens: int
    notes: tuple[str, ...]  # one line per changed document, for the user


def remaining_context(context_window: int, used_tokens: int, reply_reserve: int) -> int:
    """Tokens left for a new message: the window minus the conversation so far and room for the reply."""
    return max(0, context_window - used_tokens - reply_reserve)


def plan_fit(
    documents: Sequence[ExtractedDocument], question: str, *, count_tokens: CountTokens, remaining_tokens: int
) -> FitDecision:
    return FitDecision(
        document_tokens=tuple(count_tokens(document_block(d)) + 2 for d in documents),  # +2: the blank line
        question_tokens=count_tokens(question),
        remaining_tokens=remaining_tokens,
    )


def apply_fit(
    documents: Sequence[ExtractedDocument],
    question: str,
    choice: FitChoice | str,
    *,
    count_tokens: CountTokens,
    available_tokens: int,
    context_window: int | None = None,
) -> FitResult:
    """Make the documents fit `available_tokens` (their blocks together) the way the user chose."""
    if choice == "trim":
        return _trim(documents, count_tokens, available_tokens)
    if choice == "relevant":
        return _relevant(documents, question, count_tokens, available_tokens)
    if choice == "cancel":
        needed = sum(count_tokens(document_block(d)) + 2 for d in documents)
        raise DocumentsDoNotFitError(needed, available_tokens, context_window)
    raise ValueError(f"unknown fit choice {choice!r}; expected one of {', '.join(FIT_CHOICES)}")


def _overhead(document: ExtractedDocument, count_tokens: CountTokens) -> int:
    return count_tokens(f"{document_header(document)}\n\n{DOCUMENT_FOOTER}") + 2


def _allowances(needs: list[int], budget: int) -> list[int]:
    """Water-filling: documents smaller than a fair share stay whole; the rest split what is left evenly."""
    allowance = [0] * len(needs)
    pending = sorted(range(len(needs)), key=lambda i: needs[i])
    left = budget
    while pending:
        share = left // len(pending)
        index = pending[0]
        if needs[index] <= share:
            allowance[index] = needs[index]
            left -= needs[index]
            pending.pop(0)
            continue
        for index in pending:
            allowance[index] = share
        break
    return allowance


def trim_to_tokens(text: str, max_tokens: int, count_tokens: CountTokens) -> str:
    """The longest start of `text` within `max_tokens`, cut at a line or word boundary when one is near."""
    if max_tokens <= 0:
        return ""
    if count_tokens(text) <= max_tokens:
        return text
    high = min(len(text), max_tokens * 8)
    while high < len(text) and count_tokens(text[:high]) <= max_tokens:
        high = min(len(text), high * 2)
    low = 0  # invariant: text[:low] fits, text[:high] does not
    while high - low > 1:
        middle = (low + high) // 2
        if count_tokens(text[:middle]) <= max_tokens:
            low = middle
        else:
            high = middle
    kept = text[:low]
    for boundary in ("\n", " "):
        cut = kept.rfind(boundary)
        if cut >= len(kept) * 0.9:
            return kept[:cut].rstrip()
    return kept


def _trim(documents: Sequence[ExtractedDocument], count_tokens: CountTokens, budget: int) -> FitResult:
    overheads = [_overhead(d, count_tokens) for d in documents]
    text_tokens = [count_tokens(d.text) for d in documents]
    needs = [o + t for o, t in zip(overheads, text_tokens, strict=True)]
    allowances = _allowances(needs, budget)
    result: list[ExtractedDocument] = []
    notes: list[str] = []
    dropped_total = 0
    for document, overhead, tokens, need, allowance in zip(
        documents, overheads, text_tokens, needs, allowances, strict=True
    ):
        if allowance >= need:
            result.append(document)
            continue
        kept = trim_to_tokens(document.text, allowance - overhead - MARKER_RESERVE, count_tokens)
        kept_tokens = count_tokens(kept) if kept else 0
        dropped = tokens - kept_tokens
        dropped_total += dropped
        note = f"trimmed {document.name}: kept the first {kept_tokens:,} of {tokens:,} tokens, dropped {dropped:,}"
        marker = f"[… the rest of this document was trimmed to fit: {dropped:,} of {tokens:,} tokens dropped …]"
        result.append(document.with_text(f"{kept}\n{marker}".lstrip("\n"), dropped_tokens=dropped, fit_note=note))
        notes.append(note)
    return FitResult(tuple(result), dropped_total, tuple(notes))


# -- relevant passages ---------------------------------------------------------------------------
def split_passages(text: str, max_chars: int = PASSAGE_CHARS) -> list[str]:
    """Paragraphs merged up to `max_chars`; longer paragraphs split at sentence, then word, boundaries."""
    pieces: list[str] = []
    for paragraph in re.split(r"\n\s*\n", text):
        paragraph = paragraph.strip()
        while len(paragraph) > max_chars:
            window = paragraph[:max_chars]
            cut = max(window.rfind(". "), window.rfind("\n"))
            if cut < max_chars // 2:
                cut = window.rfind(" ")
            if cut < max_chars // 2:
                cut = max_chars - 1
            pieces.append(paragraph[: cut + 1].strip())
            paragraph = paragraph[cut + 1 :].strip()
        if paragraph:
            pieces.append(paragraph)
    passages: list[str] = []
    for piece in pieces:
        if passages and len(passages[-1]) + len(piece) + 2 <= max_chars:
            passages[-1] = f"{passages[-1]}\n\n{piece}"
        else:
            passages.append(piece)
    return passages


def rank_passages(passages: Sequence[str], question: str) -> list[int]:
    """Passage indexes best first by BM25 (bm25s, English stopwords); passages that share no term with
    the question keep their reading order at the end."""
    import bm25s

    if not passages:
        return []
    corpus_tokens = bm25s.tokenize(list(passages), stopwords="en", show_progress=False)
    retriever = bm25s.BM25()
    retriever.index(corpus_tokens, show_progress=False)
    query = bm25s.tokenize([question], stopwords="en", return_ids=False, show_progress=False)
    query_terms = [term for term in query[0] if term in corpus_tokens.vocab]
    if not query_terms:
        return list(range(len(passages)))
    documents, scores = retriever.retrieve([query_terms], k=len(passages), show_progress=False)
    ranked = [(int(i), float(s)) for i, s in zip(documents[0], scores[0], strict=True)]
    matched = sorted((i for i, s in ranked if s > 0), key=lambda i: (-dict(ranked)[i], i))
    rest = sorted(i for i, s in ranked if s <= 0)
    return matched + rest


def _relevant(
    documents: Sequence[ExtractedDocument], question: str, count_tokens: CountTokens, budget: int
) -> FitResult:
    overheads = [_overhead(d, count_tokens) for d in documents]
    owners: list[tuple[int, int]] = []  # (document index, passage index within it)
    passages: list[str] = []
    for doc_index, document in enumerate(documents):
        for passage_index, passage in enumerate(split_passages(document.text)):
            owners.append((doc_index, passage_index))
            passages.append(passage)
    order = rank_passages(passages, question)
    separator = count_tokens(SKIP_MARKER)
    left = budget - sum(overheads)
    chosen: set[int] = set()
    misses = 0
    for index in order:
        cost = count_tokens(passages[index]) + separator
        if cost <= left:
            chosen.add(index)
            left -= cost
            misses = 0
        else:
            misses += 1
            if misses > 50 or left < 16:  # nothing more will fit in practice
                break
    matched_any = bool(order) and order != list(range(len(passages)))
    result: list[ExtractedDocument] = []
    notes: list[str] = []
    dropped_total = 0
    for doc_index, document in enumerate(documents):
        mine = [i for i, (owner, _) in enumerate(owners) if owner == doc_index]
        kept = [i for i in mine if i in chosen]
        if len(kept) == len(mine):
            result.append(document)
            continue
        parts: list[str] = []
        previous: int | None = None
        for i in kept:
            if (previous is None and owners[i][1] > 0) or (previous is not None and i != previous + 1):
                parts.append("[…]")
            parts.append(passages[i])
            previous = i
        if kept and kept[-1] != mine[-1]:
            parts.append("[…]")
        total = count_tokens(document.text)
        text = "\n".join(parts) if parts else "[no passage of this document fits or matches the question]"
        kept_tokens = count_tokens(text)
        dropped = max(0, total - kept_tokens)
        dropped_total += dropped
        how = "ranked by BM25 against the question" if matched_any else "the question matched no words, so in order"
        note = (
            f"{document.name}: kept {len(kept)} of {len(mine)} passages ({how}), "
            f"{kept_tokens:,} of {total:,} tokens; dropped {dropped:,}"
        )
        result.append(document.with_text(text, dropped_tokens=dropped, fit_note=note))
        notes.append(note)
    return FitResult(tuple(result), dropped_total, tuple(notes))
