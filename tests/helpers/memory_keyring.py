"""An in-memory keyring backend for tests (the real one on a desktop, `fail` on a headless box)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import keyring
import keyring.errors
from keyring.backend import KeyringBackend


class MemoryKeyring(KeyringBackend):
    priority = 1  # type: ignore[assignment]

    def __init__(self) -> None:
        super().__init__()
        self.store: dict[tuple[str, str], str] = {}
        self.calls: list[str] = []

    def get_password(self, service: str, username: str) -> str | None:
        self.calls.append(f"get {service}")
        return self.store.get((service, username))

    def set_password(self, service: str, username: str, password: str) -> None:
        self.calls.append(f"set {service}")
        self.store[(service, username)] = password

    def delete_password(self, service: str, username: str) -> None:
        self.calls.append(f"delete {service}")
        if (service, username) not in self.store:
            raise keyring.errors.PasswordDeleteError("not found")
        del self.store[(service, username)]


class LockedKeyring(MemoryKeyring):
    """A backend that exists but refuses (a locked login keyring)."""

    def set_password(self, service: str, username: str, password: str) -> None:
        raise keyring.errors.KeyringLocked("the keyring is locked")


@contextmanager
def installed(backend: KeyringBackend) -> Iterator[KeyringBackend]:
    previous = keyring.get_keyring()
    keyring.set_keyring(backend)
    try:
        yield backend
    finally:
        keyring.set_keyring(previous)
