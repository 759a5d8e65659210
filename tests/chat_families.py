"""The corpus families asked for a named call on a real model, in-process and through a
real llama-server (issue 42): one tool whose integer field has bounds, one distractor,
and a question whose honest answer breaks the bounds."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pytest

from app.config.setting_records import SamplingParams
from app.engine.backend import Finished, Token
from app.engine.chat_format.native import ChatRequest, NativeFormatter
from app.engine.chat_message import ChatMessage
from app.engine.tool_spec import TOOL_CALLS, ToolRequest, ToolSpec

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
NAMED = ToolRequest((DAYS, OTHER), choice="forecast", parallel=False)
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


# llama.cpp's Gemma 4 grammar takes any dict as a call's arguments (``tool-NAME ::= "NAME"
# gemma4-dict``): its calls are made and read, their schema is not held.
FREE_ARGUMENTS = frozenset({"google-gemma-4-31B-it.jinja"})


def assert_named_call(tokens: list[Token], done: Finished, template: str = "") -> None:
    """The reply is the one named call, in bounds, and none of its syntax was shown."""
    assert done.metrics.stop_reason == TOOL_CALLS, (done.text, done.metrics.notes)
    (call,) = done.tool_calls
    args = json.loads(call.arguments)
    assert call.name == "forecast" and isinstance(args, dict)
    if template not in FREE_ARGUMENTS:
        assert 1 <= args["days"] <= 7  # the schema's bounds (the Python grammar lost them)
    shown = "".join(t.text for t in tokens)
    for marker in ("<tool_call>", "[TOOL_CALLS]", "<function", "forecast"):
        assert marker not in shown, shown  # the call's syntax never reaches the answer


@contextmanager
def tools_given_to_llama_cpp() -> Iterator[list[list[str]]]:
    """The tool names of each request llama.cpp formatted meanwhile: a family's own call
    syntax, not the generic form the prompt would otherwise ask for."""
    seen: list[list[str]] = []
    apply = NativeFormatter.apply

    def spy(self: NativeFormatter, request: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(request, ChatRequest):
            seen.append([(t.get("function") or {}).get("name", "") for t in request.tools])
        return apply(self, request, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(NativeFormatter, "apply", spy)
        yield seen
