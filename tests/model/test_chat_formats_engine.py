"""Real templates of llama.cpp's corpus on the real engine: llama.cpp renders the prompt,
its grammar makes the call, its parser reads it (issue 42). Families whose call syntax
the Python port misdetected (GLM, Seed-OSS, Apriel) or never parsed (DeepSeek V3.1) are
among them; the numeric bounds of a schema hold."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from app.engine.backend import Finished, Token
from app.engine.local.engine import Engine
from app.engine.local.vocab import Vocab
from app.engine.templates.override import AUTO, TemplateOverride
from app.engine.tool_spec import ToolRequest
from tests import llama_chat
from tests.chat_families import (
    ASK,
    FAMILIES,
    GREEDY,
    NAMED,
    assert_named_call,
    tools_given_to_llama_cpp,
)
from tests.conftest import TEST_LOAD
from tests.marked_model import GEMMA_VOCAB, marked_model_path

# Families whose call markers are control tokens in their models' vocabularies.
# (Not a family with a free string in its call, Command R7B's "tool_call_id": the marked
# model, whose markers outscore "<" everywhere, fills a free string with them.)
CONTROL_FAMILIES = (
    "deepseek-ai-DeepSeek-V3.1.jinja",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja",
)


@pytest.fixture(scope="module")
def marked_engine() -> Iterator[Engine]:
    """gemma with the markers as control tokens (``tests/marked_model.py``)."""
    engine = Engine()
    engine.load(marked_model_path(), TEST_LOAD)
    yield engine
    engine.unload()


@pytest.fixture()
def formats_engine(engine: Engine) -> Iterator[Engine]:
    yield engine
    engine.set_template(AUTO)
    engine.reset()


def _run(engine: Engine, request: ToolRequest) -> tuple[list[Token], Finished]:
    tokens: list[Token] = []
    done = None
    for event in engine.generate(ASK, GREEDY, threading.Event(), tools=request):
        if isinstance(event, Token):
            tokens.append(event)
        elif isinstance(event, Finished):
            done = event
    assert done is not None
    return tokens, done


@pytest.mark.parametrize("name", FAMILIES)
def test_a_named_call_is_made_and_read_the_way_llama_cpp_does(
    name: str, formats_engine: Engine
) -> None:
    source = llama_chat.template_source(name)
    formats_engine.set_template(TemplateOverride("custom", source=source))
    assert formats_engine.template is not None and formats_engine.template.native is not None
    with tools_given_to_llama_cpp() as given:
        tokens, done = _run(formats_engine, NAMED)
    assert any("forecast" in names for names in given), given
    assert_named_call(tokens, done, name)


@pytest.mark.parametrize("name", CONTROL_FAMILIES)
def test_call_markers_made_as_control_tokens_reach_the_parser_only(
    name: str, marked_engine: Engine
) -> None:
    """The grammar makes the model write each marker as its one control token; the
    engine gives the parser their text (llama.cpp would write none) and shows none."""
    marked_engine.set_template(TemplateOverride("custom", source=llama_chat.template_source(name)))
    pieces: list[tuple[int, bool]] = []
    piece = Vocab.piece

    def spy(self: Vocab, token: int, special: bool = False) -> bytes:
        pieces.append((token, special))
        return piece(self, token, special)

    try:
        with tools_given_to_llama_cpp() as given, pytest.MonkeyPatch.context() as patch:
            patch.setattr(Vocab, "piece", spy)
            tokens, done = _run(marked_engine, NAMED)
    finally:
        marked_engine.set_template(AUTO)
        marked_engine.reset()
    assert any("forecast" in names for names in given), given
    assert_named_call(tokens, done, name)
    # The call's markers were written as the marked model's control tokens, as text.
    assert any(t >= GEMMA_VOCAB and special for t, special in pieces), pieces
