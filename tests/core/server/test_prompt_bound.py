"""The checks that refuse a prompt before the worker (server round 3.4) are proofs: each count they report is a
lower bound of the tokenizer's real count, so no prompt that could fit is ever refused."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from app.core.server.prompt_bound import PIECE_CHARS, PromptBound, _normalizer_shrink, _pieces

TEXTS = {
    "words": "the quick brown fox " * 3000,
    "spaces": ("a" + " " * 37) * 2000,
    "no-spaces": "x" * (3 * PIECE_CHARS + 5),
    "code": ("def f(x):\n" + " " * 8 + "return x  # ok\n\n") * 1500,
    "unicode": "Grüße, 世界! Привет " * 2500,
    "specials": "<|im_start|>user\n" * 2000,
}


@pytest.fixture(scope="module")
def tokenizer_file(default_tokenizer_folder: Path) -> Path:
    return default_tokenizer_folder / "tokenizer.json"


@pytest.fixture(scope="module")
def bound(tokenizer_file: Path) -> PromptBound:
    """Read once for the module; each test sets the window it needs on a copy."""
    read = PromptBound(str(tokenizer_file), 1)
    read.load()
    return read


def loaded(bound: PromptBound, window: int) -> PromptBound:
    copy = PromptBound(None, window)
    copy.tokenizer, copy.bytes_per_token, copy.loaded = bound.tokenizer, bound.bytes_per_token, True
    return copy


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_both_checks_count_at_most_the_real_tokens(bound: PromptBound, name: str) -> None:
    text = TEXTS[name]
    real = len(bound.tokenizer.encode(text, add_special_tokens=False).ids)  # special-token strings as text
    window = real // 3  # every text here is far too long for it
    counted = loaded(bound, window).by_tokens([text])
    assert counted is not None and window <= counted.tokens <= real
    by_bytes = loaded(bound, 1).by_bytes([text])
    assert by_bytes is not None and by_bytes.tokens <= real
    assert loaded(bound, real + 1).by_tokens([text]) is None  # one that fits passes


def test_pieces_are_cut_only_before_a_space() -> None:
    rng = random.Random(7)
    text = "".join(rng.choice(["word", " ", "  ", "\n", "é", "x" * 50]) for _ in range(40_000))
    pieces = _pieces(text)
    assert "".join(pieces) == text and len(pieces) > 3
    for before, after in itertools.pairwise(pieces):
        assert after.startswith(" ") and not before.endswith(" ")


def test_normalizers_that_can_shrink_text_without_bound_turn_the_byte_check_off() -> None:
    prepend = {"type": "Prepend", "prepend": "▁"}
    spaces = {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
    llama = {"type": "Sequence", "normalizers": [prepend, spaces]}
    assert _normalizer_shrink(None) == 1 and _normalizer_shrink(llama) == 1
    assert _normalizer_shrink({"type": "NFKC"}) == 3
    assert _normalizer_shrink({"type": "StripAccents"}) is None
    assert _normalizer_shrink({"type": "Replace", "pattern": {"String": "  "}, "content": " "}) is None
    assert _normalizer_shrink({"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "Strip"}]}) is None
