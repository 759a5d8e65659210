"""A project's pinned documents (issue 44): read whole, and read again when the file
changed.

A pinned entry is a ``Source.to_dict()`` copy of the whole text with the file's
``stamp`` [size, mtime_ns] and ``sha256`` when it was read. Before a new chat in the
project starts, ``stale`` compares each stamp with the file (a ``stat`` each, no read);
a changed file is read again off the GUI thread (``read_pinned_file``) and its entry
replaced (``refreshed``), so the new chat, and the project's opening, hold what the file
says now. A file that is gone is not an error: the project keeps the copy it read.
Chats already made keep the text they started with, as they keep the instructions.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app.chat.projects import Project
from app.documents.sources import MAX_SOURCE_CHARS, Source
from app.util.errors import DocumentError


def read_pinned_file(path: Path) -> dict[str, Any]:
    """``path`` read whole into a pinned entry (``Project.pinned``); runs off the GUI thread.

    Raises:
        DocumentError: it cannot be read, or holds no text.
        OSError: it is not there (any more).
    """
    from app.documents.library import whole_text  # the readers load only when used
    from app.documents.parse_child import parse_bounded
    from app.util.hashing import sha256_file

    path = path.absolute()
    before = os.stat(path)
    text = whole_text(parse_bounded(path))
    if not text.strip():
        raise DocumentError(f"{path.name} has no text to read.")
    text = text[:MAX_SOURCE_CHARS]
    lines = text.count("\n") + 1
    source = Source(1, str(path), path.name, text, None, 1, lines, -1, True)
    after = os.stat(path)
    settled = (before.st_size, before.st_mtime_ns) == (after.st_size, after.st_mtime_ns)
    return {
        **source.to_dict(),
        "stamp": [after.st_size, after.st_mtime_ns],
        "sha256": sha256_file(path) if settled else "",
    }


def stale(project: Project) -> tuple[list[Path], list[Path]]:
    """The pinned files that changed since they were read, and those that are gone."""
    changed: list[Path] = []
    gone: list[Path] = []
    for entry in project.pinned:
        path = Path(str(entry.get("path", "")))
        try:
            st = os.stat(path)
        except OSError:
            gone.append(path)
            continue
        if entry.get("stamp") != [st.st_size, st.st_mtime_ns]:
            changed.append(path)
    return changed, gone


def refreshed(project: Project, entries: Sequence[dict[str, Any]]) -> bool:
    """Put ``entries`` (read again) in place of the pinned entries of their paths, keeping
    their order and numbers; whether any text changed (else only stamps did)."""
    by_path = {str(e["path"]): e for e in entries}
    text_changed = False
    pinned: list[dict[str, Any]] = []
    for entry in project.pinned:
        new = by_path.get(str(entry.get("path", "")))
        if new is None:
            pinned.append(entry)
            continue
        text_changed = text_changed or new.get("text") != entry.get("text")
        pinned.append({**new, "n": entry.get("n", len(pinned) + 1)})
    project.pinned = pinned
    return text_changed
