"""llama.cpp's corpus replies through the llama-server backend against a real
llama-server (issue 42): for one case of each template, the backend renders the
template and asks for the case's tools and thinking as a client would, the server is
made to write the case's sample reply exactly (a literal grammar in place of the
format's), and what the backend reads from the stream must be llama.cpp's expectation
(``tests/test-chat.cpp``): content, thinking, calls.

The sample replies are read token by token in-process by
``tests/model/test_chat_corpus_tokens.py``; this runs a handful per family through the
server's streaming, stop strings and preserved tokens, and the backend's own reading."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from app.config.setting_records import SamplingParams
from app.engine.backend import Finished, Token
from app.engine.chat_format.native import NativeFormatter
from app.engine.chat_message import ChatMessage
from app.engine.templates.override import TemplateOverride
from app.engine.tool_spec import ToolRequest, ToolSpec
from app.remote.llama_server.backend import LlamaServerBackend
from tests import llama_chat
from tests.byte_model import byte_model_path
from tests.chat_families import tools_given_to_llama_cpp
from tests.server_fixture import connected_backend, running_llama_server

CASES = llama_chat.one_per_template()
_CHOICE = {0: "auto", 1: "required", 2: "none"}  # common_chat_tool_choice
_GRAMMAR_FIELDS = (
    "grammar",
    "grammar_lazy",
    "grammar_triggers",
    "grammar_type",
    "generation_prompt",
)


@pytest.fixture(scope="module")
def corpus_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServerBackend]:
    # Any model writes a reply a literal grammar dictates; the byte model's 259 tokens
    # make each one cost microseconds (50 ms with the default model's 262k vocabulary).
    work = tmp_path_factory.mktemp("corpus-server")
    with (
        running_llama_server(byte_model_path(), work, n_ctx=8192, threads=1) as server,
        connected_backend(server.url, "corpus") as backend,
    ):
        yield backend


def _writes(reply: str, sent: list[dict[str, Any]]) -> Any:
    """``_body`` with the case's reply as the only thing the server may write (the
    backend's own fields are kept in ``sent`` for the checks)."""
    body = LlamaServerBackend._body

    def literal(self: LlamaServerBackend, prompt: Any, *args: Any) -> dict[str, Any]:
        fields = body(self, prompt, *args)
        sent.append({**fields, "text": prompt.text})
        kept = {k: v for k, v in fields.items() if k not in _GRAMMAR_FIELDS}
        return kept | {"grammar": llama_chat.gbnf_literal(reply)}

    return literal


def _ask(case: dict[str, Any]) -> tuple[list[ChatMessage], SamplingParams, ToolRequest | None]:
    inputs = case["inputs"]
    tools = tuple(
        ToolSpec(f["name"], f.get("description", ""), f.get("parameters") or {})
        for f in (t["function"] for t in inputs["tools"] or [])
    )
    ask = ToolRequest(tools, _CHOICE[inputs["tool_choice"]], inputs["parallel_tool_calls"])
    thinking = "on" if inputs["enable_thinking"] else "off"
    params = replace(SamplingParams.greedy(max_tokens=1024), thinking=thinking)
    return [ChatMessage("user", inputs["messages"][0]["content"])], params, ask if tools else None


def _as_expected(done: Finished, want: dict[str, Any]) -> dict[str, Any]:
    """What the backend read, compared as llama.cpp compares it; a call's id the model did
    not write is the backend's own (llama-server makes one up too), so it is not compared."""
    got = llama_chat.comparable(
        {
            "content": done.text,
            "reasoning_content": done.reasoning,
            "tool_calls": [
                {"function": {"name": c.name, "arguments": c.arguments}, "id": c.id}
                for c in done.tool_calls
            ],
        }
    )
    for call, wanted in zip(got["tool_calls"], want["tool_calls"], strict=False):
        if not wanted["id"]:
            call["id"] = ""
    return got


@pytest.mark.parametrize(("index", "case"), CASES, ids=[llama_chat.case_id(c, i) for i, c in CASES])
def test_a_corpus_reply_written_by_llama_server_is_read_as_llama_cpp_expects(
    index: int,
    case: dict[str, Any],
    corpus_backend: LlamaServerBackend,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source = llama_chat.template_source(case["template"])
    want = llama_chat.comparable(case["expect"])
    if case["inputs"]["reasoning_format"] == "none":  # the backend parses thinking out:
        deepseek = {**case, "inputs": {**case["inputs"], "reasoning_format": "deepseek"}}
        read, _ = llama_chat.read_streamed(NativeFormatter(source), deepseek)
        assert llama_chat.comparable(read) == want  # ... which this case does not change
    corpus_backend.set_template(TemplateOverride("custom", source=source))
    messages, params, ask = _ask(case)
    sent: list[dict[str, Any]] = []
    monkeypatch.setattr(LlamaServerBackend, "_body", _writes(case["input"], sent))
    with tools_given_to_llama_cpp() as given:
        events = list(corpus_backend.generate(messages, params, None, None, ask))
    done = events[-1]
    assert isinstance(done, Finished) and sum(isinstance(e, Finished) for e in events) == 1
    # The backend asked for what the case asked: llama.cpp had the tools and rendered the
    # same generation prompt (the thinking switch) as in its test.
    names = sorted(t.name for t in ask.tools) if ask else []
    assert given and all(sorted(g) == names for g in given), given
    assert sent[0]["text"].endswith(case["result"]["generation_prompt"])
    assert _as_expected(done, want) == want, done.metrics.notes
    shown = "".join(e.text for e in events if isinstance(e, Token) and not e.reasoning)
    assert shown.strip() == want["content"]
