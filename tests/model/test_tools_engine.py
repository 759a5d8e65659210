"""Tool calls on the real engine (issue 29): a forced call is well-formed for its
schema, a template's own tool format or the generic one, nothing in the thinking is a
call, and the follow-up evaluates only the result.

The default model is a base model that calls nothing by itself: calls are forced
with ``tool_choice`` (``required`` or a named tool), which is the grammar at work.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import replace

import pytest

from app.config.setting_records import SamplingParams
from app.engine.backend import CallProgress, Finished, PrefillProgress, Token
from app.engine.chat_message import ChatMessage, ToolCall
from app.engine.local.engine import Engine
from app.engine.templates.override import AUTO, TemplateOverride
from app.engine.tool_spec import NONE, REQUIRED, TOOL_CALLS, ToolRequest
from tests.tool_templates import QWEN_TOOLS, TIME, WEATHER

GREEDY = SamplingParams.greedy(max_tokens=80)
ASK = [ChatMessage("user", "What is the weather in Paris?")]
# R1's shape: the generation prompt opens the block, past thinking is cut at </think>.
THINKING_TOOLS = QWEN_TOOLS.replace(
    "{{- '<|im_start|>assistant\\n' }}{%- endif %}",
    "{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}",
).replace("'\\n' + message.content }}", "'\\n' + message.content.split('</think>')[-1] }}")


@pytest.fixture()
def tools_engine(engine: Engine) -> Iterator[Engine]:
    yield engine
    engine.set_template(AUTO)
    engine.reset()


def run(
    engine: Engine,
    messages: list[ChatMessage],
    params: SamplingParams,
    tools: ToolRequest | None,
    stop_when_read: bool = False,
) -> tuple[list[Token], Finished]:
    stop = threading.Event()
    tokens: list[Token] = []
    done = None
    for event in engine.generate(messages, params, stop, tools=tools):
        if isinstance(event, Token):
            tokens.append(event)
        elif isinstance(event, Finished):
            done = event
        elif stop_when_read and isinstance(event, PrefillProgress) and event.done == event.total:
            stop.set()  # the prompt is read: the reply is stopped before its call ends
    assert done is not None
    assert done.text == "".join(t.text for t in tokens if not t.reasoning)
    return tokens, done


def check_weather(call: ToolCall) -> None:
    assert call.name == "get_weather"
    args = json.loads(call.arguments)
    assert isinstance(args["city"], str) and len(args["city"]) <= 40
    assert args["unit"] in ("celsius", "fahrenheit")
    assert set(args) <= {"city", "unit"}


def test_a_named_choice_makes_the_base_model_call_that_tool(tools_engine: Engine) -> None:
    request = ToolRequest((TIME, WEATHER), choice="get_weather", parallel=False)
    _tokens, done = run(tools_engine, ASK, GREEDY, request)
    assert done.metrics.stop_reason == TOOL_CALLS, done.metrics
    assert len(done.tool_calls) == 1
    check_weather(done.tool_calls[0])
    assert "<tool_call>" not in done.text
    assert tools_engine.model is not None and tools_engine.model.tool_format == "generic"
    # The generic form described the tools in the prompt.
    assert '"get_weather"' in tools_engine._kv.map.text


def test_a_call_being_written_reports_its_progress(tools_engine: Engine) -> None:
    """Each token of a call (held back until the call can be read) is a ``CallProgress``:
    before, nothing came while a call was written, and the window said "writing the
    reply…" for as long as the model wrote (15 minutes for a rambling small model)."""
    request = ToolRequest((TIME, WEATHER), choice="get_weather", parallel=False)
    events = list(tools_engine.generate(ASK, GREEDY, threading.Event(), tools=request))
    done = events[-1]
    assert isinstance(done, Finished) and done.metrics.stop_reason == TOOL_CALLS
    progress = [e for e in events if isinstance(e, CallProgress)]
    assert [p.tokens for p in progress] == list(range(1, len(progress) + 1))
    # Forced from the first token: every token is the call's (the marker's first few are
    # held as a possible marker until it is whole), none is shown as text.
    assert 0 <= done.metrics.generated_tokens - len(progress) <= 8, progress
    assert not any(isinstance(e, Token) and e.text.strip() for e in events)
    chars = [p.chars for p in progress]
    assert chars == sorted(chars) and 0 < chars[-1] <= 4 * len(progress) * 16
    assert json.loads(done.tool_calls[0].arguments)  # and the call was read whole
    assert chars[-1] >= len(done.tool_calls[0].arguments)


def test_required_with_the_template_s_own_format_then_the_follow_up_reads_only_the_result(
    tools_engine: Engine,
) -> None:
    info = tools_engine.set_template(TemplateOverride("custom", source=QWEN_TOOLS))
    assert info.tool_format == "llama.cpp", info  # its own format, read by llama.cpp
    request = ToolRequest((WEATHER, TIME), choice=REQUIRED, parallel=False)
    _tokens, done = run(tools_engine, ASK, GREEDY, request)
    assert done.metrics.stop_reason == TOOL_CALLS
    assert len(done.tool_calls) == 1
    call = done.tool_calls[0]
    assert call.name in ("get_weather", "get_time")
    assert "<tools>" in tools_engine._kv.map.text  # the template's own tool listing
    reply = ChatMessage("assistant", done.text, done.reasoning, done.tool_calls)
    tools_engine.prewarm(ASK, reply)
    result = ChatMessage("tool", '{"temperature": 21, "sky": "clear"}', "", (), call.id, call.name)
    history = [*ASK, reply, result]
    _tokens, follow = run(tools_engine, history, GREEDY, replace(request, choice=NONE))
    new = tools_engine.tokenize(
        '{"temperature": 21, "sky": "clear"}\n</tool_response><|im_end|>\n<|im_start|>assistant\n'
    )
    assert follow.metrics.evaluated_tokens <= len(new), (follow.metrics.evaluated_tokens, len(new))
    assert not follow.tool_calls  # choice "none": nothing is parsed as a call


def test_nothing_in_the_thinking_is_a_call_and_the_call_comes_after_it(
    tools_engine: Engine,
) -> None:
    info = tools_engine.set_template(TemplateOverride("custom", source=THINKING_TOOLS))
    assert info.reasoning is not None and info.tool_format == "llama.cpp"
    params = replace(GREEDY, thinking_budget=10, max_tokens=120)
    request = ToolRequest((WEATHER,), choice=REQUIRED, parallel=False)
    tokens, done = run(tools_engine, ASK, params, request)
    assert done.metrics.thinking_cut == "budget"
    assert done.metrics.reasoning_tokens == 10
    assert done.reasoning and "<tool_call>" not in done.text
    assert len(done.tool_calls) == 1
    check_weather(done.tool_calls[0])
    assert any(t.reasoning for t in tokens)


def test_a_stopped_reply_makes_no_call(tools_engine: Engine) -> None:
    request = ToolRequest((WEATHER,), choice="get_weather")
    _tokens, done = run(tools_engine, ASK, GREEDY, request, stop_when_read=True)
    assert done.metrics.stop_reason == "cancelled"
    assert done.tool_calls == ()


@pytest.mark.parametrize("template", ["generic", "qwen"])
def test_a_call_cut_at_the_token_limit_is_a_note_never_syntax(
    tools_engine: Engine, template: str
) -> None:
    """The reply runs out of tokens inside its call: no call is made, none of its syntax
    is in the answer, and the note says the reply ended inside the call (through the
    generic form's Python parser, and Qwen 2.5's template's through llama.cpp's)."""
    if template == "qwen":
        tools_engine.set_template(TemplateOverride("custom", source=QWEN_TOOLS))
    request = ToolRequest((TIME, WEATHER), choice="get_weather", parallel=False)
    tokens, done = run(tools_engine, ASK, replace(GREEDY, max_tokens=12), request)
    assert done.metrics.stop_reason == "max_tokens" and done.tool_calls == ()
    shown = "".join(t.text for t in tokens)
    assert "<tool_call>" not in shown and "get_weather" not in shown, shown
    assert any("ended inside" in n and "not run" in n for n in done.metrics.notes), done.metrics


def test_tools_with_structured_output_are_refused(tools_engine: Engine) -> None:
    from app.config.field_spec import SettingError

    params = replace(GREEDY, output_format="json")
    with pytest.raises(SettingError):
        run(tools_engine, ASK, params, ToolRequest((WEATHER,), choice=REQUIRED))
