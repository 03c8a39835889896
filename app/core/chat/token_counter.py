"""Count tokens with a model's `tokenizer.json` alone: torch-free, so the GUI thread and its helpers can use it.

The `tokenizers` library (Rust) encodes from any thread; the GUI gets the file's path from the worker after a load.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

TokenCounter = Callable[[str], int]


def load_token_counter(tokenizer_file: str | Path) -> TokenCounter:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    tokenizer.encode_special_tokens = True  # as the prompt holds user text: '<|im_start|>' in it is text (chat_format)

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    return count
