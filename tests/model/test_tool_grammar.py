"""Tool-call grammars (app/engine/tools/grammar.py): they parse in llama.cpp, accept the
calls the parser reads, and arm only outside thinking."""
# ruff: noqa: E501 - model outputs are quoted whole

from __future__ import annotations

import ctypes
import math
from collections.abc import Iterator
from typing import Any

import llama_cpp
import pytest

from app.engine.native.handles import Native
from app.engine.tool_spec import ToolRequest, ToolSpec
from app.engine.tools.format import FAMILIES
from app.engine.tools.grammar import ToolGrammar, tool_grammar
from app.engine.tools.parser import parse_calls
from tests.marked_model import marked_model_path
from tests.native import llama

WEATHER = ToolSpec(
    "get_weather",
    "Weather for a city",
    {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
)
ODD = ToolSpec('odd"name\\x', "", {"type": "object", "properties": {"a": {"$ref": "#/missing"}}})
HUGE = ToolSpec(
    "huge", "", {"type": "object", "properties": {"s": {"type": "string", "maxLength": 10**9}}}
)
TOOLS = (WEATHER, ODD, HUGE)

# A good call per family (what the grammar allows; the parser reads it back).
GOOD = {
    "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>',
    "generic": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "qwen3_coder": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
    "llama3": '{"name": "get_weather", "parameters": {"city": "Paris"}}',
    "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abc123def"}]',
    "gpt_oss": '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}',
    "deepseek": '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
}


@pytest.fixture(scope="module")
def vocab_llm() -> Iterator[Any]:
    """gemma's vocabulary with the families' markers as control tokens, as their models
    have them (DeepSeek's ``<｜tool▁sep｜>`` would otherwise be read with "▁" a space)."""
    llm = llama(marked_model_path(), vocab_only=True, verbose=False)
    yield llm
    llm.close()


class _Sampler:
    """A grammar sampler driven token by token, asking it whether each token is allowed."""

    def __init__(self, llm: Any, g: ToolGrammar) -> None:
        self.llm, self.vocab = llm, Native(llm).vocab
        pats = (ctypes.c_char_p * max(1, len(g.patterns)))(*[p.encode() for p in g.patterns])
        if g.lazy:
            self.s = llama_cpp.llama_sampler_init_grammar_lazy_patterns(
                self.vocab, g.gbnf.encode(), b"root", pats, len(g.patterns), None, 0
            )
        else:
            self.s = llama_cpp.llama_sampler_init_grammar(self.vocab, g.gbnf.encode(), b"root")
        assert self.s, g.gbnf

    def allowed(self, token: int) -> bool:
        data = (llama_cpp.llama_token_data * 1)(llama_cpp.llama_token_data(token, 1.0, 0.0))
        arr = llama_cpp.llama_token_data_array(data, 1, -1, False)
        llama_cpp.llama_sampler_apply(self.s, ctypes.byref(arr))
        return not math.isinf(data[0].logit)

    def feed(self, text: str) -> bool:
        """Whether every token of ``text`` was allowed (stops at the first refused)."""
        for tok in self.llm.tokenize(text.encode(), add_bos=False, special=True):
            if not self.allowed(tok):
                return False
            llama_cpp.llama_sampler_accept(self.s, tok)
        return True

    def may_end(self) -> bool:
        return self.allowed(self.llm.token_eos())

    def close(self) -> None:
        llama_cpp.llama_sampler_free(self.s)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("choice", ["auto", "required", "get_weather"])
@pytest.mark.parametrize(
    ("close", "inside"), [("", False), ("</think>", True), ("</think>", False)]
)
def test_every_grammar_parses_in_llama_cpp(
    vocab_llm: Any, family: str, choice: str, close: str, inside: bool
) -> None:
    g = tool_grammar(
        FAMILIES[family], ToolRequest(TOOLS, choice), close, inside, "<think>" if close else ""
    )
    assert g is not None
    _Sampler(vocab_llm, g).close()
    if choice != "auto":
        assert g.lazy == bool(close and inside)


def test_none_and_no_tools_give_no_grammar() -> None:
    assert tool_grammar(FAMILIES["hermes"], ToolRequest(TOOLS, "none")) is None
    assert tool_grammar(FAMILIES["hermes"], ToolRequest(())) is None


@pytest.mark.parametrize("family", sorted(GOOD))
def test_forced_grammar_accepts_a_good_call_the_parser_reads(vocab_llm: Any, family: str) -> None:
    fmt = FAMILIES[family]
    g = tool_grammar(fmt, ToolRequest(TOOLS, "get_weather"))
    assert g is not None and not g.lazy
    s = _Sampler(vocab_llm, g)
    assert s.feed(GOOD[family]) and s.may_end()
    s.close()
    _, calls, problems = parse_calls(fmt, GOOD[family], ["get_weather"])
    assert [c.name for c in calls] == ["get_weather"] and not problems


def test_forced_grammar_refuses_a_bad_call(vocab_llm: Any) -> None:
    g = tool_grammar(FAMILIES["hermes"], ToolRequest(TOOLS, "get_weather"))
    assert g is not None
    s = _Sampler(vocab_llm, g)
    assert not s.feed('<tool_call>\n{"name": "get_weather", "arguments": {"town": 1}}')
    s.close()


def test_parallel_calls_stop_at_the_cap(vocab_llm: Any) -> None:
    from app.engine.tools.grammar import MAX_PARALLEL

    g = tool_grammar(FAMILIES["hermes"], ToolRequest(TOOLS, "get_weather", parallel=True))
    assert g is not None
    s = _Sampler(vocab_llm, g)
    call = GOOD["hermes"].strip() + "\n"
    assert s.feed(call * MAX_PARALLEL) and s.may_end()
    assert not s.feed("<tool_call>")  # one more is refused: the model must end its turn
    s.close()


def test_auto_grammar_waits_for_the_marker_then_constrains(vocab_llm: Any) -> None:
    g = tool_grammar(FAMILIES["hermes"], ToolRequest(TOOLS))
    assert g is not None and g.lazy
    s = _Sampler(vocab_llm, g)
    assert s.feed("Let me check {not json} the weather. ")
    assert s.feed(GOOD["hermes"]) and s.may_end()
    s.close()
    s = _Sampler(vocab_llm, g)
    assert not s.feed('Sure <tool_call>\n{"name": "nope"')
    s.close()


def test_marker_inside_thinking_does_not_arm(vocab_llm: Any) -> None:
    fmt = FAMILIES["hermes"]
    for inside, lead in ((True, ""), (False, "<think>")):
        g = tool_grammar(fmt, ToolRequest(TOOLS), "</think>", inside, "<think>")
        assert g is not None and g.tokens == ()
        s = _Sampler(vocab_llm, g)
        assert s.feed(lead + 'maybe <tool_call>{"name": "nope", bad json</think>\n\nOk. ')
        assert s.feed(GOOD["hermes"])  # armed now: only a good call passes
        assert not s.feed('<tool_call>{"bad')
        s.close()


def test_required_with_thinking_arms_at_the_close_marker(vocab_llm: Any) -> None:
    g = tool_grammar(FAMILIES["hermes"], ToolRequest(TOOLS, "required"), "</think>", True)
    assert g is not None and g.lazy
    s = _Sampler(vocab_llm, g)
    assert s.feed("I think, freely: anything {[<tool_call>.")
    assert not s.feed("</think>\n\nHello")
    s.close()
    s = _Sampler(vocab_llm, g)
    assert s.feed("hmm</think>\n" + GOOD["hermes"]) and s.may_end()
    s.close()


def test_llama3_triggers() -> None:
    g = tool_grammar(
        FAMILIES["llama3"].__class__(
            **{**FAMILIES["llama3"].__dict__, "marker_tokens": ("<|python_tag|>",)}
        ),
        ToolRequest(TOOLS),
    )
    assert g is not None and g.tokens == ("<|python_tag|>",)
    assert g.patterns[0] == r"^\s*(\{)"


def test_real_model_named_call_parses(loaded_engine: Any) -> None:
    """Sampling the real model under the forced grammar yields a call the parser reads."""
    llm = loaded_engine.llama
    fmt = FAMILIES["generic"]
    g = tool_grammar(fmt, ToolRequest((WEATHER,), "get_weather"))
    assert g is not None
    grammar = llama_cpp.LlamaGrammar.from_string(g.gbnf, verbose=False)
    out = llm.create_completion(
        "Call the weather tool for Paris.\n", max_tokens=96, grammar=grammar, temperature=0.0
    )
    text = out["choices"][0]["text"]
    _, calls, problems = parse_calls(fmt, text, ["get_weather"])
    assert [c.name for c in calls] == ["get_weather"], (text, problems)
