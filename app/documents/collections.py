"""Named sets of documents ("Tax 2025", "Project notes") the user can attach to a chat at once.

Kept in ``<data>/collections.json`` as ``{"version": 1, "collections": {name: [paths]}}``,
written atomically. The file is read defensively (at most 1 MB, 200 collections, 5000
paths each, strings only); what is wrong in it is left out, and a file that cannot be
used at all is set aside as ``collections.json.bad`` with a note, so the next save does
not overwrite what the user may want back.
"""

from __future__ import annotations

import json
import logging
import threading
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app.util.atomic import atomic_write_text
from app.util.datafiles import DataFileError, read_json, reason, set_aside_note
from app.util.errors import DocumentError

log = logging.getLogger(__name__)

VERSION = 1
MAX_BYTES = 1_000_000
MAX_COLLECTIONS = 200
MAX_PATHS = 5_000
MAX_NAME = 80
MAX_PATH_CHARS = 4_096


def name_problem(name: str) -> str:
    """Why ``name`` cannot name a collection ("" when it can)."""
    if not name.strip():
        return "A collection needs a name."
    if len(name) > MAX_NAME:
        return f"A collection's name can be at most {MAX_NAME} characters long."
    if any(unicodedata.category(c) in ("Cc", "Cs") for c in name):
        return "A collection's name cannot hold control characters; type it again."
    return ""


class Collections:
    """The collections file of one data folder. Thread-safe."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self.notes: list[str] = []
        self._data: dict[str, list[str]] = self._load()

    def take_notes(self) -> list[str]:
        with self._lock:
            notes, self.notes = self.notes, []
            return notes

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._data, key=str.casefold)

    def paths(self, name: str) -> list[str]:
        with self._lock:
            return list(self._data.get(name, ()))

    def save(self, name: str, paths: Sequence[str]) -> None:
        """Make (or replace) collection ``name`` with ``paths`` (duplicates dropped).

        Raises:
            DocumentError: a bad name, too many paths or collections, or it cannot be written.
        """
        _check_name(name)
        kept = list(dict.fromkeys(p for p in paths if _good_path(p)))
        if len(kept) > MAX_PATHS:
            raise DocumentError(f"A collection can hold at most {MAX_PATHS} documents.")
        with self._lock:
            if name not in self._data and len(self._data) >= MAX_COLLECTIONS:
                raise DocumentError(
                    f"There can be at most {MAX_COLLECTIONS} collections; delete one first."
                )
            data = {**self._data, name: kept}
            self._write(data)

    def delete(self, name: str) -> None:
        with self._lock:
            if name in self._data:
                self._write({k: v for k, v in self._data.items() if k != name})

    def rename(self, old: str, new: str) -> None:
        """Raises:
        DocumentError: no collection ``old``, ``new`` is taken or not a good name."""
        _check_name(new)
        with self._lock:
            if old not in self._data:
                raise DocumentError(f"There is no collection named {old!r}.")
            if new == old:
                return
            if new in self._data:
                raise DocumentError(
                    f"There already is a collection named {new!r}; choose another name."
                )
            data = {(new if k == old else k): v for k, v in self._data.items()}
            self._write(data)

    def _write(self, data: dict[str, list[str]]) -> None:
        text = json.dumps({"version": VERSION, "collections": data}, ensure_ascii=False, indent=1)
        try:
            atomic_write_text(self.path, text + "\n")
        except OSError as exc:
            raise DocumentError(
                f"The collections could not be saved ({exc.strerror or exc}). "
                "Check that the data folder is writable."
            ) from exc
        self._data = data

    def _load(self) -> dict[str, list[str]]:
        try:
            raw = read_json(self.path, MAX_BYTES, max_depth=4)
        except FileNotFoundError:
            return {}
        except DataFileError as exc:
            if exc.damaged:
                self._aside(reason(exc))
            else:
                self.notes.append(f"{self.path.name} {reason(exc)}; no collections are shown.")
            return {}
        data = _parse(raw)
        if data is None:
            self._aside("is not a collections file")
            return {}
        return data

    def _aside(self, why: str) -> None:
        note = set_aside_note(self.path, why, "the collections start empty")
        log.warning("%s", note)
        self.notes.append(note)


def _parse(raw: Any) -> dict[str, list[str]] | None:
    """The collections in ``raw`` (bad entries left out); None when it is not such a file."""
    if not isinstance(raw, dict) or raw.get("version") != VERSION:
        return None
    found = raw.get("collections")
    if not isinstance(found, dict):
        return None
    data: dict[str, list[str]] = {}
    for name, paths in found.items():
        if len(data) >= MAX_COLLECTIONS:
            break
        if not isinstance(name, str) or name_problem(name) or not isinstance(paths, list):
            continue
        good = (p for p in paths if isinstance(p, str) and _good_path(p))
        data[name] = list(dict.fromkeys(good))[:MAX_PATHS]
    return data


def _good_path(path: str) -> bool:
    return 0 < len(path) <= MAX_PATH_CHARS and "\x00" not in path


def _check_name(name: str) -> None:
    problem = name_problem(name)
    if problem:
        raise DocumentError(problem)
