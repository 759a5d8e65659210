"""Small Qt helpers shared by the panels."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from PySide6.QtCore import QObject


@contextmanager
def blocked(*widgets: QObject) -> Iterator[None]:
    """Signals of ``widgets`` blocked for the block (programmatic updates)."""
    before = [w.blockSignals(True) for w in widgets]
    try:
        yield
    finally:
        for w, was in zip(widgets, before, strict=True):
            w.blockSignals(was)
