"""Tool calls with a model on another machine: the OpenAI-compatible backend sends the
tools and the history's calls and results, and puts the streamed ``tool_calls`` back
together, bounded; a server that cannot use tools says so. The slow tests ask a real
llama-server (``--jinja``, a template with tools) for a forced call and its follow-up.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.config.setting_records import LoadConfig, SamplingParams
from app.engine.backend import SIZE_LIMIT, Finished, Token
from app.engine.chat_message import ChatMessage, ToolCall
from app.engine.templates.override import TemplateOverride
from app.engine.tool_spec import TOOL_CALLS, ToolRequest, ToolSpec
from app.engine.tools.binding import ToolDecoding
from app.engine.tools.format import HERMES
from app.engine.tools.parser import ToolCallParser
from app.remote.connection import Connection
from app.remote.llama_server.backend import LlamaServerBackend
from app.remote.llama_server.tools import ServerTools
from app.remote.openai.backend import OpenAIBackend
from app.remote.openai.tool_wire import (
    MAX_ARGUMENT_BYTES,
    MAX_CALLS,
    ToolCallStream,
    ToolsRefused,
    tool_fields,
    wire_message,
)
from app.remote.openai.wire import ReplyStream
from tests.e2e.test_remote_openai import chunk, json_response, scripted, sse
from tests.hypothesis_budget import examples
from tests.server_fixture import RunningServer, connected_backend, running_llama_server
from tests.tool_templates import QWEN_TOOLS

WEATHER = ToolSpec(
    "get_weather",
    "The weather in a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
TIME = ToolSpec("get_time", "The time now.", {"type": "object", "properties": {}})
TOOLS = ToolRequest((WEATHER, TIME))
HI = [ChatMessage("user", "What is the weather in Paris?")]
PARAMS = SamplingParams(max_tokens=64)


def call_chunk(
    index: Any = 0, ident: Any = None, name: Any = None, args: Any = None
) -> dict[str, Any]:
    """A chunk carrying one ``delta.tool_calls`` piece (fields left out when None)."""
    fn: dict[str, Any] = {}
    if name is not None:
        fn["name"] = name
    if args is not None:
        fn["arguments"] = args
    piece: dict[str, Any] = {"function": fn}
    if index is not None:
        piece["index"] = index
    if ident is not None:
        piece["id"] = ident
    c = chunk(None)
    c["choices"][0]["delta"] = {"tool_calls": [piece]}
    return c


def run(b: OpenAIBackend, messages: list[ChatMessage], tools: ToolRequest | None) -> Finished:
    events = list(b.generate(messages, PARAMS, None, None, tools))
    done = events[-1]
    assert isinstance(done, Finished) and sum(isinstance(e, Finished) for e in events) == 1
    assert done.text == "".join(e.text for e in events if isinstance(e, Token) and not e.reasoning)
    return done


# -- what is sent --------------------------------------------------------------------


def test_request_fields() -> None:
    assert tool_fields(None) == {} and tool_fields(ToolRequest(())) == {}
    assert tool_fields(TOOLS) == {"tools": [WEATHER.openai(), TIME.openai()]}
    named = tool_fields(ToolRequest((WEATHER,), "get_weather", parallel=False))
    assert named["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert named["parallel_tool_calls"] is False
    assert tool_fields(ToolRequest((WEATHER,), "required"))["tool_choice"] == "required"
    assert tool_fields(ToolRequest((WEATHER,), "none"))["tool_choice"] == "none"
    assert "parallel_tool_calls" not in tool_fields(
        ToolRequest((WEATHER,), parallel=False), {"parallel_tool_calls"}
    )


def test_history_on_the_wire() -> None:
    call = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
    assert wire_message(ChatMessage("assistant", "", tool_calls=(call,))) == {
        "role": "assistant",
        "content": None,
        "tool_calls": [call.openai()],
    }
    assert wire_message(
        ChatMessage("tool", "sunny", tool_call_id="call_1", name="get_weather")
    ) == {
        "role": "tool",
        "content": "sunny",
        "tool_call_id": "call_1",
        "name": "get_weather",
    }
    assert wire_message(ChatMessage("user", "")) == {"role": "user", "content": ""}


# -- a scripted server ----------------------------------------------------------------


def test_streamed_calls_end_the_reply() -> None:
    events = [
        chunk("Let me look."),
        call_chunk(0, "call_a", "get_weather", ""),
        call_chunk(0, args='{"ci'),
        call_chunk(0, args='ty": "Paris"}'),
        call_chunk(1, "call_b", "get_time"),
        chunk(None, "tool_calls"),
    ]
    with scripted() as (server, b):
        assert b.capabilities.tools
        server.script = [sse(events)]
        history = [
            *HI,
            ChatMessage("assistant", "", tool_calls=(ToolCall("c0", "get_time", "{}"),)),
            ChatMessage("tool", "noon", tool_call_id="c0", name="get_time"),
        ]
        done = run(b, history, ToolRequest((WEATHER, TIME), "required", parallel=False))
        body = server.bodies[-1]
    assert done.text == "Let me look."
    assert done.metrics.stop_reason == TOOL_CALLS
    assert done.tool_calls == (
        ToolCall("call_a", "get_weather", '{"city": "Paris"}'),
        ToolCall("call_b", "get_time", "{}"),
    )
    assert body["tools"] == [WEATHER.openai(), TIME.openai()]
    assert body["tool_choice"] == "required" and body["parallel_tool_calls"] is False
    assert body["messages"][1]["tool_calls"][0]["function"]["name"] == "get_time"
    assert body["messages"][2] == {
        "role": "tool",
        "content": "noon",
        "tool_call_id": "c0",
        "name": "get_time",
    }


def test_no_tools_no_fields() -> None:
    with scripted() as (server, b):
        server.script = [sse([chunk("hi"), chunk(None, "stop")])]
        done = run(b, HI, None)
        assert not {"tools", "tool_choice", "parallel_tool_calls"} & set(server.bodies[-1])
    assert done.tool_calls == () and done.metrics.stop_reason == "eos"


def test_a_call_cut_off_is_not_made() -> None:
    events = [call_chunk(0, "c", "get_weather", '{"city": "Par')]
    with scripted() as (server, b):
        server.script = [sse(events, done=False)]
        done = run(b, HI, TOOLS)
    assert done.tool_calls == () and done.metrics.stop_reason == "connection_lost"
    assert any("tool calls were complete" in n for n in done.metrics.notes)


def test_too_many_calls_or_huge_arguments_end_the_reply() -> None:
    many = [call_chunk(i, f"c{i}", "get_time", "{}") for i in range(MAX_CALLS + 3)]
    huge = [call_chunk(0, "c", "get_weather", "x" * 65536) for _ in range(5)]
    for events, words in ((many, "more than 32 tool calls"), (huge, "over 256 KiB")):
        with scripted() as (server, b):
            server.script = [sse([chunk("a"), *events, chunk(None, "tool_calls")])]
            done = run(b, HI, TOOLS)
        assert done.tool_calls == () and done.metrics.stop_reason == SIZE_LIMIT
        assert done.text == "a"
        assert any(words in n and "No call was made" in n for n in done.metrics.notes)


def test_a_whole_message_with_calls() -> None:
    message = {
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "x", "type": "function", "function": {"name": "get_time"}},
                        {
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": {"city": "Oslo"}},
                        },
                    ],
                },
            }
        ]
    }
    with scripted() as (server, b):
        server.script = [sse([message])]
        done = run(b, HI, TOOLS)
    assert [(c.name, c.argument_object()) for c in done.tool_calls] == [
        ("get_time", {}),
        ("get_weather", {"city": "Oslo"}),
    ]
    assert done.tool_calls[0].id == "x" and done.tool_calls[1].id.startswith("call_")
    assert done.metrics.stop_reason == TOOL_CALLS


def test_a_server_that_cannot_use_tools() -> None:
    ok = sse([chunk("fine"), chunk(None, "stop")])
    with scripted() as (server, b):
        # llama-server without --jinja
        no_jinja = {"error": {"code": 400, "message": "tools param requires --jinja flag"}}
        server.script = [json_response(400, no_jinja), ok]
        with pytest.raises(ToolsRefused, match="cannot use tools with this model"):
            run(b, HI, TOOLS)
        # Ollama: a model without tool support
        server.script = [json_response(400, {"error": "gemma:2b does not support tools"}), ok]
        with pytest.raises(ToolsRefused, match="does not support tools"):
            run(b, HI, TOOLS)
        # The same error without tools is not about tools: the server's words as they are.
        server.script = [json_response(400, {"error": "bad request"}), ok]
        with pytest.raises(Exception, match="bad request") as info:
            run(b, HI, None)
        assert not isinstance(info.value, ToolsRefused)
        # A server that knows tools but not parallel_tool_calls: asked again without it.
        server.bodies.clear()
        unsupported = {"error": {"message": "Unsupported parameter: 'parallel_tool_calls'"}}
        server.script = [json_response(400, unsupported), ok]
        done = run(b, HI, ToolRequest((WEATHER,), parallel=False))
        assert "parallel_tool_calls" in server.bodies[0]
        assert "parallel_tool_calls" not in server.bodies[1] and "tools" in server.bodies[1]
        assert done.text == "fine"
        assert any("parallel_tool_calls" in n for n in done.metrics.notes)


# -- the stream, fuzzed -------------------------------------------------------------

FUZZ = settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
ARGS = st.dictionaries(
    st.text(max_size=8), st.text(max_size=12) | st.integers() | st.booleans(), max_size=4
)


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


@FUZZ
@given(
    calls=st.lists(st.tuples(st.sampled_from(["get_weather", "get_time"]), ARGS), max_size=4),
    cuts=st.lists(st.integers(0, 10_000), max_size=8),
    ids=st.booleans(),
)
def test_calls_split_anywhere_come_back_whole(
    calls: list[tuple[str, dict[str, Any]]], cuts: list[int], ids: bool
) -> None:
    events: list[Any] = []
    for i, (name, args) in enumerate(calls):
        text = json.dumps(args)
        pieces = split(text, cuts)
        events.append(call_chunk(i, f"id{i}" if ids else None, name, pieces[0]))
        events += [call_chunk(i, args=p) for p in pieces[1:]]
    reply = ReplyStream()
    for e in [*events, chunk(None, "tool_calls")]:
        reply.feed(e)
    got = reply.tools.calls()
    assert [(c.name, json.loads(c.arguments)) for c in got] == calls
    assert len({c.id for c in got}) == len(got)
    if ids:
        assert [c.id for c in got] == [f"id{i}" for i in range(len(calls))]


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
HOSTILE_PIECE = st.fixed_dictionaries(
    {},
    optional={
        "index": st.integers(-3, 40) | JSON_VALUES,
        "id": st.text(max_size=300) | JSON_VALUES,
        "function": st.fixed_dictionaries(
            {},
            optional={
                "name": st.text(max_size=300) | JSON_VALUES,
                "arguments": st.text(max_size=50) | JSON_VALUES,
            },
        )
        | JSON_VALUES,
    },
)


@settings(max_examples=examples(300), deadline=None)
@given(pieces=st.lists(st.lists(HOSTILE_PIECE, max_size=5) | JSON_VALUES, max_size=8))
def test_hostile_pieces_never_raise(pieces: list[Any]) -> None:
    stream = ToolCallStream()
    for p in pieces:
        stream.feed(p)
    calls = stream.calls()
    assert len(calls) <= MAX_CALLS
    for c in calls:
        assert c.name and len(c.name) <= 256 and c.id and len(c.id) <= 256
        assert len(c.arguments.encode()) <= MAX_ARGUMENT_BYTES
        c.argument_object()


def test_bounds_of_the_stream() -> None:
    stream = ToolCallStream()
    stream.feed([{"index": i, "function": {"name": "f"}} for i in range(MAX_CALLS)])
    assert not stream.over and len(stream.calls()) == MAX_CALLS
    stream.feed([{"index": MAX_CALLS, "function": {"name": "f"}}])
    assert "more than 32" in stream.problem
    stream = ToolCallStream()
    rng = random.Random(1)
    piece = "".join(rng.choice("ab{}") for _ in range(4096))
    for _ in range(MAX_ARGUMENT_BYTES // 4096):
        stream.feed([{"index": 0, "function": {"name": "f", "arguments": piece}}])
    assert not stream.over
    stream.feed([{"index": 0, "function": {"arguments": "x"}}])
    assert "256 KiB" in stream.problem


# -- a real llama-server ---------------------------------------------------------------


@pytest.fixture(scope="module")
def tool_server(
    model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    """A llama-server that renders chats with a Qwen 2.5 template (tools in the system
    turn, ``<tool_call>`` blocks) and parses the calls itself (``--jinja``)."""
    work = tmp_path_factory.mktemp("tool-server")
    template = work / "qwen2.5-tools.jinja"
    template.write_text(QWEN_TOOLS, encoding="utf-8")
    extra = ["--jinja", "--chat-template-file", str(template)]
    with running_llama_server(model_path, work, n_ctx=2048, threads=1, extra=extra) as server:
        yield server


def test_real_server_takes_tools_calls_and_results(tool_server: RunningServer) -> None:
    """Through /v1 the server renders and parses. This llama-server takes no named
    ``tool_choice`` (it warns and lets the model choose) and its ``required`` grammar
    allows text before the call, so the base model is not made to call here (the
    native path below is); what is checked: the tools reach the template, a history
    with a call and its result is taken and answered, and the missed choice is noted."""
    conn = Connection("tools", "tool server", "openai", tool_server.url + "/v1", "")
    b = OpenAIBackend(conn)
    b.load("", LoadConfig())
    try:
        greedy = SamplingParams(max_tokens=8, temperature=0.0, seed=1)
        plain = run(b, HI, None)
        forced = run(b, HI, ToolRequest((WEATHER, TIME), "get_weather"))
        assert forced.metrics.prompt_tokens > plain.metrics.prompt_tokens + 50
        if not forced.tool_calls:
            assert any("did not make the call to get_weather" in n for n in forced.metrics.notes)
        call = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
        history = [
            *HI,
            ChatMessage("assistant", "", tool_calls=(call,)),
            ChatMessage("tool", "Sunny, 21 C.", tool_call_id=call.id, name=call.name),
        ]
        events = list(b.generate(history, greedy, None, None, TOOLS))
        last = events[-1]
        assert isinstance(last, Finished) and last.metrics.stop_reason in ("eos", "max_tokens")
        assert last.metrics.prompt_tokens > forced.metrics.prompt_tokens
    finally:
        b.unload()


# -- llama-server's native API: this app's template, grammar and parser -------------------


def hermes_tools(tools: ToolRequest) -> ServerTools:
    server_tools = ServerTools(tools, lambda _t: False)
    parser = ToolCallParser(HERMES, [t.name for t in tools.tools])
    server_tools.decoding = ToolDecoding(parser, None)
    return server_tools


def replay(events: list[Any]) -> Iterator[Any]:
    yield from events


@pytest.mark.parametrize("reason", ["eos", "cancelled", "connection_lost"])
def test_calls_parsed_from_the_answer_text_only(reason: str) -> None:
    from app.engine.metrics import MessageMetrics

    call = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    events = [
        Token("<tool_call>not a call</tool_call>", reasoning=True),
        Token("Sure. "),
        *[Token(call[i : i + 5]) for i in range(0, len(call), 5)],
        Finished("", MessageMetrics(stop_reason=reason), "thought"),
    ]
    out = list(hermes_tools(TOOLS).parse(replay(events)))  # type: ignore[arg-type]
    done = out[-1]
    assert isinstance(done, Finished) and done.reasoning == "thought"
    assert done.text == "".join(e.text for e in out if isinstance(e, Token) and not e.reasoning)
    assert "<tool_call>not a call" in "".join(e.text for e in out if isinstance(e, Token))
    if reason == "eos":
        assert done.text.strip() == "Sure."
        assert [c.name for c in done.tool_calls] == ["get_time"]
        assert done.metrics.stop_reason == TOOL_CALLS
    else:
        assert done.tool_calls == () and done.metrics.stop_reason == reason


def test_no_tools_pass_through() -> None:
    from app.engine.metrics import MessageMetrics

    events = [Token("<tool_call>x"), Finished("<tool_call>x", MessageMetrics(stop_reason="eos"))]
    out = list(ServerTools(None, lambda _t: False).parse(replay(events)))  # type: ignore[arg-type]
    assert out == events


@pytest.fixture()
def server_backend(tool_server: RunningServer) -> Iterator[LlamaServerBackend]:
    with connected_backend(tool_server.url, "tools") as backend:
        backend.set_template(TemplateOverride("custom", source=QWEN_TOOLS))
        assert backend.capabilities.tools and backend.model is not None
        assert backend.model.tool_format == "llama.cpp"
        yield backend


def test_llama_server_forced_call_then_only_the_result_is_read(
    server_backend: LlamaServerBackend,
) -> None:
    greedy = SamplingParams(max_tokens=48, temperature=0.0, seed=1)
    forced = ToolRequest((WEATHER, TIME), "get_weather")
    events = list(server_backend.generate(HI, greedy, None, None, forced))
    done = events[-1]
    assert isinstance(done, Finished), events[-3:]
    assert done.metrics.stop_reason == TOOL_CALLS, (done.metrics.notes, done.text)
    call = done.tool_calls[0]
    assert call.name == "get_weather" and isinstance(json.loads(call.arguments), dict)
    history = [
        *HI,
        ChatMessage("assistant", done.text, tool_calls=(call,)),
        ChatMessage("tool", "Sunny, 21 C.", tool_call_id=call.id, name=call.name),
    ]
    follow = list(
        server_backend.generate(history, greedy, None, None, replace(forced, choice="auto"))
    )
    last = follow[-1]
    assert isinstance(last, Finished), follow[-3:]
    assert last.metrics.stop_reason in ("eos", "max_tokens", TOOL_CALLS)
    # The tools and the first prompt stay in the slot: the follow-up reads little more
    # than the re-rendered call and the result.
    m = last.metrics
    assert m.cached_tokens >= done.metrics.prompt_tokens - 1, (m.cached_tokens, m.evaluated_tokens)
    assert m.evaluated_tokens < m.prompt_tokens - done.metrics.prompt_tokens + 8
