"""Reading data files that may be damaged or hostile: bounded size, depth and kind.

Every JSON file Lamplight reads back (settings, presets, transcripts, snapshot
headers, imports) goes through here:

- the path must name a regular file: it is checked with ``stat`` before it is
  opened (a device or a pipe is never opened: that can block, or act), opened
  non-blocking and checked again with ``fstat``; so a FIFO, a device or a
  directory in its place is refused at once instead of blocking or reading forever;
- at most ``max_bytes`` are read;
- the text must be UTF-8 (a UTF-8 byte order mark is skipped; UTF-16 is refused
  with a hint);
- the standard library parses it; nesting deeper than ``max_depth`` is refused
  (the parser's own ``RecursionError`` too), so nothing later recurses without
  bound;
- strings (keys too) with lone surrogates, which JSON's ``\\ud800`` escapes
  can make but UTF-8 cannot encode, get U+FFFD in their place: the text around
  them survives, and saving, exporting and tokenizing never meet them.

NaN and Infinity constants parse as floats: the typed checks of each field
decide (a file Lamplight wrote itself is never refused for them).
"""

from __future__ import annotations

import codecs
import contextlib
import json
import os
import re
import shutil
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.util.errors import LamplightError

DEFAULT_DEPTH = 16
_SURROGATE = re.compile("[\ud800-\udfff]")
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a device"),
    (stat.S_ISSOCK, "a socket"),
)


class DataFileError(LamplightError):
    """A data file that cannot be used; the message says why in one line.

    ``damaged`` is True when the file's content or kind is wrong (so setting it
    aside loses nothing usable); False when it could not be read (permissions,
    an I/O error) or is larger than the limit: it may be fine, only not for us now.
    """

    def __init__(self, message: str, damaged: bool = True) -> None:
        super().__init__(message)
        self.damaged = damaged


def reason(exc: DataFileError) -> str:
    """The message without its leading "is " ("not valid JSON: ..."), to put after a name."""
    text = str(exc)
    return text[3:] if text.startswith("is ") else text


def os_reason(exc: BaseException) -> str:
    """A short reason for an ``OSError`` (or ``ValueError`` for a NUL in a path)."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__


def kind_of(mode: int) -> str:
    """What a non-regular file is, for messages ("a directory", "a named pipe", ...)."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def open_regular(path: Path) -> tuple[int, int]:
    """Open ``path`` for reading without blocking; returns (fd, size).

    Raises:
        FileNotFoundError: there is no such file.
        DataFileError: it is not a regular file (damaged), or cannot be opened.
    """
    flags = (
        os.O_RDONLY
        | getattr(os, "O_NONBLOCK", 0)
        | getattr(os, "O_NOCTTY", 0)
        | getattr(os, "O_BINARY", 0)
    )
    try:
        # Never open what is not a regular file: opening a device can act (a watchdog, a
        # tape), opening a pipe can wait. fstat below catches a swap in between.
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            raise DataFileError(f"is {kind_of(mode)}, not a file")
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except IsADirectoryError as exc:  # Windows cannot open a directory at all
        raise DataFileError("is a directory, not a file") from exc
    except (OSError, ValueError) as exc:
        raise DataFileError(f"could not be read: {os_reason(exc)}", damaged=False) from exc
    try:
        st = os.fstat(fd)
    except OSError as exc:
        os.close(fd)
        raise DataFileError(f"could not be read: {os_reason(exc)}", damaged=False) from exc
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise DataFileError(f"is {kind_of(st.st_mode)}, not a file")
    return fd, st.st_size


def read_limited(path: Path, max_bytes: int) -> bytes:
    """The bytes of regular file ``path``, at most ``max_bytes`` of them.

    Raises:
        FileNotFoundError: there is no such file.
        DataFileError: not a regular file, unreadable, or larger than ``max_bytes``.
    """
    fd, size = open_regular(path)
    with os.fdopen(fd, "rb") as fh:
        if size > max_bytes:
            raise DataFileError(_too_large(size, max_bytes), damaged=False)
        try:
            data = fh.read(max_bytes + 1)
        except OSError as exc:
            raise DataFileError(f"could not be read: {os_reason(exc)}", damaged=False) from exc
    if len(data) > max_bytes:  # it grew while we read
        raise DataFileError(_too_large(len(data), max_bytes), damaged=False)
    return data


def decode_text(raw: bytes) -> str:
    """UTF-8 text (a leading byte order mark dropped).

    Raises:
        DataFileError: the bytes are not UTF-8.
    """
    if raw.startswith(codecs.BOM_UTF8):
        raw = raw[len(codecs.BOM_UTF8) :]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        utf16 = raw[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)
        hint = ", it looks like UTF-16" if utf16 else f" at byte {exc.start}"
        raise DataFileError(f"is not UTF-8 text{hint}") from exc


def parse_json(text: str | bytes, max_depth: int = DEFAULT_DEPTH) -> Any:
    """Parse JSON with the limits above; lone surrogates become U+FFFD.

    Raises:
        DataFileError: not UTF-8, not JSON, or nested deeper than ``max_depth``.
    """
    if isinstance(text, bytes):
        text = decode_text(text)
    elif text.startswith("\ufeff"):
        text = text[1:]
    try:
        data = json.loads(text)
    except RecursionError as exc:
        raise DataFileError("is nested too deeply") from exc
    except ValueError as exc:
        raise DataFileError(f"is not valid JSON: {str(exc)[:200]}") from exc
    return _clean(data, 0, max_depth)


def read_json(path: Path, max_bytes: int, max_depth: int = DEFAULT_DEPTH) -> Any:
    """``parse_json`` of ``read_limited(path, max_bytes)``.

    Raises:
        FileNotFoundError: there is no such file.
        DataFileError: see ``read_limited`` and ``parse_json``.
    """
    return parse_json(read_limited(path, max_bytes), max_depth)


def clean_text(value: str) -> str:
    """``value`` with every lone surrogate replaced by U+FFFD."""
    if value.isascii():
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", value)
    return value


def set_aside(path: Path, copy: bool = False) -> Path:
    """Move ``path`` (or, with ``copy``, a copy of it) to ``<name>.bad``; returns where.

    An existing ``.bad`` file is never overwritten: the next free
    ``<name>.2.bad``, ``<name>.3.bad``... is used.

    Raises:
        OSError: the file could not be moved (or copied).
    """
    target = _free_bad_name(path)
    if copy:
        shutil.copyfile(path, target)  # refuses a FIFO or a device (SpecialFileError)
    else:
        os.replace(path, target)
    return target


def repair_on_disk(path: Path, repairs: list[str], write: Callable[[], None]) -> list[str]:
    """Keep the original of a file read with ``repairs`` as ``.bad`` and ``write`` the
    repaired content in its place; returns one note per repair, then what happened."""
    notes = [f"{path.name}: {r}" for r in repairs]
    try:
        aside = set_aside(path, copy=True)
        write()
        notes.append(f"{path.name} was repaired; the original is kept as {aside.name}.")
    except OSError as exc:
        notes.append(f"{path.name} could not be repaired on disk ({os_reason(exc)}).")
    return notes


def set_aside_note(path: Path, reason: str, then: str) -> str:
    """Set ``path`` aside as ``.bad`` and say so in one line ("<name> <reason>; ...")."""
    try:
        aside = set_aside(path)
        where = f"it was set aside as {aside.name}"
    except OSError as exc:
        where = f"it could not be set aside ({os_reason(exc)})"
    return f"{path.name} {reason}; {where}, and {then}."


def ensure_directory(path: Path) -> str:
    """Make ``path`` a directory; something else in its place is set aside first.

    Returns a one-line note when something was set aside ('' otherwise).

    Raises:
        OSError: the directory cannot be made.
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
        return ""
    except FileExistsError:
        pass  # a file (or a link to one) where the directory belongs
    aside = set_aside(path)
    path.mkdir(parents=True, exist_ok=True)
    return f"{path.name} was not a folder; it was set aside as {aside.name}"


def _free_bad_name(path: Path) -> Path:
    candidates = [path.with_name(f"{path.name}.bad")]
    candidates += [path.with_name(f"{path.name}.{n}.bad") for n in range(2, 100)]
    for candidate in candidates:
        with contextlib.suppress(OSError):
            if not os.path.lexists(candidate):
                return candidate
    return path.with_name(f"{path.name}.{time.time_ns()}.bad")


def _too_large(size: int, limit: int) -> str:
    return f"is too large: {size / 1e6:.1f} MB, the limit is {limit / 1e6:.0f} MB"


def _clean(value: Any, depth: int, max_depth: int) -> Any:
    """``value`` with lone surrogates replaced; DataFileError past ``max_depth`` levels."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, list):
        if depth >= max_depth:
            raise DataFileError("is nested too deeply")
        return [_clean(v, depth + 1, max_depth) for v in value]
    if isinstance(value, dict):
        if depth >= max_depth:
            raise DataFileError("is nested too deeply")
        return {clean_text(k): _clean(v, depth + 1, max_depth) for k, v in value.items()}
    return value
