"""API keys of server connections, kept in the OS keyring and never in a file.

Keys are stored with the ``keyring`` package under the service ``"Lamplight"``
and the connection's id as the user name (macOS Keychain, Windows Credential
Locker, the Secret Service on Linux desktops). Where no keyring is usable (a
headless Linux without a Secret Service, a locked or broken one) a key is kept
in memory for this session only and ``keyring_problem()`` says so in a sentence
for the user; nothing ever falls back to writing the key to disk.

Keyring backends are third-party code that talks to other processes (D-Bus,
the Keychain) and raise what they like, so every call is guarded: a keyring
failure costs the user a retyped key, never the app.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from app.util.errors import LamplightError

log = logging.getLogger(__name__)

SERVICE = "Lamplight"
MAX_KEY_CHARS = 8192  # far above any real API key or JWT; an HTTP header must stay sane
NO_KEYRING = "No system keyring is available, so the API key is kept only until Lamplight quits."
_NO_KEYRING_REASON = "no system keyring is available"

_lock = threading.Lock()
_memory: dict[str, str] = {}  # keys the keyring could not take (this session only)
_failed: list[Any] = []  # the keyring backend that failed, while it is the active one
_reason: list[str] = []


class BadApiKey(LamplightError):
    """An API key that cannot be used (control characters, far too long)."""


def check_key(key: str) -> str:
    """``key`` without surrounding whitespace, if it can travel in an HTTP header.

    Raises:
        BadApiKey: it has line breaks or other control characters, or is too long.
    """
    key = key.strip()
    if len(key) > MAX_KEY_CHARS:
        raise BadApiKey(f"The API key is longer than {MAX_KEY_CHARS} characters.")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in key):
        raise BadApiKey("The API key has a line break or another control character in it.")
    if not key.isascii():
        raise BadApiKey("The API key has characters other than ASCII letters, digits and signs.")
    return key


def get_key(conn_id: str) -> str:
    """The API key of connection ``conn_id`` ("" when there is none or it cannot be read)."""
    with _lock:
        if conn_id in _memory:
            return _memory[conn_id]
    backend = _backend()
    if backend is None:
        return ""
    try:
        value = backend.get_password(SERVICE, conn_id)
    except Exception as exc:  # any backend error: see the module docstring
        _note_failure(backend, exc)
        return ""
    return value if isinstance(value, str) else ""


def set_key(conn_id: str, key: str) -> None:
    """Store ``key`` for ``conn_id`` (an empty key deletes it).

    Falls back to memory for this session when the keyring refuses it
    (``keyring_problem()`` then says so).
    """
    if not key:
        delete_key(conn_id)
        return
    backend = _backend()
    if backend is not None:
        try:
            backend.set_password(SERVICE, conn_id, key)
        except Exception as exc:  # any backend error: see the module docstring
            _note_failure(backend, exc)
        else:
            with _lock:
                _memory.pop(conn_id, None)
            return
    with _lock:
        _memory[conn_id] = key


def delete_key(conn_id: str) -> None:
    """Forget the key of ``conn_id`` (nothing happens when there is none)."""
    with _lock:
        _memory.pop(conn_id, None)
    backend = _backend()
    if backend is None:
        return
    import keyring.errors

    try:
        backend.delete_password(SERVICE, conn_id)
    except keyring.errors.PasswordDeleteError:
        pass  # there was none
    except Exception as exc:  # any backend error: see the module docstring
        _note_failure(backend, exc)


def keyring_reason() -> str:
    """Why the keyring cannot keep secrets, as a clause for any caller to word its own
    consequence around (an ``mcp.json`` secret stays in the file); "" when it can."""
    backend = _active()
    if backend is None or _is_fail(backend):
        return _NO_KEYRING_REASON
    with _lock:
        if _failed and _failed[0] is backend:
            why = f" ({_reason[0]})" if _reason and _reason[0] else ""
            return f"the system keyring failed{why}"
    return ""


def keyring_problem() -> str:
    """A sentence for the user when API keys cannot be kept between runs; "" when they
    can."""
    reason = keyring_reason()
    if not reason or reason == _NO_KEYRING_REASON:
        return NO_KEYRING if reason else ""
    return f"{reason[0].upper()}{reason[1:]}, so the API key is kept only until Lamplight quits."


def _active() -> Any:
    try:
        import keyring

        return keyring.get_keyring()
    except Exception:  # a broken backend plug-in can fail while the keyring is chosen
        log.warning("no keyring backend could be chosen", exc_info=True)
        return None


def _backend() -> Any:
    """The keyring backend to use, or None when only memory is left."""
    backend = _active()
    if backend is None or _is_fail(backend):
        return None
    return backend


def _is_fail(backend: Any) -> bool:
    from keyring.backends import fail

    return isinstance(backend, fail.Keyring)


def _note_failure(backend: Any, exc: BaseException) -> None:
    log.warning("the keyring (%s) failed: %s", type(backend).__name__, exc)
    with _lock:
        _failed[:] = [backend]
        _reason[:] = [str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__]
