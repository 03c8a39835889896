"""Constrained decoding: `response_format` json_object / json_schema enforced while decoding, with xgrammar.

Each step the matcher fills a bitmask of the tokens that keep the reply valid; the engine masks the logits
(after the model, so the fused CPU path works the same) and tells the matcher which token it picked. The
reply can then only be JSON that parses and matches the schema (or stop early at the length limit).

xgrammar is imported on first use (it takes seconds); its tokenizer tables are built once per tokenizer. On
Linux x86-64 pip installs triton with it, which only its CUDA kernels use: Hearth masks with plain torch and
works without triton (the bundle leaves triton out).
"""

from __future__ import annotations

import json
import threading
from typing import Any

import torch

from app.core.engines.backend import ResponseFormat
from app.core.errors import HearthError

_lock = threading.Lock()
_compilers: dict[int, tuple[Any, Any]] = {}  # id(tokenizer) -> (tokenizer, GrammarCompiler); the tokenizer pins the id


class SchemaError(HearthError):
    """The JSON schema cannot be compiled into a grammar."""


def _compiler(tokenizer: Any, vocab_size: int) -> Any:
    import xgrammar

    with _lock:
        entry = _compilers.get(id(tokenizer))
        if entry is None or entry[0] is not tokenizer:
            info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
            entry = (tokenizer, xgrammar.GrammarCompiler(info, max_threads=1))
            _compilers[id(tokenizer)] = entry
        return entry[1]


class LogitsMask:
    """One reply's grammar state."""

    def __init__(self, compiled: Any, vocab_size: int) -> None:
        import xgrammar

        self._xgr = xgrammar
        self.matcher = xgrammar.GrammarMatcher(compiled)
        self.vocab_size = vocab_size
        self.bitmask = xgrammar.allocate_token_bitmask(1, vocab_size)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits of tokens the grammar forbids set to -inf (in place when on the CPU)."""
        logits = logits.float().contiguous()
        self.matcher.fill_next_token_bitmask(self.bitmask)
        if logits.device.type == "cpu":
            self._xgr.apply_token_bitmask_inplace(logits, self.bitmask, vocab_size=self.vocab_size, backend="cpu")
            return logits
        mask = self.bitmask.to(logits.device, non_blocking=True)
        self._xgr.apply_token_bitmask_inplace(logits, mask, vocab_size=self.vocab_size, backend="torch_native")
        return logits

    def accept(self, token: int) -> None:
        if not self.matcher.accept_token(token):
            raise RuntimeError(f"the grammar rejected token {token}")  # a masked token cannot be picked

    @property
    def finished(self) -> bool:
        return bool(self.matcher.is_terminated())


def logits_mask(tokenizer: Any, vocab_size: int, fmt: ResponseFormat) -> LogitsMask | None:
    """A mask for the response format, or None for free text."""
    if fmt.kind == "text":
        return None
    compiler = _compiler(tokenizer, vocab_size)
    try:
        if fmt.kind == "json_object":
            compiled = compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
        else:
            schema = json.dumps(fmt.json_schema or {"type": "object"})
            # Compact JSON: with free whitespace a small model can pad forever inside the braces.
            compiled = compiler.compile_json_schema(schema, any_whitespace=False, strict_mode=True)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise SchemaError(f"The JSON schema in response_format cannot be enforced: {exc}") from None
    return LogitsMask(compiled, vocab_size)
