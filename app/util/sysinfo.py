"""Process and machine facts: resident memory, RAM, byte sizes for people."""

from __future__ import annotations

import os
import sys


def rss_bytes() -> int:
    """Current resident set size of this process (peak RSS where current is unknown)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)
    except (ImportError, OSError):
        return 0


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


def physical_memory() -> int:
    """Total RAM in bytes (0 if it cannot be told)."""
    try:
        if sys.platform == "win32":
            import ctypes

            class MemoryStatus(ctypes.Structure):
                _fields_ = [
                    ("length", ctypes.c_ulong),
                    ("load", ctypes.c_ulong),
                    ("total", ctypes.c_ulonglong),
                    ("avail", ctypes.c_ulonglong),
                    ("total_page", ctypes.c_ulonglong),
                    ("avail_page", ctypes.c_ulonglong),
                    ("total_virtual", ctypes.c_ulonglong),
                    ("avail_virtual", ctypes.c_ulonglong),
                    ("avail_extended", ctypes.c_ulonglong),
                ]

            status = MemoryStatus()
            status.length = ctypes.sizeof(MemoryStatus)
            ctypes.windll.kernel32.GlobalMemoryStatusEx(ctypes.byref(status))  # type: ignore[attr-defined]
            return int(status.total)
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def available_memory() -> int:
    """RAM available for a new model in bytes (MemAvailable on Linux, else total)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return physical_memory()
