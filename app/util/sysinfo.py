"""Process and machine facts: resident memory, RAM, byte sizes for people.

Memory figures come from ``psutil``, which reads each OS's own accounting
(``/proc`` on Linux, ``GlobalMemoryStatusEx`` and the process's working set on
Windows, ``host_statistics`` and ``task_info`` on macOS). Where it fails, the
figure is 0, which every caller reads as "unknown" (no fit badge, no limit).
"""

from __future__ import annotations

import logging
import os
import threading

import psutil

log = logging.getLogger(__name__)

_PROCESS: tuple[int, psutil.Process] | None = None
_PROCESS_LOCK = threading.Lock()
_WARNED: set[str] = set()


def _unknown(what: str, exc: BaseException) -> int:
    """0 for a figure psutil could not give; logged once per figure."""
    if what not in _WARNED:
        _WARNED.add(what)
        log.warning("%s is unknown: %s", what, exc)
    return 0


def _this_process() -> psutil.Process:
    """This process, reused between calls (and made again after a fork)."""
    global _PROCESS
    pid = os.getpid()
    with _PROCESS_LOCK:
        if _PROCESS is None or _PROCESS[0] != pid:
            _PROCESS = (pid, psutil.Process(pid))
        return _PROCESS[1]


def rss_bytes() -> int:
    """Current resident set size of this process (the working set on Windows); 0 if unknown."""
    try:
        return int(_this_process().memory_info().rss)
    except (psutil.Error, OSError, ValueError, AttributeError) as exc:
        return _unknown("resident memory", exc)


def physical_memory() -> int:
    """Total RAM in bytes (0 if it cannot be told)."""
    try:
        return int(psutil.virtual_memory().total)
    except (psutil.Error, OSError, ValueError, AttributeError) as exc:
        return _unknown("total memory", exc)


def available_memory() -> int:
    """RAM a new model can use without swapping, in bytes (0 if it cannot be told).

    psutil's ``available``: free memory plus what the OS can reclaim at once (page
    cache, inactive pages); Linux's MemAvailable, Windows' ullAvailPhys.
    """
    try:
        return int(psutil.virtual_memory().available)
    except (psutil.Error, OSError, ValueError, AttributeError) as exc:
        return _unknown("available memory", exc)


def size_text(n: float, binary: bool = False) -> str:
    """Bytes for people: decimal units (kB, MB, GB: powers of 1000, as file managers
    show sizes) or, with ``binary``, KiB, MiB, GiB (powers of 1024)."""
    base, units = (
        (1024.0, ("B", "KiB", "MiB", "GiB", "TiB"))
        if binary
        else (
            1000.0,
            ("B", "kB", "MB", "GB", "TB"),
        )
    )
    size = float(n)
    for unit in units:
        if abs(size) < base or unit == units[-1]:
            break
        size /= base
    if unit == "B":
        return f"{size:.0f} B"
    return f"{size:.2f} {unit}" if unit in ("GB", "GiB", "TB", "TiB") else f"{size:.1f} {unit}"
