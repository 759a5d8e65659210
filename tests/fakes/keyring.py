"""Keyrings for the tests: one in a dict (``MemoryKeyring``), one that refuses to store
(``LockedKeyring``), and ``use_keyring`` to put one in place for a block."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import keyring
import keyring.errors
import pytest
from keyring.backend import KeyringBackend

from app.remote import keys


class MemoryKeyring(KeyringBackend):
    """A keyring in a dict, for tests."""

    priority = 1

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # keyring leaves it untyped
        self.values: dict[tuple[str, str], str] = {}

    def get_password(self, service: str, username: str) -> str | None:
        return self.values.get((service, username))

    def set_password(self, service: str, username: str, password: str) -> None:
        self.values[(service, username)] = password

    def delete_password(self, service: str, username: str) -> None:
        if self.values.pop((service, username), None) is None:
            raise keyring.errors.PasswordDeleteError("no such password")


class LockedKeyring(MemoryKeyring):
    """A keyring that is there but refuses to store (a locked Secret Service)."""

    def set_password(self, service: str, username: str, password: str) -> None:
        raise keyring.errors.KeyringLocked("the collection is locked")


@contextlib.contextmanager
def use_keyring(backend: KeyringBackend, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``backend`` as the keyring (no session keys, no failures noted yet) for the block;
    the previous one after."""
    before = keyring.get_keyring()
    monkeypatch.setattr(keys, "_memory", {})
    monkeypatch.setattr(keys, "_failed", [])
    keyring.set_keyring(backend)
    try:
        yield
    finally:
        keyring.set_keyring(before)
