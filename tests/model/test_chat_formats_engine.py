"""Real templates of llama.cpp's corpus on the real engine: llama.cpp renders the prompt,
its grammar makes the call, its parser reads it (issue 42). Families whose call syntax
the Python port misdetected (GLM, Seed-OSS, Apriel) or never parsed (DeepSeek V3.1) are
among them; the numeric bounds of a schema hold."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import replace

import pytest

from app.config.setting_records import SamplingParams
from app.engine.backend import Finished, Token
from app.engine.chat_message import ChatMessage
from app.engine.local.engine import Engine
from app.engine.templates.override import AUTO, TemplateOverride
from app.engine.tool_spec import ToolRequest, ToolSpec
from tests import llama_chat

DAYS = ToolSpec(
    "forecast",
    "The weather in Oslo for the next days.",
    {
        "type": "object",
        # No string: llama.cpp's XML formats (Qwen3.5, Seed-OSS) take a string parameter
        # as free text up to its close tag, which a base model never writes.
        "properties": {"days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["days"],
    },
)
OTHER = ToolSpec("get_time", "The time now.", {"type": "object", "properties": {}})
ASK = [ChatMessage("user", "What will the weather be in Oslo for the next 1600 days?")]
# Thinking off: a base model never ends a thinking block by itself.
GREEDY = replace(SamplingParams.greedy(max_tokens=96), thinking="off")
FAMILIES = (
    "Qwen3.5-4B.jinja",
    "Qwen-Qwen2.5-7B-Instruct.jinja",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    "meta-llama-Llama-3.1-8B-Instruct.jinja",
    "deepseek-ai-DeepSeek-V3.1.jinja",
    "GLM-4.6.jinja",
    "ByteDance-Seed-OSS.jinja",
    "unsloth-Apriel-1.5.jinja",
    "google-gemma-4-31B-it.jinja",
)


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
    request = ToolRequest((DAYS, OTHER), choice="forecast", parallel=False)
    tokens, done = _run(formats_engine, request)
    assert done.metrics.stop_reason == "tool_calls", (done.text, done.metrics.notes)
    (call,) = done.tool_calls
    args = json.loads(call.arguments)
    assert call.name == "forecast"
    assert 1 <= args["days"] <= 7  # the schema's bounds hold (the Python grammar lost them)
    shown = "".join(t.text for t in tokens)
    for marker in ("<tool_call>", "[TOOL_CALLS]", "<function", "forecast"):
        assert marker not in shown, shown  # the call's syntax never reaches the answer
