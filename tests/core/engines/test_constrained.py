"""Constrained decoding with xgrammar on the real tokenizer: the mask only lets valid JSON through."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from app.core.engines.backend import ResponseFormat
from app.core.engines.constrained import SchemaError, logits_mask

REPO = Path(__file__).resolve().parents[3]
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}


def greedy_through_mask(loaded: Any, fmt: ResponseFormat, steps: int = 20) -> str:
    """Random logits, masked: whatever the 'model' prefers, the picked tokens spell valid JSON."""
    vocab = loaded.model.config.vocab_size
    mask = logits_mask(loaded.tokenizer, vocab, fmt)
    assert mask is not None
    generator = torch.Generator().manual_seed(0)
    picked: list[int] = []
    for _ in range(steps):
        logits = torch.randn(1, vocab, generator=generator)
        token = int(torch.argmax(mask.apply(logits), dim=-1))
        mask.accept(token)
        picked.append(token)
        if mask.finished:
            break
    assert mask.finished, loaded.tokenizer.decode(picked)
    return str(loaded.tokenizer.decode(picked, skip_special_tokens=True))


def test_schema_mask_spells_valid_json(default_loaded: Any) -> None:
    text = greedy_through_mask(default_loaded, ResponseFormat("json_schema", SCHEMA))
    assert set(json.loads(text)) == {"ok"}


def test_text_format_has_no_mask(default_loaded: Any) -> None:
    assert logits_mask(default_loaded.tokenizer, 49152, ResponseFormat()) is None


def test_a_schema_that_cannot_compile_is_a_clear_error(default_loaded: Any) -> None:
    with pytest.raises(SchemaError, match="The JSON schema in response_format cannot be enforced"):
        logits_mask(default_loaded.tokenizer, 49152, ResponseFormat("json_schema", {"type": "no-such-type"}))


def test_works_without_triton(default_tokenizer_folder: Path) -> None:
    """pip installs triton with xgrammar on Linux; the CPU bundle leaves it out: masking must not need it."""
    code = (
        "import sys; sys.modules['triton'] = None\n"  # any `import triton` now fails
        "import torch, xgrammar\n"
        "from transformers import AutoTokenizer\n"
        "from app.core.engines.backend import ResponseFormat\n"
        "from app.core.engines.constrained import logits_mask\n"
        f"tok = AutoTokenizer.from_pretrained({str(default_tokenizer_folder)!r})\n"
        "mask = logits_mask(tok, 49152, ResponseFormat('json_object'))\n"
        "logits = mask.apply(torch.zeros(1, 49152))\n"
        "allowed = int((logits > -1e30).sum())\n"
        "assert 0 < allowed < 49152, allowed\n"
        "print('ok', allowed)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                            env={"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "PATH": ""}, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("ok")
