"""Process facts for the performance panel: resident memory."""

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


def size_text(n: int) -> str:
    """``1.23 GB`` or ``45.6 MB``, for messages."""
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"
