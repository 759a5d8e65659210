"""What the stores of ``app.chat`` share about their files: a file's stamp (what
identifies one written version, so a row read from it is read again only when it
changed) and setting a damaged file aside with a note for the user."""

from __future__ import annotations

from pathlib import Path

from app.util.datafiles import os_reason, set_aside

MISSING = (-1, -1)  # the stamp of a file that cannot be read


def file_stamp(path: Path) -> tuple[int, int]:
    """What identifies one written version of a file: its size and time (``MISSING``
    when it cannot be read)."""
    try:
        st = path.stat()
    except OSError:
        return MISSING
    return (st.st_size, st.st_mtime_ns)


def mtime(path: Path) -> float:
    """The file's modification time (0 when it cannot be read)."""
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def set_aside_noted(path: Path, error: str, notes: list[str]) -> bool:
    """Move damaged ``path`` to ``.bad`` and add a line on it (``error``, then where it
    went) to ``notes``; False when it could not be moved (the line says why)."""
    try:
        aside = set_aside(path)
    except OSError as exc:
        notes.append(f"{error}; it could not be set aside ({os_reason(exc)}).")
        return False
    notes.append(f"{error}; it was set aside as {aside.name}.")
    return True
