"""The corpus families through the llama-server backend against a real llama-server
(issue 42): the backend renders the family's template with llama.cpp's chat layer, sends
its grammar, triggers and preserved tokens with ``/completion``, and reads what the
server streams back with llama.cpp's parser, as the in-process engine does
(``tests/model/test_chat_formats_engine.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.engine.backend import Finished, Token
from app.engine.templates.override import TemplateOverride
from app.remote.llama_server.backend import LlamaServerBackend
from tests import llama_chat
from tests.chat_families import (
    ASK,
    FAMILIES,
    GREEDY,
    NAMED,
    assert_named_call,
    tools_given_to_llama_cpp,
)
from tests.server_fixture import RunningServer, connected_backend, running_llama_server


@pytest.fixture(scope="module")
def formats_server(
    model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    work = tmp_path_factory.mktemp("formats-server")
    with running_llama_server(model_path, work, n_ctx=2048, threads=1) as server:
        yield server


@pytest.fixture(scope="module")
def formats_backend(formats_server: RunningServer) -> Iterator[LlamaServerBackend]:
    with connected_backend(formats_server.url, "formats") as backend:
        yield backend


@pytest.mark.parametrize("name", FAMILIES)
def test_a_named_call_through_llama_server_is_made_and_read_the_way_llama_cpp_does(
    name: str, formats_backend: LlamaServerBackend
) -> None:
    source = llama_chat.template_source(name)
    info = formats_backend.set_template(TemplateOverride("custom", source=source))
    assert formats_backend.capabilities.tools, info
    with tools_given_to_llama_cpp() as given:
        events = list(formats_backend.generate(ASK, GREEDY, None, None, NAMED))
    assert any("forecast" in names for names in given), given
    done = events[-1]
    assert isinstance(done, Finished), events[-3:]
    assert sum(isinstance(e, Finished) for e in events) == 1
    assert_named_call([e for e in events if isinstance(e, Token)], done, name)
