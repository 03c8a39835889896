"""The Hugging Face Hub token: kept only in the OS keyring (service "hearth"), never in settings, files or logs.

On a box without a keyring backend (headless Linux: keyring's `fail` backend) the token cannot be saved; the
caller may opt into keeping it in memory for this run only. Every token this module sees is registered with a
log-record redactor, so a token that reaches a log message or a traceback is written as `[redacted]`.
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass
from typing import Any, Literal

import keyring
import keyring.errors
from keyring.backend import KeyringBackend

from app.core.errors import HearthError

SERVICE = "hearth"
HUB_TOKEN_USERNAME = "huggingface-hub-token"
REDACTED = "[redacted]"
# Hub tokens look like hf_ followed by ~34 letters and digits; redact that shape even if never registered.
_HUB_TOKEN_SHAPE = re.compile(r"hf_[A-Za-z0-9]{16,}")

TokenLocation = Literal["keyring", "session"]


class KeyringUnavailableError(HearthError):
    """No OS keyring backend: a token can only be kept for this run."""


class SecretStoreError(HearthError):
    """The keyring exists but refused the operation (locked, denied)."""


class InvalidTokenFormatError(HearthError):
    pass


@dataclass(frozen=True)
class TokenStatus:
    location: TokenLocation | None  # where the current token lives; None = no token
    keyring_available: bool
    backend_name: str


_lock = threading.Lock()
_session_token: str | None = None
_known_secrets: set[str] = set()
_redaction_installed = False


# --- the keyring -------------------------------------------------------------------------------------------------


def _backend() -> KeyringBackend:
    return keyring.get_keyring()


def _is_usable(backend: KeyringBackend) -> bool:
    from keyring.backends import chainer, fail, null

    if isinstance(backend, fail.Keyring | null.Keyring):
        return False
    return not (isinstance(backend, chainer.ChainerBackend) and not backend.backends)


def keyring_available() -> bool:
    """Whether an OS keyring backend exists (asks keyring every time: the user may install one)."""
    try:
        return _is_usable(_backend())
    except Exception:  # a broken backend plugin must not break the settings dialog
        return False


def backend_name() -> str:
    try:
        backend = _backend()
    except Exception:
        return "none"
    return f"{type(backend).__module__}.{type(backend).__name__}"


def no_keyring_message() -> str:
    return (
        "No system keyring is available on this machine, so the Hub token cannot be saved "
        "(Hearth never writes tokens to files); it can be kept in memory for this run only."
    )


def save_hub_token(token: str, *, session_only: bool = False) -> TokenLocation:
    """Store the token in the keyring, or in memory for this run when `session_only` (the caller's opt-in)."""
    global _session_token
    token = token.strip()
    if not token or any(ch.isspace() for ch in token):
        raise InvalidTokenFormatError("A Hub token is one word without spaces (it usually starts with hf_).")
    register_secret(token)
    if session_only:
        with _lock:
            _session_token = token
        return "session"
    if not keyring_available():
        raise KeyringUnavailableError(no_keyring_message())
    try:
        keyring.set_password(SERVICE, HUB_TOKEN_USERNAME, token)
    except keyring.errors.KeyringError as exc:
        # The exception text is the backend's; it never holds the token, but stay terse anyway.
        raise SecretStoreError(
            f"The system keyring refused to store the token ({type(exc).__name__}); unlock it and try again."
        ) from None
    with _lock:
        _session_token = None
    return "keyring"


def hub_token() -> str | None:
    """The token to send to the Hub: this run's token if one was given, else the keyring's, else None."""
    with _lock:
        if _session_token is not None:
            return _session_token
    if not keyring_available():
        return None
    try:
        token = keyring.get_password(SERVICE, HUB_TOKEN_USERNAME)
    except keyring.errors.KeyringError:
        return None
    if token:
        register_secret(token)
    return token or None


def clear_hub_token() -> bool:
    """Forget the token everywhere Hearth keeps it; True if there was one."""
    global _session_token
    removed = False
    with _lock:
        if _session_token is not None:
            _session_token = None
            removed = True
    if keyring_available():
        try:
            if keyring.get_password(SERVICE, HUB_TOKEN_USERNAME) is not None:
                keyring.delete_password(SERVICE, HUB_TOKEN_USERNAME)
                removed = True
        except keyring.errors.PasswordDeleteError:
            pass
        except keyring.errors.KeyringError as exc:
            raise SecretStoreError(
                f"The system keyring refused to remove the token ({type(exc).__name__}); unlock it and try again."
            ) from None
    return removed


def token_status() -> TokenStatus:
    available = keyring_available()
    with _lock:
        in_session = _session_token is not None
    location: TokenLocation | None = "session" if in_session else None
    if location is None and available:
        try:
            if keyring.get_password(SERVICE, HUB_TOKEN_USERNAME):
                location = "keyring"
        except keyring.errors.KeyringError:
            pass
    return TokenStatus(location=location, keyring_available=available, backend_name=backend_name())


# --- keeping the token out of logs ---------------------------------------------------------------------------------


def redact(text: str) -> str:
    """`text` with every known token (and anything shaped like a Hub token) replaced by [redacted]."""
    with _lock:
        secrets = sorted(_known_secrets, key=len, reverse=True)
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return _HUB_TOKEN_SHAPE.sub(REDACTED, text)


def register_secret(secret: str) -> None:
    """Remember a secret so log records never show it; installs the redactor on first use."""
    if len(secret) < 8:  # redacting very short strings would mangle ordinary log text
        return
    with _lock:
        _known_secrets.add(secret)
    install_log_redaction()


def install_log_redaction() -> None:
    """Wrap the log-record factory once: every record, from any logger and to any handler, is redacted."""
    global _redaction_installed
    with _lock:
        if _redaction_installed:
            return
        _redaction_installed = True
    previous = logging.getLogRecordFactory()

    def redacting_factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        _redact_record(record)
        return record

    logging.setLogRecordFactory(redacting_factory)


def _redact_record(record: logging.LogRecord) -> None:
    try:
        message = record.getMessage()
    except Exception:  # a malformed record: leave it to logging's own error handling
        return
    cleaned = redact(message)
    if cleaned != message:
        record.msg, record.args = cleaned, None
    if record.exc_info and record.exc_info[1] is not None:
        formatted = logging.Formatter().formatException(record.exc_info)
        cleaned_exc = redact(formatted)
        if cleaned_exc != formatted:
            record.exc_text = cleaned_exc


class RedactingFilter(logging.Filter):
    """For handlers created before a token was known (the factory covers records created after)."""

    def filter(self, record: logging.LogRecord) -> bool:
        _redact_record(record)
        return True
