"""Where the app's own files (icons, style sheet, the recommended list) are."""

from __future__ import annotations

import sys
from pathlib import Path


def resources_dir() -> Path:
    """``resources/``: beside the packages in a checkout, or in the frozen bundle."""
    base = getattr(sys, "_MEIPASS", None)
    if base:
        return Path(base) / "resources"
    return Path(__file__).resolve().parent.parent.parent / "resources"
