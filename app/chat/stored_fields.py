"""Checks for values read back from Lamplight's own JSON files (transcripts, projects):
each answers whether a value is usable as it stands, or gives the repaired one."""

from __future__ import annotations

from typing import Any, TypeGuard

LATEST_TIME = 253402300799.0  # 9999-12-31 23:59:59 UTC: later dates fail in time.localtime
PATH_MAX = 4096


def is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63


def is_count(value: object) -> TypeGuard[int]:
    return is_int(value) and 0 <= value < 2**31


def is_number(value: Any) -> bool:
    # Finite (NaN fails the comparisons), and small enough for every sum and rate.
    return isinstance(value, int | float) and not isinstance(value, bool) and -1e15 < value < 1e15


def read_time(value: Any, fallback: float) -> float:
    """A timestamp ``time.localtime`` can show, else ``fallback`` (else 0)."""
    for candidate in (value, fallback):
        if is_number(candidate) and 0 <= candidate <= LATEST_TIME:
            return float(candidate)
    return 0.0


def read_text(value: Any, limit: int | None) -> str:
    """``value`` cut to ``limit`` characters when it is text, else ""."""
    if not isinstance(value, str):
        return ""
    return value if limit is None else value[:limit]


def read_path(value: Any) -> str:
    """A file path as stored, or "" (not text, too long, or with a NUL: never a file)."""
    if not isinstance(value, str) or len(value) > PATH_MAX or "\0" in value:
        return ""
    return value
