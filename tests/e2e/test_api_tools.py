"""Tool calling through the local API: ``tools`` / ``tool_choice`` / ``tool_calls`` /
``tool`` messages checked (good, bad, hostile, fuzzed), the wire shape with the official
``openai`` client's tool-calling flow over a scripted FakeGateway (fast), and the real
default model forced to call a named tool (slow)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.api.errors import ApiError
from app.api.runner import ApiServer
from app.api.schema import parse_chat
from app.api.tool_schema import MAX_TOOLS, MAX_TOOLS_BYTES, MAX_TOOLS_DEPTH, deeper_than
from app.engine.backend import Capabilities
from app.engine.chat_message import ChatMessage, ToolCall
from app.engine.tool_spec import ToolRequest, ToolSpec
from tests.conftest import Serve
from tests.fakes.gateway import FakeGateway
from tests.hypothesis_budget import examples
from tests.serve_fixture import Served, running

MODEL = "gemma-3-270m-it-Q4_K_M"
WEATHER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"],
}
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather forecast for a city.",
        "parameters": WEATHER_SCHEMA,
    },
}
CLOCK: Any = {"type": "function", "function": {"name": "clock"}}
USER: Any = [{"role": "user", "content": "Weather in Paris?"}]
CALL = ToolCall("call_1", "get_weather", '{"city":"Paris"}')


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": USER, **fields}


def history(**result: Any) -> Any:
    """A user turn, an assistant turn that called get_weather, and its result."""
    return [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [CALL.openai()]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C", **result},
    ]


# -- the request: tools and tool_choice ------------------------------------------------


def test_tools_become_a_tool_request() -> None:
    req = parse_chat(chat(tools=[WEATHER, CLOCK]))
    assert req.tools == ToolRequest(
        (
            ToolSpec("get_weather", "The weather forecast for a city.", WEATHER_SCHEMA),
            ToolSpec("clock"),
        )
    )
    assert req.tools.active and req.tools.tools[1].openai()["function"]["parameters"] == {
        "type": "object",
        "properties": {},
    }
    named = {"type": "function", "function": {"name": "clock"}}
    for choice, want in (("auto", "auto"), ("none", "none"), ("required", "required")):
        got = parse_chat(chat(tools=[WEATHER], tool_choice=choice)).tools
        assert got is not None and got.choice == want
    forced = parse_chat(chat(tools=[WEATHER, CLOCK], tool_choice=named, parallel_tool_calls=False))
    assert forced.tools == ToolRequest(req.tools.tools, "clock", parallel=False)
    # No tools: nothing to offer ("none" and empty lists are what clients send by default).
    fields: dict[str, Any]
    for fields in (
        {},
        {"tools": []},
        {"tool_choice": "none"},
        {"functions": []},
        {"function_call": "none"},
        {"functions": None, "function_call": None},
    ):
        assert parse_chat(chat(**fields)).tools is None
    # A client that sends `tool_choice` alone is told how the common clients leave it out.
    with pytest.raises(ApiError, match=r"NOT_GIVEN.*bind_tools") as err:
        parse_chat(chat(tool_choice="auto"))
    assert err.value.param == "tool_choice"


REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"tools": WEATHER}, "tools"),
    ({"tools": ["get_weather"]}, "tools[0]"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tools": [{"type": "function"}]}, "tools[0].function"),
    ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "x" * 65}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "a.b"}}]}, "tools[0].function.name"),
    ({"tools": [{"function": {"name": "f", "parameters": []}}]}, "tools[0].function.parameters"),
    (
        {"tools": [{"function": {"name": "f", "parameters": {"type": "string"}}}]},
        "tools[0].function.parameters",
    ),
    ({"tools": [{"function": {"name": "f", "description": 5}}]}, "tools[0].function"),
    ({"tools": [CLOCK, CLOCK]}, "tools[1].function.name"),
    ({"tools": [CLOCK] * (MAX_TOOLS + 1)}, "tools"),
    ({"tools": [WEATHER], "tool_choice": "any"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": 1}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {}}}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "clock"}}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"function": {"name": "clock"}}}, "tool_choice"),
    (
        {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "clock"}}},
        "tool_choice",
    ),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [], "tool_choice": "auto"}, "tool_choice"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"function_call": "auto"}, "function_call"),
    # Values that are not "nothing" in their own field's type: not honoured, so refused.
    ({"function_call": []}, "function_call"),
    ({"function_call": {}}, "function_call"),
    ({"functions": "none"}, "functions"),
    ({"functions": {}}, "functions"),
]


def test_tool_refusals_name_their_param() -> None:
    for fields, param in REFUSED:
        with pytest.raises(ApiError) as err:
            parse_chat(chat(**fields))
        e = err.value
        assert (e.status, e.param) == (400, param), fields
        assert e.message and e.code in ("invalid_value", "unsupported_parameter"), fields


def test_hostile_tools_are_bounded() -> None:
    deep: Any = {"type": "string"}
    for _ in range(MAX_TOOLS_DEPTH):
        deep = {"type": "object", "properties": {"x": deep}}
    fn = {"type": "function", "function": {"name": "deep", "parameters": deep}}
    with pytest.raises(ApiError, match="nested more than"):
        parse_chat(chat(tools=[fn]))
    big = {"name": "big", "description": "x" * MAX_TOOLS_BYTES}
    with pytest.raises(ApiError, match="bytes of JSON") as err:
        parse_chat(chat(tools=[{"type": "function", "function": big}]))
    assert err.value.param == "tools"
    # The bounds leave room for real tool sets: 128 tools of a few KB each.
    fine = [
        {"type": "function", "function": {**WEATHER["function"], "name": f"t{i}"}}
        for i in range(MAX_TOOLS)
    ]
    assert len(parse_chat(chat(tools=fine)).tools.tools) == MAX_TOOLS  # type: ignore[union-attr]
    # The depth check is iterative: any depth measures without recursion.
    nested: Any = []
    for _ in range(100_000):
        nested = [nested]
    assert deeper_than(nested, 32) and not deeper_than([[{"a": 1}]], 3)


# -- the request: tool calls and results in the history --------------------------------


def test_calls_and_results_in_the_history() -> None:
    msgs = parse_chat(chat(messages=history(), tools=[WEATHER])).messages
    assert msgs[1] == ChatMessage("assistant", "", tool_calls=(CALL,))
    # The result's tool name comes from its call when the client leaves it out.
    assert msgs[2] == ChatMessage("tool", "Sunny, 21 C", tool_call_id="call_1", name="get_weather")
    # Text parts; a name given is kept; arguments sent as an object, or empty, are text.
    parts = [{"type": "text", "text": "Sunny"}, {"type": "text", "text": ", 21 C"}]
    msgs = parse_chat(chat(messages=history(content=parts, name="weather"))).messages
    assert (msgs[2].content, msgs[2].name) == ("Sunny, 21 C", "weather")
    calls = [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": {"x": [1]}}},
        {"id": "b", "function": {"name": "g", "arguments": ""}},
    ]
    sent = [*USER, {"role": "assistant", "content": "Let me see.", "tool_calls": calls}]
    msg = parse_chat(chat(messages=sent)).messages[1]
    assert msg.content == "Let me see."
    assert msg.tool_calls == (ToolCall("a", "f", '{"x": [1]}'), ToolCall("b", "g", "{}"))
    assert msg.tool_calls[0].argument_object() == {"x": [1]}


def msgs_with(**changes: Any) -> list[dict[str, Any]]:
    h = history()
    h[1] = {**h[1], **changes.get("call", {})}
    h[2] = {**h[2], **changes.get("result", {})}
    return [m for m in h if m]


REFUSED_MESSAGES: list[tuple[list[Any], str]] = [
    (msgs_with(result={"tool_call_id": "call_2"}), "messages[2].tool_call_id"),
    (msgs_with(result={"tool_call_id": None}), "messages[2].tool_call_id"),
    (msgs_with(result={"tool_call_id": 7}), "messages[2].tool_call_id"),
    (msgs_with(result={"tool_call_id": "x" * 300}), "messages[2].tool_call_id"),
    (msgs_with(result={"name": 5}), "messages[2].name"),
    (msgs_with(result={"content": 5}), "messages[2].content"),
    (msgs_with(result={"content": [{"type": "image_url"}]}), "messages[2].content[0]"),
    (msgs_with(call={"tool_calls": "call_1"}), "messages[1].tool_calls"),
    (msgs_with(call={"tool_calls": [CALL.openai()] * 129}), "messages[1].tool_calls"),
    (msgs_with(call={"tool_calls": [{"id": "", "function": {}}]}), "messages[1].tool_calls[0].id"),
    (
        msgs_with(call={"tool_calls": [{"id": "c", "type": "custom", "function": {}}]}),
        "messages[1].tool_calls[0]",
    ),
    (
        msgs_with(call={"tool_calls": [{"id": "c", "function": {"name": 3}}]}),
        "messages[1].tool_calls[0].function.name",
    ),
    (
        msgs_with(call={"tool_calls": [{"id": "c", "function": {"name": "f", "arguments": 3}}]}),
        "messages[1].tool_calls[0].function",
    ),
    (msgs_with(call={"function_call": {"name": "f"}}), "messages[1].function_call"),
    ([{"role": "user", "content": "x", "tool_calls": [CALL.openai()]}], "messages[0].tool_calls"),
    ([{"role": "function", "name": "f", "content": "x"}], "messages[0].role"),
]


def test_history_refusals_name_their_param() -> None:
    for messages, param in REFUSED_MESSAGES:
        with pytest.raises(ApiError) as err:
            parse_chat(chat(messages=messages))
        assert (err.value.status, err.value.param) == (400, param), messages


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=16,
)
NAMES = st.sampled_from(["get_weather", "clock", "f", "a b", ""]) | JSON
FUNCTION = st.fixed_dictionaries(
    {},
    optional={
        "name": NAMES,
        "description": st.text(max_size=8) | JSON,
        "parameters": st.just(WEATHER_SCHEMA) | JSON,
        "arguments": st.just('{"city": "x"}') | JSON,
    },
)
TOOL = st.fixed_dictionaries(
    {}, optional={"type": st.just("function") | JSON, "function": FUNCTION | JSON}
)
CHOICE = st.sampled_from(["auto", "none", "required", "get_weather"]) | st.builds(
    lambda f: {"type": "function", "function": f}, FUNCTION
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool", "function"]) | JSON},
    optional={
        "content": st.none() | st.text(max_size=8) | JSON,
        "tool_calls": st.lists(
            st.fixed_dictionaries(
                {}, optional={"id": st.sampled_from(["call_1", "c"]) | JSON, "function": FUNCTION}
            )
            | JSON,
            max_size=3,
        )
        | JSON,
        "tool_call_id": st.sampled_from(["call_1", "c", ""]) | JSON,
        "name": NAMES,
    },
)
BODY = st.fixed_dictionaries(
    {"messages": st.lists(MESSAGE, min_size=1, max_size=4) | JSON},
    optional={
        "tools": st.lists(TOOL, max_size=3) | JSON,
        "tool_choice": CHOICE | JSON,
        "parallel_tool_calls": st.booleans() | JSON,
        "functions": JSON,
        "function_call": JSON,
    },
)


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=BODY)
def test_any_tool_json_raises_only_api_error(body: dict[str, Any]) -> None:
    try:
        req = parse_chat(body)
    except ApiError as exc:
        assert exc.status == 400 and exc.message
        json.dumps(exc.body())
    else:
        # The legacy fields pass only when they ask for nothing.
        assert body.get("functions") in (None, [])
        assert body.get("function_call") in (None, "none")
        called = {c.id for m in req.messages for c in m.tool_calls}
        for m in req.messages:
            assert m.role != "tool" or (m.tool_call_id in called and m.name)
        if req.tools is not None:
            names = [t.name for t in req.tools.tools]
            assert len(set(names)) == len(names) and req.tools.tools
            assert req.tools.choice in ("auto", "none", "required", *names)


# -- over HTTP, with the openai client ----------------------------------------------------


def tool_server(serve: Serve, tools: bool = True) -> tuple[ApiServer, FakeGateway]:
    server, gw = serve()
    assert gw.info is not None
    why = {"tools": "this server was started without tool calling"}
    gw.info = replace(gw.info, capabilities=Capabilities(tools=tools, why_not=why))
    gw.tool_calls = (CALL, ToolCall("call_2", "clock", "{}"))
    return server, gw


def client(server: ApiServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=10)


def test_tool_calling_flow(serve: Serve) -> None:
    server, gw = tool_server(serve)
    gw.tokens = []
    c = client(server)
    messages: list[Any] = list(USER)
    reply = c.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER, CLOCK], tool_choice="auto"
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls or []
    assert [(t.id, t.type) for t in calls] == [("call_1", "function"), ("call_2", "function")]
    assert [(t.function.name, t.function.arguments) for t in calls] == [  # type: ignore[union-attr]
        ("get_weather", '{"city":"Paris"}'),
        ("clock", "{}"),
    ]
    job = gw.submitted[-1]
    assert job.tools is not None and job.tools.choice == "auto" and job.tools.parallel
    assert [t.name for t in job.tools.tools] == ["get_weather", "clock"]

    # The follow-up: the assistant's turn as the client got it, then each result.
    messages.append(choice.message.model_dump(exclude_none=True))
    for t in calls:
        messages.append({"role": "tool", "tool_call_id": t.id, "content": f"result of {t.id}"})
    gw.tokens = ["Sunny", "."]
    answer = c.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER, CLOCK])
    assert answer.choices[0].finish_reason == "stop"
    assert answer.choices[0].message.content == "Sunny."
    assert answer.choices[0].message.tool_calls is None
    sent = gw.submitted[-1].messages
    assert sent[1] == ChatMessage("assistant", "", tool_calls=gw.tool_calls)
    assert sent[2:] == [
        ChatMessage("tool", "result of call_1", tool_call_id="call_1", name="get_weather"),
        ChatMessage("tool", "result of call_2", tool_call_id="call_2", name="clock"),
    ]
    status = httpx2.get(server.url.removesuffix("/v1") + "/lamplight/status").json()
    assert [o["finish"] for o in status["recent"]] == ["tool_calls", "stop"]


def test_named_choice_and_text_before_the_calls(serve: Serve) -> None:
    server, gw = tool_server(serve)
    gw.tool_calls = (CALL,)
    named: Any = {"type": "function", "function": {"name": "get_weather"}}
    reply = client(server).chat.completions.create(
        model=MODEL,
        messages=USER,
        tools=[WEATHER, CLOCK],
        tool_choice=named,
        parallel_tool_calls=False,
    )
    message = reply.choices[0].message
    assert message.content == "Hello there, friend."
    assert message.tool_calls and message.tool_calls[0].id == "call_1"
    assert reply.choices[0].finish_reason == "tool_calls"
    tools = gw.submitted[-1].tools
    assert tools is not None and (tools.choice, tools.parallel) == ("get_weather", False)


def test_streamed_tool_calls(serve: Serve) -> None:
    server, _ = tool_server(serve)
    c = client(server)
    chunks = list(
        c.chat.completions.create(
            model=MODEL,
            messages=USER,
            tools=[WEATHER, CLOCK],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == "Hello there, friend."
    deltas = [d for ch in chunks if ch.choices for d in ch.choices[0].delta.tool_calls or []]
    assert [(d.index, d.id, d.function.name) for d in deltas] == [  # type: ignore[union-attr]
        (0, "call_1", "get_weather"),
        (1, "call_2", "clock"),
    ]
    assert chunks[-2].choices[0].finish_reason == "tool_calls"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    # The SDK's own accumulator puts the calls back together.
    with c.chat.completions.stream(model=MODEL, messages=USER, tools=[WEATHER, CLOCK]) as s:
        final = s.get_final_completion()
    message = final.choices[0].message
    assert final.choices[0].finish_reason == "tool_calls"
    assert [(t.id, t.function.name, t.function.arguments) for t in message.tool_calls or []] == [
        ("call_1", "get_weather", '{"city":"Paris"}'),
        ("call_2", "clock", "{}"),
    ]


def test_tools_refused_where_the_model_has_none(serve: Serve) -> None:
    server, gw = tool_server(serve, tools=False)
    c = client(server)
    with pytest.raises(openai.BadRequestError) as err:
        c.chat.completions.create(model=MODEL, messages=USER, tools=[WEATHER])
    assert (err.value.code, err.value.param) == ("unsupported_parameter", "tools")
    assert "started without tool calling" in err.value.message
    assert gw.submitted == []
    # Tools it may not call are dropped: nothing is asked of the backend.
    reply = c.chat.completions.create(
        model=MODEL, messages=USER, tools=[WEATHER], tool_choice="none"
    )
    assert reply.choices[0].finish_reason == "stop" and gw.submitted[-1].tools is None


def test_bad_tool_requests_over_http(serve: Serve) -> None:
    server, gw = tool_server(serve)
    c = client(server)
    named: Any = {"type": "function", "function": {"name": "nope"}}
    with pytest.raises(openai.BadRequestError) as err:
        c.chat.completions.create(model=MODEL, messages=USER, tools=[WEATHER], tool_choice=named)
    assert err.value.param == "tool_choice"
    with pytest.raises(openai.BadRequestError) as err:
        c.chat.completions.create(model=MODEL, messages=history(tool_call_id="call_9"))
    assert err.value.param == "messages[2].tool_call_id"
    assert gw.submitted == []


# -- the real model (slow) ---------------------------------------------------------------


@pytest.fixture(scope="module")
def served(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    args = ["--port", "0", "--threads", "1", "--n-ctx", "2048", "--model", str(model_path)]
    with running(tmp_path_factory.mktemp("serve"), args) as s:
        yield s


def test_real_model_calls_the_named_tool(served: Served) -> None:
    """gemma3 270M (a base model: the generic tool format) forced by a named
    ``tool_choice`` returns a valid call: the grammar makes its arguments fit the schema."""
    c = openai.OpenAI(base_url=served.url, api_key="x", max_retries=0, timeout=300)
    named: Any = {"type": "function", "function": {"name": "get_weather"}}
    common: dict[str, Any] = {
        "model": served.model,
        "messages": USER,
        "tools": [WEATHER, CLOCK],
        "tool_choice": named,
        "temperature": 0,
        "max_tokens": 128,
    }
    reply = c.chat.completions.create(**common)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls or []
    assert len(calls) >= 1 and all(t.function.name == "get_weather" for t in calls)
    arguments = json.loads(calls[0].function.arguments)
    assert isinstance(arguments, dict) and isinstance(arguments.get("city"), str)
    assert set(arguments) <= {"city", "days"}
    assert "days" not in arguments or isinstance(arguments["days"], int)
    # Streamed, the same call comes back together with the SDK's accumulator.
    with c.chat.completions.stream(**common) as s:
        final = s.get_final_completion()
    assert final.choices[0].finish_reason == "tool_calls"
    streamed = final.choices[0].message.tool_calls or []
    assert [t.function.arguments for t in streamed] == [t.function.arguments for t in calls]
    # The follow-up with the result is answered as text.
    follow: Any = [
        *USER,
        choice.message.model_dump(exclude_none=True),
        *({"role": "tool", "tool_call_id": t.id, "content": "Sunny, 21 C"} for t in calls),
    ]
    answer = c.chat.completions.create(
        model=served.model, messages=follow, tools=[WEATHER], temperature=0, max_tokens=16
    )
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")
