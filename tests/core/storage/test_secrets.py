"""The Hub token lives only in the keyring (or, by opt-in, in memory for one run) and never in logs."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import keyring
import pytest
from keyring.backends import fail

from app.core.storage import secrets
from app.core.storage.secrets import (
    InvalidTokenFormatError,
    KeyringUnavailableError,
    SecretStoreError,
)
from tests.helpers import memory_keyring

TOKEN = "hf_SecretForSecretsTests0123456789abcdef"


@pytest.fixture(autouse=True)
def no_session_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(secrets, "_session_token", None)


@pytest.fixture
def memory() -> Iterator[memory_keyring.MemoryKeyring]:
    with memory_keyring.installed(memory_keyring.MemoryKeyring()) as backend:
        yield backend  # type: ignore[misc]


@pytest.fixture
def no_keyring() -> Iterator[None]:
    with memory_keyring.installed(fail.Keyring()):
        yield


def test_save_read_and_clear_in_the_keyring(memory: memory_keyring.MemoryKeyring) -> None:
    assert secrets.hub_token() is None
    assert secrets.save_hub_token(f"  {TOKEN}\n") == "keyring"
    assert memory.store == {(secrets.SERVICE, secrets.HUB_TOKEN_USERNAME): TOKEN}
    assert secrets.SERVICE == "hearth"
    assert secrets.hub_token() == TOKEN
    status = secrets.token_status()
    assert status.location == "keyring" and status.keyring_available
    assert secrets.clear_hub_token() is True
    assert memory.store == {} and secrets.hub_token() is None
    assert secrets.clear_hub_token() is False
    assert secrets.token_status().location is None


def test_no_keyring_is_reported_and_session_only_is_an_opt_in(no_keyring: None) -> None:
    assert not secrets.keyring_available()
    with pytest.raises(KeyringUnavailableError, match=r"No system keyring is available .* for this run only"):
        secrets.save_hub_token(TOKEN)
    assert secrets.hub_token() is None
    assert secrets.save_hub_token(TOKEN, session_only=True) == "session"
    assert secrets.hub_token() == TOKEN
    status = secrets.token_status()
    assert status.location == "session" and not status.keyring_available
    assert secrets.clear_hub_token() is True and secrets.hub_token() is None


def test_a_locked_keyring_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with memory_keyring.installed(memory_keyring.LockedKeyring()):
        with pytest.raises(SecretStoreError, match="refused to store the token \\(KeyringLocked\\)"):
            secrets.save_hub_token(TOKEN)
        assert secrets.hub_token() is None


def test_tokens_with_spaces_are_refused(memory: memory_keyring.MemoryKeyring) -> None:
    with pytest.raises(InvalidTokenFormatError, match="one word without spaces"):
        secrets.save_hub_token("hf_abc def")
    with pytest.raises(InvalidTokenFormatError):
        secrets.save_hub_token("   ")
    assert memory.store == {}


def test_the_backend_keyring_chose_is_the_one_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """No set_keyring: keyring's own discovery (here via PYTHON_KEYRING_BACKEND) picks the backend we use."""
    previous = keyring.get_keyring()
    monkeypatch.setenv("PYTHON_KEYRING_BACKEND", "tests.helpers.memory_keyring.MemoryKeyring")
    try:
        keyring.core.init_backend()
        chosen = keyring.get_keyring()
        assert isinstance(chosen, memory_keyring.MemoryKeyring)
        secrets.save_hub_token(TOKEN)
        assert chosen.calls[-1] == "set hearth"
        assert secrets.hub_token() == TOKEN
    finally:
        keyring.set_keyring(previous)


def test_this_machines_real_backend_is_detected() -> None:
    """On a headless box keyring falls back to `fail`; on a desktop it finds the real one. Either way we agree."""
    backend = keyring.get_keyring()
    expected = not isinstance(backend, fail.Keyring)
    assert secrets.keyring_available() is expected
    assert secrets.backend_name().endswith(type(backend).__name__)


def test_log_records_never_show_a_token(caplog: pytest.LogCaptureFixture, memory: memory_keyring.MemoryKeyring) -> None:
    secrets.save_hub_token(TOKEN)
    log = logging.getLogger("hearth.test.secrets")
    with caplog.at_level(logging.INFO):
        log.info("sending Authorization: Bearer %s", TOKEN)
        log.info(f"an f-string with {TOKEN} in it")
        try:
            raise RuntimeError(f"server said no to {TOKEN}")
        except RuntimeError:
            log.exception("request failed")
    assert TOKEN not in caplog.text
    assert caplog.text.count(secrets.REDACTED) >= 3


def test_unregistered_hub_shaped_tokens_are_redacted_too() -> None:
    assert secrets.redact("token hf_abcdefghijklmnopqrstuvwxyz012345 here") == f"token {secrets.REDACTED} here"
    assert secrets.redact("an ordinary hf_model name") == "an ordinary hf_model name"


def test_redacting_filter_for_existing_handlers(memory: memory_keyring.MemoryKeyring) -> None:
    secrets.save_hub_token(TOKEN)
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "token=%s", (TOKEN,), None)
    assert secrets.RedactingFilter().filter(record)
    assert record.getMessage() == f"token={secrets.REDACTED}"
