"""The benches' engines run under the native guard, as the app's do.

An ``Engine()`` made without a data folder has no guard unless
``LAMPLIGHT_NATIVE_PATHS_FILE`` names a verdict file (``default_guard``), so a bench
would load the repacked-weight kernels that crash on some CPUs (AMX here: SIGILL) where
the app turns them off. The benches share the test suite's verdict file, checked once.
"""

from __future__ import annotations

import os
from pathlib import Path

from app.engine.native.guard import STORE_ENV

VERDICTS = Path(__file__).resolve().parent.parent / ".cache" / "native_paths.json"


def use_native_guard() -> None:
    """Point engines made from here on (and the bench's child processes) at the verdicts."""
    os.environ.setdefault(STORE_ENV, str(VERDICTS))
