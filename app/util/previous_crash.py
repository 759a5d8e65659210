"""The crash record a previous process left: its marker and fault file, read as untrusted."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
from pathlib import Path
from typing import TypeGuard

import psutil

from app.util.atomic import atomic_write_text
from app.util.crash_recorder import (
    CRASH_NAME,
    MARKER_NAME,
    MAX_FIELDS,
    MAX_MARKER_BYTES,
    MAX_TEXT,
    remove_file,
)
from app.util.crash_report import (
    STEPS,
    CrashReport,
    Scalar,
    fault_in_native,
    parse_fault,
    summary,
)
from app.util.datafiles import DataFileError, open_regular, read_json, reason

log = logging.getLogger(__name__)

MAX_FAULT_BYTES = 512 * 1024  # faulthandler writes at most 100 frames x 100 threads
SAME_PROCESS_S = 1.0  # process start times this close name the same process
_PATH_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")


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
        remove_file(marker)
        return None, False
    report = report_from(data, logs)
    if report is None:
        log.warning("%s has no valid record; it is removed", MARKER_NAME)
        remove_file(marker)
        return None, False
    proc_start = data.get("proc_start") if isinstance(data, dict) else None
    if report.pid != os.getpid() and _alive(report.pid, proc_start):
        return None, True
    remove_file(marker)
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


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) and 0 <= number < 1e11 else None


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
