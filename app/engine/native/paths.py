"""Native code paths that can crash the process on some CPUs, and what is known of each here.

Some llama.cpp code paths are fine on most machines and kill the process on a
few: the AMX kernels behind the extra (repacked) weight buffer types segfault on
some Sapphire Rapids CPUs (llama.cpp issue 20824), and flash attention and GPU
offload depend on kernels and drivers. A verdict about a path holds for one
llama.cpp build on one CPU (``native_libs.machine_key``), so the store keeps
verdicts per key, in ``native_paths.json`` in the data folder:

    {"version": 1, "machines": {"<key>": {"extra_bufts": {"ok": false,
        "reason": "...", "source": "probe", "when": 1764000000.0}, ...}}}

``source`` is ``probe`` (the start-up check in a child process,
``app/engine/native/path_probe.py``), ``crash`` (the user turned a path off after a
crash in it) or ``user`` (Help -> Hardware). The file is untrusted like every
data file: bounded, checked, a damaged one is set aside and the paths are probed
again.
"""

from __future__ import annotations

import enum
import json
import logging
import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.util.atomic import atomic_write_text
from app.util.datafiles import DataFileError, read_json, reason, set_aside_note

log = logging.getLogger(__name__)

FILE_NAME = "native_paths.json"
MAX_BYTES = 256 * 1024
MAX_MACHINES = 32  # the oldest keys go: each llama.cpp upgrade adds one
MAX_REASON = 500
SOURCES = ("probe", "crash", "user")


class RiskyPath(str, enum.Enum):
    """A native path that is switched off for a machine when it crashes there."""

    EXTRA_BUFTS = "extra_bufts"
    FLASH_ATTN = "flash_attn"
    GPU_OFFLOAD = "gpu_offload"

    @property
    def label(self) -> str:
        return _LABELS[self]

    @property
    def cost(self) -> str:
        """What the user loses while the path is off, in one line."""
        return _COSTS[self]


_LABELS = {
    RiskyPath.EXTRA_BUFTS: "Repacked weights (AMX and other fast CPU kernels)",
    RiskyPath.FLASH_ATTN: "Flash attention",
    RiskyPath.GPU_OFFLOAD: "GPU offload",
}
_COSTS = {
    RiskyPath.EXTRA_BUFTS: "prompts are read more slowly (the CPU's fastest matrix "
    "kernels are not used); replies are about as fast",
    RiskyPath.FLASH_ATTN: "flash attention and the q8_0 KV cache (which needs it) "
    "are not available",
    RiskyPath.GPU_OFFLOAD: "models run on the CPU only",
}


@dataclass(frozen=True)
class Verdict:
    """What is known of one path on one machine."""

    path: RiskyPath
    ok: bool
    reason: str
    source: str
    when: float


class PathVerdicts:
    """The verdicts in ``native_paths.json`` for the machine ``key``; thread-safe.

    The engine thread reads :meth:`disabled` before each load; the GUI writes
    through :meth:`record` and :meth:`forget`. Every write re-reads the file so
    that other machines' keys are kept.
    """

    def __init__(self, file: Path, key: str) -> None:
        self.file = file
        self.key = key
        self._lock = threading.Lock()
        self.notes: list[str] = []  # what was wrong with the file, for the user

    def verdicts(self) -> dict[RiskyPath, Verdict]:
        """This machine's verdicts, by path."""
        with self._lock:
            return self._mine(self._read())

    def verdict(self, path: RiskyPath) -> Verdict | None:
        return self.verdicts().get(path)

    def disabled(self) -> frozenset[RiskyPath]:
        """The paths that are off on this machine."""
        return frozenset(p for p, v in self.verdicts().items() if not v.ok)

    def unknown(self, paths: tuple[RiskyPath, ...] = tuple(RiskyPath)) -> tuple[RiskyPath, ...]:
        """Those of ``paths`` with no verdict yet on this machine."""
        known = self.verdicts()
        return tuple(p for p in paths if p not in known)

    def record(self, path: RiskyPath, ok: bool, why: str, source: str) -> None:
        """Remember that ``path`` works (``ok``) or is off on this machine, and why.

        Raises:
            OSError: the file cannot be written.
        """
        if source not in SOURCES:
            raise ValueError(f"unknown source {source!r}")
        entry = {"ok": ok, "reason": why[:MAX_REASON], "source": source, "when": time.time()}
        with self._lock:
            machines = self._read()
            mine = dict(machines.get(self.key, {}))
            mine[path.value] = entry
            machines.pop(self.key, None)
            machines[self.key] = mine  # last written goes last: trimmed last
            self._write(machines)
        log.info("native path %s on %s: %s (%s) %s", path.value, self.key, ok, source, why)

    def forget(self, path: RiskyPath) -> None:
        """Drop the verdict: the path is probed again before its next use.

        Raises:
            OSError: the file cannot be written.
        """
        with self._lock:
            machines = self._read()
            mine = dict(machines.get(self.key, {}))
            if mine.pop(path.value, None) is None:
                return
            machines[self.key] = mine
            self._write(machines)

    # -- the file -------------------------------------------------------------

    def _read(self) -> dict[str, dict[str, Any]]:
        try:
            data = read_json(self.file, MAX_BYTES)
        except FileNotFoundError:
            return {}
        except DataFileError as exc:
            if exc.damaged:
                self.notes.append(
                    set_aside_note(self.file, reason(exc), "the CPU checks will run again")
                )
            else:
                log.warning("%s: %s", self.file.name, reason(exc))
            return {}
        machines = data.get("machines") if isinstance(data, dict) else None
        if not isinstance(machines, dict):
            self.notes.append(
                set_aside_note(self.file, "has no machines table", "the CPU checks will run again")
            )
            return {}
        out: dict[str, dict[str, Any]] = {}
        for key, entries in list(machines.items())[-MAX_MACHINES:]:
            if isinstance(key, str) and len(key) <= 200 and isinstance(entries, dict):
                out[key] = {k: v for k, v in entries.items() if _valid_entry(k, v)}
        return out

    def _write(self, machines: dict[str, dict[str, Any]]) -> None:
        kept = dict(list(machines.items())[-MAX_MACHINES:])
        atomic_write_text(self.file, json.dumps({"version": 1, "machines": kept}, indent=1))

    def _mine(self, machines: dict[str, dict[str, Any]]) -> dict[RiskyPath, Verdict]:
        out = {}
        for name, e in machines.get(self.key, {}).items():
            path = RiskyPath(name)
            out[path] = Verdict(path, e["ok"], e["reason"], e["source"], e["when"])
        return out


def _valid_entry(name: object, entry: object) -> bool:
    if name not in {p.value for p in RiskyPath} or not isinstance(entry, dict):
        return False
    ok, why, source, when = (entry.get(k) for k in ("ok", "reason", "source", "when"))
    return (
        isinstance(ok, bool)
        and isinstance(why, str)
        and len(why) <= MAX_REASON
        and source in SOURCES
        and isinstance(when, (int, float))
        and not isinstance(when, bool)
        and math.isfinite(when)
    )
