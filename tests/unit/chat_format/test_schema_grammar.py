"""JSON schema to grammar as llama.cpp converts it: its own test cases
(tests/test-json-schema-to-grammar.cpp, dumped as data), numeric bounds included."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.engine.native.chat_shim import ChatShim, ShimError
from tests import llama_chat

CASES = llama_chat.schema_cases()


@pytest.mark.parametrize("case", CASES, ids=[c["title"] for c in CASES])
def test_each_schema_gives_llama_cpps_grammar(case: dict[str, Any], shim: ChatShim) -> None:
    try:
        grammar = shim.schema_to_grammar(json.loads(case["schema"]))
    except (ShimError, ValueError):
        assert not case["ok"]
        return
    assert case["ok"]
    assert llama_chat.grammar_trim(grammar) == llama_chat.grammar_trim(case["grammar"])


def test_a_schema_over_the_limit_is_refused_in_a_sentence(shim: ChatShim) -> None:
    big = {"type": "object", "description": "x" * 70_000}
    with pytest.raises(ShimError, match="too large"):
        shim.schema_to_grammar(big)
