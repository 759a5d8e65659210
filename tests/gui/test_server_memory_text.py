"""What the status bar and Help -> Hardware say of how the model remembers (issue 43):
in-process, on a llama-server whose model is known, and on one whose model is not."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from app.engine.backend import Capabilities, ModelInfo
from app.remote.llama_server.images import ServerImages
from app.remote.llama_server.model_info import CHECKPOINTS_WHY_NOT, capabilities
from ui.models.model_status import ModelStatus, memory_text

URL = "http://127.0.0.1:8080"
IN_PROCESS_CAVEAT = "Its state is kept at checkpoints"


def _info(caps: Capabilities, server: str = "") -> ModelInfo:
    return ModelInfo(
        path=Path("/models/m.gguf"),
        name="m.gguf",
        architecture="",
        n_params=1_000_000,
        file_size=1,
        n_ctx=2048,
        n_ctx_train=2048,
        n_threads=0,
        n_gpu_layers=0,
        template="chatml",
        backend="llama-server" if server else "llama.cpp",
        load_ms=1.0,
        capabilities=caps,
        server=server,
    )


def _server(memory: str) -> ModelInfo:
    media = ServerImages(lambda *_a, **_k: None)
    return _info(capabilities(URL, False, media, memory), URL)


@pytest.mark.parametrize("memory", ["hybrid", "recurrent"])
def test_a_server_model_with_a_state_says_its_slot_files_hold_no_checkpoints(
    memory: str,
) -> None:
    text = memory_text(_server(memory))
    named = {"hybrid": "layers (hybrid)", "recurrent": "a recurrent state, no KV cache"}
    assert text.startswith("Memory: ") and named[memory] in text
    assert text.endswith(". " + CHECKPOINTS_WHY_NOT)
    assert IN_PROCESS_CAVEAT not in text


def test_in_process_hybrid_and_recurrent_models_keep_their_own_checkpoints() -> None:
    for memory in ("hybrid", "recurrent"):
        text = memory_text(_info(Capabilities(memory=memory)))
        assert IN_PROCESS_CAVEAT in text and "slot files" not in text


@pytest.mark.parametrize(
    ("memory", "said"),
    [("attention", "Memory: a KV cache"), ("sliding-window", "sliding-window layers")],
)
def test_a_server_model_with_a_kv_cache_has_no_caveat(memory: str, said: str) -> None:
    text = memory_text(_server(memory))
    assert said in text and "checkpoint" not in text
    assert text == memory_text(_info(Capabilities(memory=memory)))  # as in-process


def test_a_server_model_not_known_says_so() -> None:
    assert memory_text(_server("")) == "Memory: not known (the server does not report it)"
    # An OpenAI-compatible server says nothing either.
    assert memory_text(_info(Capabilities(), "http://10.0.0.2:1")).startswith("Memory: not known")
    assert memory_text(_info(Capabilities())) == ""  # an engine that does not say
    assert memory_text(None) == ""


def test_a_server_hybrid_without_the_reason_still_names_its_memory() -> None:
    caps = replace(_server("hybrid").capabilities, why_not={})
    assert memory_text(_info(caps, URL)) == (
        "Memory: recurrent layers with attention layers (hybrid)"
    )


def test_the_status_bar_tooltip_says_it(qtbot: QtBot) -> None:
    from PySide6.QtWidgets import QMainWindow

    window = QMainWindow()
    qtbot.addWidget(window)
    status = ModelStatus(window, window.statusBar(), lambda: None)
    status.loaded(_server("hybrid"))
    assert CHECKPOINTS_WHY_NOT in status.label.toolTip()
    status.loaded(_server(""))
    assert "Memory: not known" in status.label.toolTip()
