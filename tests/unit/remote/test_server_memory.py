"""How a llama-server's model remembers (issue 43): the capabilities that say it, when
the server's file is read at all, and files that never reach llama.cpp."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from app.engine.native import memory_probe
from app.engine.native.memory_probe import file_memory_kind
from app.remote.llama_server import model_info
from app.remote.llama_server.images import ServerImages
from app.remote.llama_server.model_info import CHECKPOINTS_WHY_NOT, capabilities, server_memory
from tests.byte_model import byte_model_path

URL = "http://127.0.0.1:8080"


def _media() -> ServerImages:
    def call(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("no request is made")

    return ServerImages(call)


@pytest.mark.parametrize("memory", ["hybrid", "recurrent"])
def test_a_hybrid_or_recurrent_server_model_says_its_slot_files_hold_no_checkpoints(
    memory: str,
) -> None:
    caps = capabilities(URL, False, _media(), memory)
    assert caps.memory == memory
    assert caps.why_not["checkpoints"] == CHECKPOINTS_WHY_NOT
    assert "slot files hold none" in CHECKPOINTS_WHY_NOT


@pytest.mark.parametrize("memory", ["attention", "sliding-window", ""])
def test_other_server_models_have_no_checkpoint_caveat(memory: str) -> None:
    caps = capabilities(URL, True, _media(), memory)
    assert caps.memory == memory and "checkpoints" not in caps.why_not
    assert capabilities(URL, True, _media()).memory == ""  # not known unless probed


@pytest.fixture()
def probed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths ``server_memory`` asks the probe about (it answers "hybrid")."""
    asked: list[str] = []

    def probe(path: str) -> str:
        asked.append(path)
        return "hybrid"

    monkeypatch.setattr(model_info, "file_memory_kind", probe)
    return asked


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:9", "http://localhost:9", "http://[::1]:9", "https://127.8.0.1"]
)
def test_a_server_on_this_machine_has_its_file_read(url: str, probed: list[str]) -> None:
    assert server_memory(url, {"model_path": "/models/m.gguf"}) == "hybrid"
    assert probed == ["/models/m.gguf"]


@pytest.mark.parametrize(
    "url", ["http://10.0.0.2:8080", "http://example.com", "http://192.168.1.5", "http://[::2]"]
)
def test_a_path_on_another_machine_is_not_read_here(url: str, probed: list[str]) -> None:
    assert server_memory(url, {"model_path": "/models/m.gguf"}) == ""
    assert probed == []


NO_PATHS = [None, 7, "", ["/m"], "/m\x00.gguf", "/" + "m" * 5000]


@pytest.mark.parametrize("props", [{}, *({"model_path": p} for p in NO_PATHS)])
def test_a_model_path_that_is_no_path_is_not_read(props: dict[str, Any], probed: list[str]) -> None:
    assert server_memory(URL, props) == ""
    assert probed == []


@pytest.fixture()
def no_llama(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail a test whose file gets past the header checks to llama.cpp."""

    def refused(path: Path) -> str:
        raise AssertionError(f"llama.cpp was given {path}")

    monkeypatch.setattr(memory_probe, "_metadata_kind", refused)


@pytest.mark.usefixtures("no_llama")
def test_files_that_are_no_model_never_reach_llama_cpp(tmp_path: Path) -> None:
    text = tmp_path / "notes.gguf"
    text.write_text("not a model at all\n" * 10)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    whole = byte_model_path().read_bytes()
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(whole[: len(whole) // 2])
    header_only = tmp_path / "header.gguf"
    header_only.write_bytes(whole[:64])
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)  # a reader that opened it would wait for a writer forever
    for path in (tmp_path / "missing.gguf", text, empty, truncated, header_only, fifo, tmp_path):
        assert file_memory_kind(path) == "", path
        assert file_memory_kind(str(path)) == "", path
    assert file_memory_kind("/no\x00where.gguf") == ""


def test_a_llama_cpp_failure_is_no_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(path: Path) -> str:
        raise RuntimeError("a binding that changed")

    monkeypatch.setattr(memory_probe, "_metadata_kind", broken)
    assert file_memory_kind(byte_model_path()) == ""  # past the header checks: a good file


def test_a_header_check_that_fails_unexpectedly_is_no_answer(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def broken(path: object) -> object:
        raise OSError("unexpected")

    monkeypatch.setattr(memory_probe, "read_gguf_info", broken)
    assert file_memory_kind(tmp_path / "m.gguf") == ""


def test_a_file_llama_cpp_will_not_read_is_no_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    import llama_cpp

    def refuses(path: bytes, params: Any) -> None:
        assert params.no_alloc and params.n_gpu_layers == 0  # no weights, no GPU
        return None

    monkeypatch.setattr(llama_cpp, "llama_model_load_from_file", refuses)
    assert file_memory_kind(byte_model_path()) == ""
