"""Raw ``llama_cpp.Llama`` objects for tests, loaded the way the engine loads them: the CPU
variant chosen, and llama.cpp's extra buffer types off where they crash on this machine."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from app.config.setting_records import LoadConfig
from app.engine.native.guard import STORE_ENV, NativeGuard
from app.engine.native.libs import load_backends


def extra_bufts_ok(model: Path) -> bool:
    """Whether the repacked-weight kernels run on this machine (checked once, remembered
    in the suite's verdict file)."""
    store = os.environ.get(STORE_ENV)
    if not store:
        return True
    guard = NativeGuard(Path(store))
    return guard.prepare(model, LoadConfig(n_ctx=256, n_threads=1), gpu=False).extra_bufts


def llama(path: str | Path, probe_model: Path | None = None, **kwargs: Any) -> Any:
    """``Llama(str(path), **kwargs)`` after the backends are loaded, with repacking off
    where it crashes (judged on ``probe_model``, default ``path``)."""
    from llama_cpp import Llama

    from app.engine.local.loader import load_progress

    load_backends()
    with load_progress(None, extra_bufts_ok(probe_model or Path(path))):
        return Llama(str(path), **kwargs)


def own_notes(notes: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """``notes`` without the machine's own: a risky native path that is off on this CPU
    (AMX repacking where it faults, say) adds a note to every load."""
    return tuple(n for n in notes if " is off on this computer: " not in n)
