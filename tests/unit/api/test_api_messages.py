"""Anthropic's Messages API (issue 46) over the scripted gateway, through the official
``anthropic`` SDK: a message, a stream read by the SDK's own accumulator (thinking,
text, a tool call), a tool round trip, stop sequences, ``count_tokens``, the
``x-api-key`` header, and errors in Anthropic's shape; bodies the parser refuses name
the field; any body is read or refused with a 400 (Hypothesis)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import anthropic
import httpx2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.api.errors import ApiError
from app.api.messages_schema import parse_messages
from app.engine.backend import Capabilities
from app.engine.chat_message import ToolCall
from tests.conftest import Serve
from tests.fakes.gateway import FakeGateway
from tests.hypothesis_budget import examples

MODEL = "gemma-3-270m-it-Q4_K_M"
ASK: Any = [{"role": "user", "content": "When is high water?"}]
WEATHER: Any = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def client(url: str, key: str = "none") -> anthropic.Anthropic:
    base = url.removesuffix("/v1")
    return anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=10)


def test_a_message_is_answered_in_anthropics_shape(serve: Serve) -> None:
    server, gw = serve()
    reply = client(server.url).messages.create(
        model="claude-via-lamplight",
        max_tokens=64,
        system=[{"type": "text", "text": "Be brief."}],
        messages=ASK,
        metadata={"user_id": "agent-1"},
        output_config={"effort": "xhigh"},
        extra_body={"temperature": 0.2, "top_k": 20},  # older clients send them
    )
    assert reply.type == "message" and reply.role == "assistant" and reply.id.startswith("msg_")
    assert reply.model == "gemma-3-270m-it-q4_k_m" or reply.model.startswith("gemma")
    assert [b.type for b in reply.content] == ["text"]
    assert reply.content[0].text == "Hello there, friend."  # type: ignore[union-attr]
    assert reply.stop_reason == "end_turn" and reply.stop_sequence is None
    u = reply.usage
    assert u.input_tokens + (u.cache_read_input_tokens or 0) > 0 and u.output_tokens == 5
    job = gw.submitted[-1]
    assert [(m.role, m.content) for m in job.messages] == [
        ("system", "Be brief."),
        ("user", "When is high water?"),
    ]
    assert job.params.max_tokens == 64 and job.params.top_k == 20 and job.client == "agent-1"
    assert job.params.reasoning_effort == "high" and job.params.temperature == 0.2


def tooled(gw: FakeGateway) -> None:
    """The fake's model calls tools."""
    assert gw.info is not None
    gw.info = dataclasses.replace(gw.info, capabilities=Capabilities(tools=True))


def test_a_stream_reads_back_whole_through_the_sdks_accumulator(serve: Serve) -> None:
    server, gw = serve()
    tooled(gw)
    gw.thinking = ["Tides", " first."]
    gw.tool_calls = (ToolCall("toolu_1", "get_weather", '{"city": "Brest"}'),)
    with client(server.url).messages.stream(
        model=MODEL,
        max_tokens=64,
        messages=ASK,
        tools=[WEATHER],
        thinking={"type": "enabled", "budget_tokens": 1024},
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert [b.type for b in final.content] == ["thinking", "text", "tool_use"]
    assert final.content[0].thinking == "Tides first."  # type: ignore[union-attr]
    assert final.content[1].text == "Hello there, friend."  # type: ignore[union-attr]
    call = final.content[2]
    assert call.type == "tool_use" and call.id == "toolu_1" and call.input == {"city": "Brest"}
    assert final.stop_reason == "tool_use" and final.usage.output_tokens == 7
    job = gw.submitted[-1]
    assert job.params.thinking == "on" and job.params.thinking_budget == 1024
    assert job.tools is not None and job.tools.tools[0].name == "get_weather"


def test_a_tool_round_trip_sends_the_call_and_its_result_back(serve: Serve) -> None:
    server, gw = serve()
    tooled(gw)
    history: Any = [
        *ASK,
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Ask the tool.", "signature": ""},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"a": 1}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny."},
                {"type": "text", "text": "And tomorrow?"},
            ],
        },
    ]
    client(server.url).messages.create(
        model=MODEL, max_tokens=16, messages=history, tools=[WEATHER], tool_choice={"type": "any"}
    )
    job = gw.submitted[-1]
    roles = [m.role for m in job.messages]
    assert roles == ["user", "assistant", "tool", "user"]
    said = job.messages[1]
    assert said.reasoning == "Ask the tool." and said.tool_calls[0].argument_object() == {"a": 1}
    result = job.messages[2]
    assert result.tool_call_id == "toolu_1" and result.name == "get_weather"
    assert job.tools is not None and job.tools.choice == "required"


def test_a_stop_sequence_is_named_when_it_was_the_requests(serve: Serve) -> None:
    server, gw = serve()
    gw.stop_reason, gw.stop_match = "stop_string", "\n\nHuman:"
    reply = client(server.url).messages.create(
        model=MODEL, max_tokens=16, messages=ASK, stop_sequences=["\n\nHuman:"]
    )
    assert reply.stop_reason == "stop_sequence" and reply.stop_sequence == "\n\nHuman:"
    gw.stop_match = "<end_of_turn>"  # the template's own: an ordinary end
    reply = client(server.url).messages.create(
        model=MODEL, max_tokens=16, messages=ASK, stop_sequences=["\n\nHuman:"]
    )
    assert reply.stop_reason == "end_turn" and reply.stop_sequence is None


def test_count_tokens_counts_on_the_engine_side(serve: Serve) -> None:
    server, gw = serve()
    counted = client(server.url).messages.count_tokens(
        model=MODEL, messages=ASK, system="Be brief."
    )
    assert counted.input_tokens == (2 + 2) + (4 + 2)  # the fake's words-and-framing count
    assert not gw.submitted  # no reply was asked for


def test_the_key_goes_in_x_api_key_and_errors_are_anthropics(serve: Serve) -> None:
    server, _gw = serve(api_key="sekrit")
    assert client(server.url, "sekrit").messages.create(model=MODEL, max_tokens=8, messages=ASK)
    with pytest.raises(anthropic.AuthenticationError) as denied:
        client(server.url, "wrong").messages.create(model=MODEL, max_tokens=8, messages=ASK)
    assert denied.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as bad:
        client(server.url, "sekrit").messages.create(model=MODEL, max_tokens=0, messages=ASK)
    body: Any = bad.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"]
    raw = httpx2.post(
        f"{server.url}/messages",
        content=b"{not json",
        headers={"x-api-key": "sekrit", "content-type": "application/json"},
        timeout=10,
    )
    assert raw.status_code == 400 and raw.json()["type"] == "error"


def test_a_failure_in_a_stream_is_an_error_event(serve: Serve) -> None:
    from app.api.gateway import ApiFailure

    server, gw = serve()
    gw.fail, gw.fail_after = ApiFailure(500, "server_error", "engine_error", "It broke."), 2
    stream = client(server.url).messages.stream(model=MODEL, max_tokens=16, messages=ASK)
    with pytest.raises(anthropic.APIStatusError) as broke, stream as events:
        for _ in events:
            pass
    assert "It broke." in str(broke.value)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"messages": ASK}, "max_tokens"),
        ({"max_tokens": 8}, "messages"),
        ({"max_tokens": 8, "messages": [{"role": "system", "content": "x"}]}, "messages[0]"),
        ({"max_tokens": 8, "messages": ASK, "thinking": {"type": "enabled"}}, "thinking"),
        ({"max_tokens": 8, "messages": ASK, "tool_choice": {"type": "some"}}, "tool_choice"),
        ({"max_tokens": 8, "messages": ASK, "tools": [{"type": "web_search_20250305"}]}, "tools"),
        ({"max_tokens": 8, "messages": ASK, "stop_sequences": "x"}, "stop_sequences"),
        ({"max_tokens": 8, "messages": ASK, "mcp_servers": [{"url": "x"}]}, "mcp_servers"),
        (
            {
                "max_tokens": 8,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image", "source": {"type": "url", "url": "x"}}],
                    }
                ],
            },
            "messages[0].content[0]",
        ),
        (
            {
                "max_tokens": 8,
                "messages": [
                    {"role": "user", "content": [{"type": "tool_result", "content": "x"}]}
                ],
            },
            "messages[0].content[0]",
        ),
    ],
)
def test_a_refused_body_names_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(ApiError) as err:
        parse_messages(body)
    assert err.value.status == 400 and (err.value.param or "").startswith(field), err.value


def test_a_result_without_its_call_is_refused() -> None:
    body = {
        "max_tokens": 8,
        "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t9"}]}],
    }
    with pytest.raises(ApiError) as err:
        parse_messages(body)
    assert "t9" in str(err.value)


KEYS = st.sampled_from(
    [
        "role",
        "content",
        "type",
        "text",
        "tool_use_id",
        "id",
        "name",
        "input",
        "source",
        "thinking",
        "input_schema",
        "budget_tokens",
        "user",
        "assistant",
        "tool_use",
        "image",
    ]
)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | KEYS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=24,
)


@settings(max_examples=examples(300), deadline=None)
@given(JSON)
def test_any_json_is_read_or_refused_with_a_400(value: object) -> None:
    bodies = (
        value,
        {"max_tokens": 8, "messages": value},
        {"max_tokens": 8, "messages": [{"role": "user", "content": value}]},
        {"max_tokens": 8, "messages": ASK, "tools": value, "system": value},
        {"max_tokens": 8, "messages": ASK, "tool_choice": value, "thinking": value},
    )
    for body in bodies:
        try:
            parse_messages(json.loads(json.dumps(body)))
        except ApiError as err:
            assert err.status == 400
