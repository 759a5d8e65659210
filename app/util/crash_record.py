"""A crash is never silent: a fault record in ``logs/`` and what the engine was doing.

At start (the window, ``lamplight serve`` and ``--smoke-test`` alike), :func:`begin`:

- reads the *activity marker* ``logs/running.json`` a previous process left. The
  marker is written at start and removed at a clean exit, so one that is still
  there (and whose process is gone) means that process closed unexpectedly: its
  step (``load``, ``prefill``, ``decode`` ...), model, settings, request and the
  native paths in use become a :class:`CrashReport`, and its fault file gets that
  summary at its head, so "Open the log" shows one complete crash record;
- opens ``logs/crash-<date>-<time>-<pid>.log`` and points ``faulthandler`` at it
  (every thread's Python stack on SIGSEGV, SIGABRT, SIGBUS, SIGILL, SIGFPE). A
  clean exit deletes it while it is empty; the newest ``KEEP_CRASH_FILES`` are kept;
- writes this process's own marker.

The engine thread reports each step change with :func:`set_step` (a few per reply,
never per token: ``app/engine/local/crash_steps.py``). A step change overwrites the marker
in place, through a descriptor kept open: one ``write`` of whole 4 KiB pages at
offset 0, the JSON padded with spaces (which JSON ignores), so the file never
shrinks and needs no truncate. A process that dies is never half way through that
one system call, so the next start reads one whole record (0.04 ms a step, mostly
the JSON). A temp file and ``os.replace`` measured 1.2-4 ms a step on ext4 here (a
rename over a file starts its writeback), five times per reply. There is no fsync
either: a process crash leaves the page cache to the kernel, which writes it out
anyway; only a power loss could lose the last step, and then there is no fault to
report.

Both files are read back as untrusted: bounded size, checked fields, and a fault
file is only ever looked for under ``logs/`` by the name pattern below.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeGuard

import psutil

from app.util.atomic import atomic_write_text
from app.util.datafiles import DataFileError, open_regular, read_json, reason
from app.util.redact import redact_text

log = logging.getLogger(__name__)

MARKER_NAME = "running.json"
CRASH_PREFIX = "crash-"
CRASH_NAME = re.compile(r"crash-\d{8}-\d{6}-\d{1,10}\.log")
KEEP_CRASH_FILES = 10  # crash records kept in logs/ besides the running process's own
MAX_MARKER_BYTES = 64 * 1024
MAX_FAULT_BYTES = 512 * 1024  # faulthandler writes at most 100 frames x 100 threads
MAX_TEXT = 4096  # the longest string field taken from a marker (a model path)
MAX_FIELDS = 48  # the most entries of a marker's load or request table
SAME_PROCESS_S = 1.0  # process start times this close name the same process
PAGE = 4096  # the marker is written in whole pages, padded with spaces

# What the engine thread can be doing. "start" and "idle" are no step of the engine.
STEPS = ("start", "load", "restore", "prefill", "decode", "prewarm", "save", "idle")
NATIVE_STEPS = frozenset({"load", "restore", "prefill", "decode", "prewarm", "save"})
_PHRASES = {
    "start": "starting",
    "load": "loading {model}",
    "restore": "restoring a conversation's saved cache",
    "prefill": "reading your message",
    "decode": "writing a reply",
    "prewarm": "getting ready for your next message",
    "save": "saving the conversation's cache",
    "idle": "",
}
_API_PHRASES = {
    "prefill": "reading a request to the local API",
    "decode": "writing a reply to the local API",
}
_PATH_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
_THREAD = re.compile(
    r"^(Current thread|Thread) (0x[0-9a-fA-F]{1,16})\b[^\n]*\(most recent call first\):", re.M
)
_FRAME = re.compile(r'^  File "([^"\n]{0,4096})", line \d+ in ', re.M)
_FATAL = re.compile(r"^Fatal Python error: ([^\n]{1,200})", re.M)
Scalar = str | int | float | bool


@dataclass(frozen=True)
class CrashReport:
    """What a process that closed unexpectedly was doing, read from its marker."""

    step: str  # one of STEPS
    since: float  # when the step began (seconds since the epoch)
    started: float  # when that process started
    pid: int
    version: str
    model: str = ""  # the model file in use (or being loaded)
    load: dict[str, Scalar] = field(default_factory=dict)  # the load settings
    paths: tuple[str, ...] = ()  # native risky paths in use (``RiskyPath`` values)
    request: dict[str, Scalar] = field(default_factory=dict)  # kind, conv, sampling
    fault: str = ""  # "Segmentation fault", when faulthandler wrote a record
    in_native: bool = False  # the fault was on the engine thread, inside llama.cpp
    log_file: Path | None = None  # the crash record (summary and thread stacks)

    @property
    def kind(self) -> str:
        """``chat`` (the window), ``api`` (the local API), or ''."""
        value = self.request.get("kind", "")
        return value if isinstance(value, str) else ""

    @property
    def conv_id(self) -> str:
        """The conversation being answered ('' when none)."""
        value = self.request.get("conv", "")
        return value if isinstance(value, str) else ""

    @property
    def mid_reply(self) -> bool:
        return self.step in ("prefill", "decode")

    @property
    def worth_telling(self) -> bool:
        """Something was under way, or a fault was recorded (a kill while idle is not)."""
        return self.step not in ("idle", "start") or bool(self.fault)

    def doing(self) -> str:
        """What Lamplight was doing, as words ('' when idle)."""
        if self.kind == "api" and self.step in _API_PHRASES:
            return _API_PHRASES[self.step]
        name = Path(self.model).name if self.model else "a model"
        return _PHRASES.get(self.step, "").format(model=name)

    def console(self) -> str:
        """The line for a terminal (``lamplight serve``, ``--smoke-test``): where the record is."""
        where = f" The crash record: {self.log_file}" if self.log_file else ""
        return self.line() + where

    def line(self, safe: bool | None = None) -> str:
        """The one-line notice; ``safe``: the conversation was verified on disk (True),
        found missing (False) or is not concerned (None)."""
        when = time.strftime("%a %d %b at %H:%M", time.localtime(self.since or self.started))
        doing = self.doing()
        text = f"Lamplight closed unexpectedly{' while ' + doing if doing else ''} on {when}."
        if safe is True:
            text += " Your conversation is safe."
        elif safe is False:
            text += " The message being answered was not saved."
        return text


@dataclass(frozen=True)
class Fault:
    """The parts of a faulthandler record that matter here."""

    error: str  # "Segmentation fault"
    current: int | None  # the thread that faulted
    top_frames: tuple[str, ...]  # its innermost Python frames' files, innermost first


def parse_fault(text: str) -> Fault | None:
    """The fault in faulthandler's output (None when it holds none)."""
    fatal = _FATAL.search(text)
    if fatal is None:
        return None
    current: int | None = None
    frames: tuple[str, ...] = ()
    for match in _THREAD.finditer(text):
        if match.group(1) == "Current thread":
            current = int(match.group(2), 16)
            rest = text[match.end() :]
            stop = re.search(r"^\S", rest, re.M)  # the next unindented line ends the stack
            block = rest[: stop.start()] if stop else rest
            frames = tuple(f.replace("\\", "/") for f in _FRAME.findall(block))[:8]
            break
    return Fault(fatal.group(1).strip(), current, frames)


def fault_in_native(fault: Fault, engine_thread: int, step: str) -> bool:
    """The fault happened inside llama.cpp: on the engine thread during a native step,
    or with llama-cpp-python or the engine's own modules innermost on the stack."""
    if fault.current is None:
        return False
    if engine_thread and fault.current == engine_thread and step in NATIVE_STEPS:
        return True
    top = fault.top_frames[:1]
    return any("/llama_cpp/" in f or "/app/engine/" in f for f in top)


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


_current: CrashRecorder | None = None


def begin(
    logs: Path, version: str, fault_handler: bool = True
) -> tuple[CrashRecorder | None, CrashReport | None]:
    """Read what a previous process left, then start this one's record and make it the
    one :func:`set_step` writes to. Never raises: without a recorder the app runs on.

    Returns the recorder (None if it could not start) and the previous process's
    :class:`CrashReport` (None after a clean exit, or when another process is live).
    """
    global _current
    try:
        report, live = read_previous(logs)
    except Exception:  # a crash record must never keep the app from starting
        log.exception("reading the previous crash record failed")
        report, live = None, False
    if live:
        log.warning("another Lamplight process is using %s; no crash record is kept", logs)
        return None, None
    recorder = CrashRecorder(logs, version)
    try:
        recorder.start(fault_handler)
    except OSError as exc:
        log.warning("no crash record can be kept: %s", exc)
        recorder.close()
        return None, report
    _current = recorder
    return recorder, report


def end(recorder: CrashRecorder | None) -> None:
    """A clean exit of ``recorder``'s process (see :meth:`CrashRecorder.close`)."""
    global _current
    if recorder is None:
        return
    recorder.close()
    if _current is recorder:
        _current = None


def current() -> CrashRecorder | None:
    """The process's recorder, when :func:`begin` started one."""
    return _current


def set_step(
    step: str,
    model: str = "",
    load: Mapping[str, Scalar] | None = None,
    paths: Sequence[str] = (),
    request: Mapping[str, Scalar] | None = None,
) -> None:
    """Report the engine's step to the process's recorder (nothing without one)."""
    recorder = _current
    if recorder is not None:
        recorder.set_step(step, model, load, paths, request)


def add_to_load(key: str, value: Scalar) -> None:
    """Add ``key`` to the load step's table (nothing without a recorder, or mid-reply)."""
    recorder = _current
    if recorder is not None:
        recorder.add_to_load(key, value)


# -- the previous process ------------------------------------------------------------


def read_previous(logs: Path) -> tuple[CrashReport | None, bool]:
    """The report of a previous process that closed unexpectedly, and whether the process
    that wrote the marker is still running. The marker goes (unless it is live); the
    report's fault file gets the summary at its head. A process stopped while idle
    with no fault recorded gives no report."""
    marker = logs / MARKER_NAME
    try:
        data = read_json(marker, MAX_MARKER_BYTES, max_depth=4)
    except FileNotFoundError:
        return None, False
    except DataFileError as exc:
        log.warning("%s %s; it is removed", MARKER_NAME, reason(exc))
        _remove(marker)
        return None, False
    report = report_from(data, logs)
    if report is None:
        log.warning("%s has no valid record; it is removed", MARKER_NAME)
        _remove(marker)
        return None, False
    proc_start = data.get("proc_start") if isinstance(data, dict) else None
    if report.pid != os.getpid() and _alive(report.pid, proc_start):
        return None, True
    _remove(marker)
    if not report.worth_telling:  # stopped while idle (a logout, say): nothing to tell
        log.info("the previous Lamplight was stopped while idle")
        if report.log_file is not None:
            with contextlib.suppress(OSError):
                if report.log_file.stat().st_size == 0:
                    report.log_file.unlink()
        return None, False
    log.warning("the previous Lamplight closed unexpectedly: %s", report.line())
    if report.log_file is not None:
        _write_summary(report)
    return report, False


def report_from(data: object, logs: Path) -> CrashReport | None:
    """A :class:`CrashReport` from a marker's parsed JSON (None when it is not one)."""
    if not isinstance(data, dict) or data.get("version") != 1:
        return None
    pid, started = data.get("pid"), _number(data.get("started"))
    if not isinstance(pid, int) or isinstance(pid, bool) or not 0 < pid < 2**31:
        return None
    if started is None:
        return None
    step = data.get("step")
    step = step if isinstance(step, str) and step in STEPS else "start"
    since = _number(data.get("since")) or started
    paths = data.get("paths")
    paths_ok = tuple(p for p in (paths if isinstance(paths, list) else [])[:8] if _is_path_name(p))
    log_file = _fault_file(logs, data.get("fault_log"))
    text = _read_fault(log_file) if log_file is not None else ""
    fault = parse_fault(text)
    thread = data.get("thread")
    engine_thread = thread if isinstance(thread, int) and not isinstance(thread, bool) else 0
    return CrashReport(
        step=step,
        since=since,
        started=started,
        pid=pid,
        version=_text(data.get("app"))[:64],
        model=_text(data.get("model")),
        load=_table(data.get("load")),
        paths=tuple(dict.fromkeys(paths_ok)),
        request=_table(data.get("request")),
        fault=fault.error if fault is not None else "",
        in_native=fault is not None and fault_in_native(fault, engine_thread, step),
        log_file=log_file,
    )


def summary(report: CrashReport) -> str:
    """The crash record's head: what the process was doing, in plain lines."""

    def table(values: Mapping[str, Scalar]) -> str:
        return ", ".join(f"{k}={v}" for k, v in values.items()) or "-"

    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(report.started))
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(report.since))
    lines = [
        f"Lamplight {report.version} (pid {report.pid}, started {started}) closed unexpectedly.",
        f"Step: {report.step} ({report.doing() or 'nothing under way'}) since {since}",
        f"Model: {report.model or '-'}",
        f"Load settings: {table(report.load)}",
        f"Request: {table(report.request)}",
        f"Native paths in use: {', '.join(report.paths) or '-'}",
        f"Fault: {report.fault or 'none recorded (the process was killed, or lost power)'}",
        f"Inside llama.cpp: {'yes' if report.in_native else 'no'}",
    ]
    return redact_text("\n".join(lines)) + "\n"  # a marker from an older version, too


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
        _remove(logs / name)


def _write_summary(report: CrashReport) -> None:
    assert report.log_file is not None
    fault = _read_fault(report.log_file)
    if fault.startswith("Lamplight "):
        return  # summarised already (two starts racing); keep it as it is
    body = summary(report) + (
        f"\nThread stacks (faulthandler):\n{fault}" if fault else "\nNo thread stacks.\n"
    )
    try:
        atomic_write_text(report.log_file, body)
    except OSError as exc:
        log.warning("could not complete the crash record %s: %s", report.log_file.name, exc)


def _read_fault(path: Path) -> str:
    """The first ``MAX_FAULT_BYTES`` of a fault file, as text ('' if it cannot be read)."""
    try:
        fd, _size = open_regular(path)
    except (FileNotFoundError, DataFileError):
        return ""
    try:
        with os.fdopen(fd, "rb") as fh:
            raw = fh.read(MAX_FAULT_BYTES)
    except OSError:
        return ""
    return raw.decode("utf-8", "replace").replace("\x00", "")


def _fault_file(logs: Path, name: object) -> Path | None:
    if not isinstance(name, str) or not CRASH_NAME.fullmatch(name):
        return None  # never a path taken from the file: only our own names, in logs/
    path = logs / name
    try:
        return path if path.is_file() and not path.is_symlink() else None
    except OSError:
        return None


def _alive(pid: int, proc_start: object) -> bool:
    """The process that wrote a marker is still running (same pid, same start time)."""
    start = _number(proc_start)
    if start is None:
        return False
    try:
        return abs(psutil.Process(pid).create_time() - start) < SAME_PROCESS_S
    except (psutil.Error, OSError, ValueError, OverflowError):
        return False


def _process_start(pid: int) -> float:
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.Error, OSError):
        return 0.0


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("could not remove %s: %s", path.name, exc)


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) and 0 <= number < 1e11 else None


def _redacted(table: Mapping[str, Scalar] | None) -> dict[str, Scalar]:
    items = list((table or {}).items())[:MAX_FIELDS]
    return {k: redact_text(v) if isinstance(v, str) else v for k, v in items}


def _text(value: object) -> str:
    return value[:MAX_TEXT] if isinstance(value, str) else ""


def _is_path_name(value: object) -> bool:
    return isinstance(value, str) and _PATH_NAME.fullmatch(value) is not None


def _is_scalar(item: object) -> TypeGuard[bool | int | float]:
    """A bool, an int that fits 64 bits, or a finite float (NaN and inf are left out)."""
    if isinstance(item, bool):
        return True
    if isinstance(item, int):
        return abs(item) < 2**63
    return isinstance(item, float) and math.isfinite(item)


def _table(value: object) -> dict[str, Scalar]:
    """A flat table of short names to scalars; anything else is left out."""
    if not isinstance(value, dict):
        return {}
    out: dict[str, Scalar] = {}
    for key, item in list(value.items())[:MAX_FIELDS]:
        if not isinstance(key, str) or len(key) > 64:
            continue
        if isinstance(item, str):
            out[key] = item[:MAX_TEXT]
        elif _is_scalar(item):
            out[key] = item
    return out
