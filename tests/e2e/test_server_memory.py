"""How a real llama-server's model remembers the conversation (issue 43): llama-server
does not say, so the backend reads the file the server names (``/props`` ``model_path``)
when it is on this machine; a hybrid or recurrent model's capabilities say the server's
slot files hold no checkpoints. Every server here runs on 127.0.0.1 and is stopped."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from app.engine.native.memory_probe import file_memory_kind
from app.remote.llama_server.backend import LlamaServerBackend
from app.remote.llama_server.model_info import CHECKPOINTS_WHY_NOT
from tests.arch_models import arch_model_path
from tests.byte_model import byte_model_path
from tests.server_fixture import RunningServer, connected_backend, running_llama_server
from ui.models.model_status import memory_text


@pytest.mark.parametrize(
    ("arch", "memory"), [("mamba2", "recurrent"), ("lfm2", "hybrid"), ("qwen35", "hybrid")]
)
def test_the_tiny_recurrent_and_hybrid_models_are_read_as_such(arch: str, memory: str) -> None:
    assert file_memory_kind(arch_model_path(arch)) == memory


def test_gemma_has_sliding_window_layers_and_the_byte_model_plain_attention(
    model_path: Path,
) -> None:
    # Past the vocabulary: with vocab_only llama.cpp never reads the window (n_swa 0).
    assert file_memory_kind(model_path) == "sliding-window"
    assert file_memory_kind(byte_model_path()) == "attention"


def _said(backend: LlamaServerBackend) -> tuple[str, dict[str, str], str]:
    info = backend.model
    assert info is not None and info.server
    assert info.capabilities == backend.capabilities
    caps = info.capabilities
    return caps.memory, caps.why_not, memory_text(info)


@pytest.mark.parametrize("arch", ["lfm2", "mamba2"])
def test_a_server_on_a_model_with_a_state_says_its_slot_files_hold_no_checkpoints(
    arch: str, tmp_path: Path
) -> None:
    with (
        running_llama_server(arch_model_path(arch), tmp_path, threads=1) as server,
        connected_backend(server.url, arch) as backend,
    ):
        memory, why_not, text = _said(backend)
    assert memory == ("hybrid" if arch == "lfm2" else "recurrent")
    assert why_not["checkpoints"] == CHECKPOINTS_WHY_NOT
    assert text.endswith(CHECKPOINTS_WHY_NOT) and "kept at checkpoints" not in text
    # Disconnected, the backend forgets it.
    assert backend.capabilities.memory == "" and "checkpoints" not in backend.capabilities.why_not


def test_a_server_on_the_byte_model_has_a_kv_cache(tmp_path: Path) -> None:
    with (
        running_llama_server(byte_model_path(), tmp_path, threads=1) as server,
        connected_backend(server.url, "byte") as backend,
    ):
        memory, why_not, text = _said(backend)
    assert memory == "attention" and "checkpoints" not in why_not
    assert text == "Memory: a KV cache"


def test_the_default_model_server_has_sliding_window_layers(llama_server: RunningServer) -> None:
    with connected_backend(llama_server.url, "gemma") as backend:
        memory, why_not, text = _said(backend)
    assert memory == "sliding-window" and "checkpoints" not in why_not
    assert "sliding-window layers" in text


def test_a_server_whose_file_is_not_here_is_not_known(tmp_path: Path) -> None:
    copy = tmp_path / "gone.gguf"
    shutil.copyfile(arch_model_path("lfm2"), copy)
    with running_llama_server(copy, tmp_path / "server", threads=1) as server:
        copy.unlink()  # the server read it; its path now names nothing here
        with connected_backend(server.url, "gone") as backend:
            memory, why_not, text = _said(backend)
            assert backend.model is not None and backend.model.name == "gone.gguf"
    assert memory == "" and "checkpoints" not in why_not
    assert text == "Memory: not known (the server does not report it)"
