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
file is only ever looked for under ``logs/`` by its name pattern (``CRASH_NAME``).

The parts: ``crash_recorder`` (this process's marker and fault file), ``previous_crash``
(reading what a previous process left), ``crash_report`` (what it was doing, in words).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from app.util.crash_recorder import CrashRecorder
from app.util.crash_report import CrashReport, Scalar
from app.util.previous_crash import read_previous

log = logging.getLogger(__name__)

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
