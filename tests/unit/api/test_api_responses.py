"""OpenAI's Responses API (issue 46) over the scripted gateway, through the official
``openai`` SDK's ``responses``: create, a stream read by the SDK's own accumulator
(reasoning, text, a function call), ``previous_response_id`` going on from a stored
response (its items sent to the model, nothing sent again by the client), a function
call's output, retrieve and delete, another key's responses out of reach, ``store:
false``; bodies the parser refuses name the field; any input is read or refused with a
400 (Hypothesis)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.api.errors import ApiError
from app.api.responses_schema import parse_responses
from app.engine.backend import Capabilities
from app.engine.chat_message import ToolCall
from tests.conftest import Serve
from tests.fakes.gateway import FakeGateway
from tests.hypothesis_budget import examples

MODEL = "gemma-3-270m-it-Q4_K_M"
WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def client(url: str, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=10)


def storing(gw: FakeGateway, folder: Path) -> None:
    gw.responses = folder
    assert gw.info is not None
    gw.info = dataclasses.replace(gw.info, capabilities=Capabilities(tools=True))


def test_a_response_and_the_next_one_going_on_from_it(serve: Serve, tmp_path: Path) -> None:
    server, gw = serve()
    storing(gw, tmp_path / "responses")
    c = client(server.url)
    first = c.responses.create(
        model=MODEL, instructions="Be brief.", input="When is high water?", max_output_tokens=32
    )
    assert first.id.startswith("resp_") and first.status == "completed"
    assert first.output_text == "Hello there, friend."
    assert first.usage is not None and first.usage.output_tokens == 5
    job = gw.submitted[-1]
    assert [(m.role, m.content) for m in job.messages] == [
        ("system", "Be brief."),
        ("user", "When is high water?"),
    ]
    assert job.params.max_tokens == 32
    second = c.responses.create(model=MODEL, input="And low water?", previous_response_id=first.id)
    assert second.previous_response_id == first.id
    # The stored items go first; the instructions are not carried over (as OpenAI does).
    assert [(m.role, m.content) for m in gw.submitted[-1].messages] == [
        ("user", "When is high water?"),
        ("assistant", "Hello there, friend."),
        ("user", "And low water?"),
    ]
    assert c.responses.retrieve(first.id).output_text == "Hello there, friend."
    deleted = c.responses.delete(first.id)
    assert deleted is None or getattr(deleted, "deleted", True)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError) as gone:
        c.responses.create(model=MODEL, input="Again?", previous_response_id=first.id)
    assert gone.value.code == "response_not_found"


def test_a_stream_reads_back_whole_through_the_sdks_accumulator(
    serve: Serve, tmp_path: Path
) -> None:
    server, gw = serve()
    storing(gw, tmp_path / "responses")
    gw.thinking = ["Tides", " first."]
    gw.tool_calls = (ToolCall("call_1", "get_weather", '{"city": "Brest"}'),)
    with client(server.url).responses.stream(
        model=MODEL, input="Weather in Brest?", tools=[WEATHER], reasoning={"effort": "low"}
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [o.type for o in final.output] == ["reasoning", "message", "function_call"]
    assert final.output_text == "Hello there, friend."
    call = final.output[2]
    assert call.type == "function_call" and call.call_id == "call_1"
    assert json.loads(call.arguments) == {"city": "Brest"}
    assert gw.submitted[-1].params.reasoning_effort == "low"
    # The call's output goes on from the stored response.
    gw.tool_calls = ()
    client(server.url).responses.create(
        model=MODEL,
        previous_response_id=final.id,
        input=[{"type": "function_call_output", "call_id": "call_1", "output": "Sunny."}],
        tools=[WEATHER],
    )
    sent = gw.submitted[-1].messages
    assert [m.role for m in sent] == ["user", "assistant", "tool"]
    assert sent[1].reasoning == "Tides first." and sent[1].tool_calls[0].name == "get_weather"
    assert sent[2].content == "Sunny." and sent[2].name == "get_weather"


def test_another_key_and_store_false_reach_nothing(serve: Serve, tmp_path: Path) -> None:
    folder = tmp_path / "responses"
    server, gw = serve(api_key="alice")
    storing(gw, folder)
    mine = client(server.url, "alice").responses.create(model=MODEL, input="Hi")
    unstored = client(server.url, "alice").responses.create(model=MODEL, input="Hi", store=False)
    assert unstored.store is False
    other, gw2 = serve(api_key="bob")
    storing(gw2, folder)  # the same folder, another key
    with pytest.raises(openai.NotFoundError):
        client(other.url, "bob").responses.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        client(other.url, "bob").responses.delete(mine.id)
    with pytest.raises(openai.NotFoundError):
        client(server.url, "alice").responses.retrieve(unstored.id)
    assert client(server.url, "alice").responses.retrieve(mine.id).id == mine.id


def test_a_failure_in_a_stream_raises_in_the_sdk(serve: Serve) -> None:
    from app.api.gateway import ApiFailure

    server, gw = serve()
    gw.fail, gw.fail_after = ApiFailure(500, "server_error", "engine_error", "It broke."), 2
    stream = client(server.url).responses.stream(model=MODEL, input="Hi")
    with pytest.raises(openai.APIError) as broke, stream as events:
        for _ in events:
            pass
    assert "It broke." in str(broke.value)


def test_a_reply_cut_at_its_limit_is_incomplete(serve: Serve) -> None:
    server, _gw = serve()
    reply = client(server.url).responses.create(model=MODEL, input="Hi", max_output_tokens=2)
    assert reply.status == "incomplete" and reply.incomplete_details is not None
    assert reply.incomplete_details.reason == "max_output_tokens"


def test_truncation_auto_drops_the_oldest_turns_and_is_echoed(serve: Serve) -> None:
    server, gw = serve()
    auto = client(server.url).responses.create(model=MODEL, input="Hi", truncation="auto")
    assert auto.truncation == "auto" and gw.submitted[-1].params.overflow == "rolling"
    plain = client(server.url).responses.create(model=MODEL, input="Hi")
    assert plain.truncation == "disabled" and gw.submitted[-1].params.overflow == "stop"


def test_an_input_too_long_names_input_and_the_way_on(serve: Serve) -> None:
    from app.api.gateway import ApiFailure

    server, gw = serve()
    gw.fail = ApiFailure(
        400, "invalid_request_error", "context_length_exceeded", "Too long.", "messages"
    )
    with pytest.raises(openai.BadRequestError) as err:
        client(server.url).responses.create(model=MODEL, input="Hi")
    assert err.value.code == "context_length_exceeded" and err.value.param == "input"
    assert '"truncation": "auto"' in err.value.message


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "input"),
        ({"input": []}, "input"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": "x", "previous_response_id": "nope"}, "previous_response_id"),
        ({"input": "x", "max_output_tokens": -1}, "max_output_tokens"),
        ({"input": "x", "background": True}, "background"),
        ({"input": "x", "store": "yes"}, "store"),
        ({"input": "x", "metadata": {"k": 1}}, "metadata"),
        ({"input": "x", "truncation": "middle"}, "truncation"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input[0].content[0]",
        ),
        (
            {"input": [{"type": "function_call_output", "call_id": "c9", "output": "x"}]},
            "input[0].tool_call_id",
        ),
    ],
)
def test_a_refused_body_names_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(ApiError) as err:
        parse_responses(body)
    assert err.value.status == 400
    assert (err.value.param or "").replace("messages", "input").startswith(field), err.value


KEYS = st.sampled_from(
    [
        "role",
        "content",
        "type",
        "text",
        "call_id",
        "name",
        "arguments",
        "output",
        "summary",
        "user",
        "assistant",
        "message",
        "function_call",
        "function_call_output",
        "input_text",
    ]
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8) | KEYS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=24,
)


@settings(max_examples=examples(300), deadline=None)
@given(JSON)
def test_any_input_is_read_or_refused_with_a_400(value: object) -> None:
    for body in (value, {"input": value}, {"input": [value]}, {"input": "x", "tools": value}):
        try:
            parse_responses(json.loads(json.dumps(body)))
        except ApiError as err:
            assert err.status == 400
