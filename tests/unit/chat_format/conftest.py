"""The chat-format worker and shim, once per module (they hold llama.cpp's chat layer)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.engine.native.chat_shim import ChatShim, library_path, load_shim, unavailable_reason
from app.engine.native.chat_worker import ChatWorker
from tests.llama_chat import shim_path


@pytest.fixture(scope="module")
def shim() -> ChatShim:
    found = load_shim(shim_path())
    # The portable build (packaging/llama_build.py) always has it: its absence is a bug.
    assert found is not None, unavailable_reason(shim_path())
    return found


@pytest.fixture(scope="module")
def worker(shim: ChatShim) -> Iterator[ChatWorker]:
    made = ChatWorker(lib=shim_path() or library_path())
    yield made
    made.close()
