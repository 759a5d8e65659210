"""This process's crash record: the activity marker and the fault file (see ``crash_record``)."""

from __future__ import annotations

import contextlib
import faulthandler
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import psutil

from app.util.crash_report import STEPS, Scalar
from app.util.redact import redact_text

log = logging.getLogger(__name__)

MARKER_NAME = "running.json"
CRASH_PREFIX = "crash-"
CRASH_NAME = re.compile(r"crash-\d{8}-\d{6}-\d{1,10}\.log")
KEEP_CRASH_FILES = 10  # crash records kept in logs/ besides the running process's own
MAX_MARKER_BYTES = 64 * 1024
MAX_TEXT = 4096  # the longest string field taken from a marker (a model path)
MAX_FIELDS = 48  # the most entries of a marker's load or request table
PAGE = 4096  # the marker is written in whole pages, padded with spaces


class CrashRecorder:
    """This process's marker and fault file; thread-safe."""

    def __init__(
        self,
        logs: Path,
        version: str,
        pid: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.logs = logs
        self.marker = logs / MARKER_NAME
        self.version = version
        self.pid = os.getpid() if pid is None else pid
        self._clock = clock
        self._lock = threading.Lock()
        self._fault_file: IO[str] | None = None
        self.fault_path: Path | None = None
        self._state: dict[str, Any] = {}
        self._marker_fd: int | None = None
        self._marker_size = 0  # bytes written so far: the file never shrinks
        self._write_failed = False
        self._handler_on = False  # faulthandler was pointed at our file (not pytest's)
        self.closed = False

    def start(self, fault_handler: bool = True) -> None:
        """Open the fault file (and point faulthandler at it) and write the marker.

        Raises:
            OSError: the fault file cannot be made.
        """
        now = self._clock()
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
        self.fault_path = self.logs / f"{CRASH_PREFIX}{stamp}-{self.pid}.log"
        self._fault_file = open(self.fault_path, "w", encoding="utf-8")  # noqa: SIM115  # kept open for faulthandler
        if fault_handler:
            faulthandler.enable(file=self._fault_file, all_threads=True)
            self._handler_on = True
        self._state = {
            "version": 1,
            "pid": self.pid,
            "proc_start": _process_start(self.pid),
            "app": self.version,
            "started": now,
            "fault_log": self.fault_path.name,
        }
        self._open_marker()
        self.set_step("start")
        prune_crash_files(self.logs, keep=KEEP_CRASH_FILES, besides=self.fault_path)

    def set_step(
        self,
        step: str,
        model: str = "",
        load: Mapping[str, Scalar] | None = None,
        paths: Sequence[str] = (),
        request: Mapping[str, Scalar] | None = None,
    ) -> None:
        """The engine now does ``step`` (one of ``STEPS``), on the calling thread."""
        if step not in STEPS:
            raise ValueError(f"unknown step {step!r}")
        with self._lock:
            if self.closed or not self._state:
                return
            self._state.update(
                step=step,
                since=self._clock(),
                thread=threading.get_ident(),
                model=redact_text(model[-MAX_TEXT:]),  # a server's address may carry a key
                load=_redacted(load),
                paths=list(paths)[:8],
                request=_redacted(request),
            )
            self._write()

    def add_to_load(self, key: str, value: Scalar) -> None:
        """Add ``key`` to the step's load table (a load that has reached ``key``)."""
        with self._lock:
            if self.closed or not self._state or self._state.get("step") != "load":
                return
            load = dict(self._state.get("load") or {})
            load[key] = value
            self._state["load"] = dict(list(load.items())[:MAX_FIELDS])
            self._write()

    def close(self) -> None:
        """A clean exit: the marker goes, and the fault file too while it is empty."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            if self._fault_file is not None:
                if self._handler_on:
                    faulthandler.disable()
                with contextlib.suppress(OSError):
                    self._fault_file.close()
                self._fault_file = None
            if self._marker_fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._marker_fd)
                self._marker_fd = None
                with contextlib.suppress(OSError):
                    self.marker.unlink()
            if self.fault_path is not None:
                with contextlib.suppress(OSError):
                    if self.fault_path.stat().st_size == 0:
                        self.fault_path.unlink()

    def _open_marker(self) -> None:
        flags = (
            os.O_WRONLY
            | os.O_CREAT
            | os.O_TRUNC
            | getattr(os, "O_NOFOLLOW", 0)
            | getattr(os, "O_NONBLOCK", 0)  # a FIFO put in its place fails, never blocks
            | getattr(os, "O_CLOEXEC", 0)
            | getattr(os, "O_BINARY", 0)
        )
        try:
            self._marker_fd = os.open(self.marker, flags, 0o600)
        except OSError as exc:
            self._write_failed = True
            log.warning("the activity marker cannot be written: %s", exc)

    def _write(self) -> None:
        """Overwrite the marker in place (see the module docstring for why not a rename)."""
        if self._marker_fd is None:
            return
        data = json.dumps(self._state, separators=(",", ":")).encode("utf-8")
        if len(data) > MAX_MARKER_BYTES // 2:  # pathological text (escaped): keep the step
            small = {**self._state, "model": self._state["model"][-256:], "request": {}}
            data = json.dumps({**small, "load": {}}, separators=(",", ":")).encode("utf-8")
        size = max(self._marker_size, -(-len(data) // PAGE) * PAGE)
        try:
            os.lseek(self._marker_fd, 0, os.SEEK_SET)
            written = os.write(self._marker_fd, data.ljust(size, b" "))
        except OSError as exc:
            written = -1
            if not self._write_failed:
                self._write_failed = True
                log.warning("the activity marker cannot be written: %s", exc)
        if written == size:
            self._marker_size = size


def prune_crash_files(logs: Path, keep: int, besides: Path | None = None) -> None:
    """Delete all but the newest ``keep`` crash records (and never ``besides``)."""
    try:
        names = sorted(
            p.name for p in logs.iterdir() if CRASH_NAME.fullmatch(p.name) and p != besides
        )
    except OSError as exc:
        log.info("crash records not pruned: %s", exc)
        return
    for name in names[: max(0, len(names) - keep)]:
        remove_file(logs / name)


def _process_start(pid: int) -> float:
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.Error, OSError):
        return 0.0


def remove_file(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("could not remove %s: %s", path.name, exc)


def _redacted(table: Mapping[str, Scalar] | None) -> dict[str, Scalar]:
    items = list((table or {}).items())[:MAX_FIELDS]
    return {k: redact_text(v) if isinstance(v, str) else v for k, v in items}
