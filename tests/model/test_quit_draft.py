"""Quitting while a draft model loads keeps to quit's bound.

A draft load ran to its end whatever happened: the engine thread finished it before
the quit's last snapshot save and join, so quitting took as long as the load (a big
draft on a slow disk: far past the 10 s quit promises). The load now goes through
llama.cpp's progress callback, which answers False once the app quits. Here the
draft's load is slowed deterministically: each progress step takes ``STEP_S``, so the
whole load would take ``STEP_S`` times its steps (55 for the test draft).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.config.setting_records import LoadConfig
from app.engine.local import loader as loader_module
from app.engine.local.engine import Engine
from ui.engine.worker import EngineClient

LOAD = LoadConfig(n_ctx=256, n_threads=1)
STEP_S = 0.4  # 55 steps: 22 s to load the draft, unless it is abandoned
QUIT_S = 10.0  # EngineClient.shutdown's bound


def slow_drafts(monkeypatch: pytest.MonkeyPatch, draft: Path) -> threading.Event:
    """Make every progress step of loading ``draft`` take ``STEP_S``; the event is set
    at the first step (llama.cpp is reading the draft's tensors)."""
    started = threading.Event()
    real_open = loader_module.open_llama

    def slow_open(gguf: Any, config: LoadConfig, progress: Any, *args: Any) -> Any:
        if Path(gguf.path) != draft:
            return real_open(gguf, config, progress, *args)

        def slow(value: float) -> bool:
            started.set()
            time.sleep(STEP_S)
            return bool(progress(value)) if progress is not None else True

        return real_open(gguf, config, slow, *args)

    # A draft is opened by draft_slot.open_draft, which looks the loader up at call time.
    monkeypatch.setattr(loader_module, "open_llama", slow_open)
    return started


@pytest.mark.parametrize("when", ["chosen", "after_load"])
def test_quit_while_a_draft_loads_keeps_its_bound(
    qtbot: QtBot,
    tmp_path: Path,
    model_path: Path,
    draft_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    when: str,
) -> None:
    """``chosen``: the user picks a draft for the loaded model; ``after_load``: the draft
    chosen before comes back after the model loads."""
    started = slow_drafts(monkeypatch, draft_path)
    client = EngineClient(tmp_path / "models", engine_factory=Engine)
    engine = client.host.local
    failed: list[str] = []
    client.worker.draftFailed.connect(failed.append, Qt.ConnectionType.DirectConnection)
    try:
        if when == "after_load":
            client.set_draft(draft_path)  # no model yet: loaded after the next one
        client.load(model_path, LOAD)
        if when == "chosen":
            qtbot.waitUntil(lambda: engine.model is not None, timeout=60_000)
            client.set_draft(draft_path)
        qtbot.waitUntil(started.is_set, timeout=60_000)  # llama.cpp reads the draft's tensors
        t0 = time.monotonic()
        assert client.shutdown(), "the engine thread did not end"
        elapsed = time.monotonic() - t0
    finally:
        client.shutdown()
    assert elapsed < QUIT_S, f"quit took {elapsed:.1f} s"
    assert engine.draft_info is None and engine.model is None  # abandoned, then freed
    assert failed == ["Loading the draft model was cancelled."]
