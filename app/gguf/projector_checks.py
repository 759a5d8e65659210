"""What is known of each vision projector file: loaded in a test process without harm,
or refused because loading it ends llama.cpp's process.

A projector's header can pass every check in ``app.gguf.projector`` and still trip
an assert in libmtmd (``app/engine/native/projector_guard.py`` loads each new one in a
child process first). The verdict is kept in ``projector_checks.json`` in the data
folder, keyed by the llama-cpp-python version and the projector's fingerprint (the
sha256 of its header and its size: what libmtmd's asserts read), so a file is
checked once per llama.cpp version, wherever it lies and whatever it is named:

    {"version": 1, "projectors": {"0.3.36/<fingerprint>": {"ok": false,
        "reason": "...", "source": "probe", "name": "mmproj-x.gguf", "when": 1764...}}}

``source`` is ``probe`` (the child load) or ``crash`` (Lamplight closed while
loading it; the crash notice records that). The engine refuses a projector with a
refusal here, and pairing passes it over. The file is untrusted like every data
file: bounded, checked entry by entry; a damaged one is set aside.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.gguf.header import shown
from app.gguf.projector import ProjectorInfo
from app.util.atomic import atomic_write_text
from app.util.datafiles import DataFileError, read_json, reason, set_aside_note

log = logging.getLogger(__name__)

FILE_NAME = "projector_checks.json"
MAX_BYTES = 512 * 1024
MAX_ENTRIES = 256  # the oldest go first
MAX_REASON = 500
MAX_NAME = 255
SOURCES = ("probe", "crash")


@functools.cache
def llama_version() -> str:
    """llama-cpp-python's version (a new one is checked again), without importing it."""
    import importlib.metadata

    try:
        return importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True)
class ProjectorVerdict:
    """What is known of one projector file with this llama.cpp."""

    ok: bool
    reason: str  # why it is refused (a sentence), or how the check went
    source: str  # one of SOURCES
    name: str  # the file's name when it was checked
    when: float

    def refusal(self, name: str) -> str:
        """The sentence the user reads when a refused projector ``name`` is not loaded."""
        return (
            f"{shown(name)} cannot be used: {self.reason}. It is not loaded again with this "
            "version of llama.cpp; use the mmproj file published with the model."
        )


class ProjectorChecks:
    """The verdicts in ``file``; any thread (every write re-reads the file)."""

    def __init__(self, file: Path) -> None:
        self.file = file
        self._lock = threading.Lock()
        self.notes: list[str] = []  # what was wrong with the file, for the user

    @staticmethod
    def key(info: ProjectorInfo) -> str:
        return f"{llama_version()}/{info.fingerprint}"

    def get(self, info: ProjectorInfo) -> ProjectorVerdict | None:
        """The verdict on ``info``'s file, or None: not checked yet."""
        if not info.fingerprint:
            return None
        with self._lock:
            entry = self._read().get(self.key(info))
        return None if entry is None else ProjectorVerdict(**entry)

    def refused(self, info: ProjectorInfo) -> str:
        """Why ``info`` must not be loaded ('' when nothing is known against it)."""
        verdict = self.get(info)
        return verdict.refusal(info.name) if verdict is not None and not verdict.ok else ""

    def record(self, info: ProjectorInfo, ok: bool, why: str, source: str) -> None:
        """Remember that ``info``'s file loads (``ok``) or is refused, and why.

        Raises:
            OSError: the file cannot be written.
        """
        if source not in SOURCES:
            raise ValueError(f"unknown source {source!r}")
        if not info.fingerprint:
            raise ValueError("a projector without a fingerprint")
        entry = {
            "ok": ok,
            "reason": why[:MAX_REASON],
            "source": source,
            "name": info.name[:MAX_NAME],
            "when": time.time(),
        }
        with self._lock:
            entries = self._read()
            entries.pop(self.key(info), None)
            entries[self.key(info)] = entry  # the newest last: trimmed last
            kept = dict(list(entries.items())[-MAX_ENTRIES:])
            atomic_write_text(self.file, json.dumps({"version": 1, "projectors": kept}, indent=1))
        log.info("projector %s: ok=%s (%s) %s", info.name, ok, source, why)

    def _read(self) -> dict[str, dict[str, Any]]:
        try:
            data = read_json(self.file, MAX_BYTES, 4)
        except FileNotFoundError:
            return {}
        except DataFileError as exc:
            if exc.damaged:
                self.notes.append(
                    set_aside_note(self.file, reason(exc), "projectors are checked again")
                )
            else:
                log.warning("%s: %s", self.file.name, reason(exc))
            return {}
        entries = data.get("projectors") if isinstance(data, dict) else None
        if not isinstance(entries, dict):
            self.notes.append(
                set_aside_note(self.file, "has no projectors table", "projectors are checked again")
            )
            return {}
        return {
            k: v
            for k, v in list(entries.items())[-MAX_ENTRIES:]
            if isinstance(k, str) and len(k) <= 200 and _valid(v)
        }


def _valid(entry: object) -> bool:
    if not isinstance(entry, dict) or set(entry) != {"ok", "reason", "source", "name", "when"}:
        return False
    when = entry["when"]
    return (
        isinstance(entry["ok"], bool)
        and isinstance(entry["reason"], str)
        and len(entry["reason"]) <= MAX_REASON
        and entry["source"] in SOURCES
        and isinstance(entry["name"], str)
        and len(entry["name"]) <= MAX_NAME
        and isinstance(when, (int, float))
        and not isinstance(when, bool)
        and math.isfinite(when)
    )
