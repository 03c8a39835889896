"""Refuse a prompt that cannot fit the context window before it reaches the model's one worker thread.

A 4 MiB prompt took the worker seconds to tokenize before its 400, and a burst of them queued every other request
out. Two checks run on the server's side instead, each a proof, never a guess (the engine's own count stays the last
word for everything they let through):

1. Bytes: no token of this tokenizer stands for more than `max_token_bytes` bytes of text, so a prompt of B bytes is
   at least B / max_token_bytes tokens. Free, and enough for any body near the size limit.
2. Tokens: the message texts are tokenized (off the worker, one request at a time) in pieces cut at spaces, where the
   pre-tokenizers split anyway, stopping as soon as the count proves the prompt too long: it costs about one
   window's worth of tokenizing however long the prompt is.

Only the messages' own text is counted (as text: special-token strings in it are not control tokens, see
chat_format), and one token per piece is taken off for what a cut could have changed, so the bound stays a lower one.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

PIECE_CHARS = 16_384  # text tokenized per call while counting
SMALL_PROMPT_BYTES = 4096  # below this, counting ahead of the engine is not worth it
# Normalizers that never shrink text by more than this factor (bytes in, bytes out); any other (one that strips
# accents or whitespace can shrink text without bound) turns the byte check off.
BOUNDED_NORMALIZERS = {"Prepend": 1, "Replace": 1, "NFC": 3, "NFKC": 3, "NFD": 3, "NFKD": 3, "Lowercase": 2}


@dataclass(frozen=True)
class TooLong:
    """Why a prompt cannot fit: at least `tokens` tokens, for a window of `window`."""

    tokens: int
    window: int
    text_bytes: int
    by_bytes: bool  # proven from the byte count alone

    def message(self) -> str:
        how = (
            f"its {self.text_bytes:,} bytes of text are at least {self.tokens:,} tokens for this model's tokenizer"
            if self.by_bytes
            else f"its text alone is at least {self.tokens:,} tokens"
        )
        return (
            f"The prompt cannot fit: {how}, and the model's context window is {self.window:,} tokens. Nothing was "
            "truncated: shorten the prompt or split the work over several requests."
        )


class PromptBound:
    """The two checks for one model's tokenizer (tokenizer.json, read with the Rust `tokenizers` library: no torch,
    safe from any thread). Without a tokenizer file, nothing is refused here."""

    def __init__(self, tokenizer_file: str | None, context_window: int) -> None:
        self.window = context_window
        self.tokenizer_file = tokenizer_file if context_window > 0 else None
        self.tokenizer: Any = None
        self.bytes_per_token = 0.0  # 0: the byte check is off
        self._lock = threading.Lock()
        self.loaded = not self.tokenizer_file  # nothing to load: both checks stay off

    def load(self) -> None:
        """Read the tokenizer (about half a second for a 50k vocabulary): at the first request, off the event loop."""
        with self._lock:
            if self.loaded or not self.tokenizer_file:
                return
            try:
                self._load(Path(self.tokenizer_file))
            except Exception as exc:  # a tokenizer the library can't read: the engine still checks every prompt
                log.warning("prompt size checks off: %s could not be read (%s)", self.tokenizer_file, exc)
                self.tokenizer = None
                self.bytes_per_token = 0.0
            self.loaded = True

    def _load(self, path: Path) -> None:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(path))
        tokenizer.encode_special_tokens = True  # count special-token strings in user text as the text they are
        self.tokenizer = tokenizer
        spec = json.loads(tokenizer.to_str())
        byte_level = "ByteLevel" in json.dumps([spec.get("pre_tokenizer"), spec.get("decoder")])
        # A byte-level vocabulary spells each byte as one character; otherwise a character is at most its UTF-8.
        longest = max((len(t) if byte_level else len(t.encode()) for t in tokenizer.get_vocab(True)), default=0)
        shrink = _normalizer_shrink(spec.get("normalizer"))
        if longest > 0 and shrink is not None:
            self.bytes_per_token = float(longest * shrink)

    def by_bytes(self, texts: Sequence[str]) -> TooLong | None:
        """The free check: what the bytes alone prove."""
        if self.bytes_per_token <= 0:
            return None
        size = sum(len(text.encode("utf-8", "surrogatepass")) for text in texts)
        tokens = int(size // self.bytes_per_token) - len(texts)
        return TooLong(tokens, self.window, size, by_bytes=True) if tokens >= self.window else None

    def by_tokens(self, texts: Sequence[str]) -> TooLong | None:
        """The counting check (seconds at most, so call it off the event loop): stops once the count proves it."""
        if self.tokenizer is None or sum(len(text) for text in texts) < SMALL_PROMPT_BYTES:
            return None
        counted = 0
        for text in texts:
            for piece in _pieces(text):
                counted += len(self.tokenizer.encode(piece, add_special_tokens=False).ids) - 1
                if counted >= self.window:
                    size = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
                    return TooLong(counted, self.window, size, by_bytes=False)
        return None


def _normalizer_shrink(spec: Any) -> int | None:
    """How many times fewer bytes a normalizer can make of a text (1: never fewer); None when unbounded/unknown."""
    if spec is None:
        return 1
    if not isinstance(spec, dict):
        return None
    kind = spec.get("type")
    if kind == "Sequence":
        factor = 1
        for inner in spec.get("normalizers") or []:
            inner_factor = _normalizer_shrink(inner)
            if inner_factor is None:
                return None
            factor *= inner_factor
        return factor
    if kind == "Replace":  # shrinks only where the replacement is shorter than what it replaces
        pattern = spec.get("pattern") or {}
        found = str(pattern.get("String") or "") if isinstance(pattern, dict) else ""
        if not found or len(str(spec.get("content") or "").encode()) < len(found.encode()):
            return None
    return BOUNDED_NORMALIZERS.get(str(kind))


def _pieces(text: str) -> list[str]:
    """`text` cut before a space about every PIECE_CHARS characters (never inside a run of non-space text)."""
    pieces, start = [], 0
    while len(text) - start > PIECE_CHARS:
        cut = text.rfind(" ", start + 1, start + PIECE_CHARS)
        if cut <= start:
            cut = text.find(" ", start + PIECE_CHARS)
            if cut == -1:
                break
        while cut > start + 1 and text[cut - 1] == " ":  # cut before a run of spaces, not inside it
            cut -= 1
        if cut <= start:
            break
        pieces.append(text[start:cut])
        start = cut
    pieces.append(text[start:])
    return pieces
