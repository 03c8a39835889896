"""Ways to damage a file, shared by the fault suite (tests/*/test_damaged_files.py)."""

from __future__ import annotations

import random
from pathlib import Path

from app.core.storage.history import HistoryStore

SEED = 20261203


def random_bytes(size: int) -> bytes:
    return random.Random(SEED).randbytes(size)


def truncated(data: bytes, keep: int) -> bytes:
    return data[:keep]


def flipped(data: bytes, offset: int, count: int = 4) -> bytes:
    """The same size, `count` bytes inverted from `offset`: what a bad disk sector or a stray write leaves."""
    damaged = bytearray(data)
    for index in range(offset, min(offset + count, len(data))):
        damaged[index] ^= 0xFF
    return bytes(damaged)


# settings.json as people (and disks) damage it: (case id, file bytes, what the error must name)
SETTINGS_FAULTS: list[tuple[str, bytes, str]] = [
    (
        "opt-in as the string false",
        b'{"trust_remote_code": "false"}',
        'trust_remote_code must be true or false (got "false")',
    ),
    ("opt-in as a number", b'{"allow_pickle": 1}', "allow_pickle must be true or false (got 1), so it stays off"),
    ("model as a number", b'{"model": 5}', "model must be text or null (got 5)"),
    (
        "context length as text",
        b'{"context_length": "abc"}',
        'context_length must be a whole number or null (got "abc")',
    ),
    (
        "infinite temperature",
        b'{"sampling": {"temperature": Infinity}}',
        "sampling.temperature must be a finite number",
    ),
    ("sampling not an object", b'{"sampling": "hot"}', 'sampling must be a JSON object (got "hot")'),
    ("binary bytes", bytes(range(256)), "is not UTF-8 text (byte 0x80 at offset 128)"),
    ("random bytes", random_bytes(300), "settings.json"),
    ("cut short", b'{"model": "x", "trust_remote_code": tr', "is not valid JSON"),
    ("not an object", b"[true]", "does not hold a JSON object (found list)"),
]


def history_with_conversations(path: Path, conversations: int = 30) -> bytes:
    """A real history file with enough messages to span many pages; returns its bytes."""
    store = HistoryStore(path)
    for number in range(conversations):
        conversation = store.create_conversation(f"Conversation {number}")
        parent = None
        for turn in range(6):
            role = "user" if turn % 2 == 0 else "assistant"
            text = f"message {turn} of conversation {number}. " * 40
            parent = store.add_message(
                conversation.id,
                role,
                text,
                parent.id if parent else None,
                finish_reason="stop" if role == "assistant" else None,
            )
    store.close()
    return path.read_bytes()
