"""The API for agents on the real model (issue 46). Anthropic's Messages API through
the official ``anthropic`` SDK: against ``lamplight serve`` a message, a stream read by the SDK's
accumulator, ``count_tokens`` equal to the prompt the reply read, and a second turn
reading only its new tokens; with Qwen 2.5's tool template that opens a thinking block
(``--chat-template-file``), a forced call comes back as a ``tool_use`` block, its ``tool_result``
is read, and the answer's thinking is a ``thinking`` block. OpenAI's Responses API
through the ``openai`` SDK: a response going on from a stored one reads only its new
input, a forced function call and its output round trip, and an input longer than the
context is refused or, with ``truncation: "auto"``, cut to fit."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from tests.serve_fixture import Served, running

SYSTEM = "You answer questions about the harbour in one short sentence."
QUESTION = "When is high water at the north pier, and which berth is free?"
WEATHER: Any = {
    "name": "get_weather",
    "description": "The current weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
    },
}


@pytest.fixture(scope="module")
def served(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    args = ["--port", "0", "--threads", "1", "--n-ctx", "2048", "--model", str(model_path)]
    with running(tmp_path_factory.mktemp("serve"), args) as s:
        yield s


def client(root: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=root, api_key="none", max_retries=0, timeout=300)


def test_messages_count_tokens_and_a_second_turn_on_the_real_model(served: Served) -> None:
    c = client(served.root)
    history: Any = [{"role": "user", "content": QUESTION}]
    counted = c.messages.count_tokens(model=served.model, system=SYSTEM, messages=history)
    first = c.messages.create(model=served.model, max_tokens=12, system=SYSTEM, messages=history)
    u = first.usage
    # The count is the prompt the reply read: what it evaluated and what the cache held.
    assert counted.input_tokens == u.input_tokens + (u.cache_read_input_tokens or 0)
    assert first.stop_reason in ("end_turn", "max_tokens") and 0 < u.output_tokens <= 12
    text = "".join(b.text for b in first.content if b.type == "text")
    history += [
        {"role": "assistant", "content": text},
        {"role": "user", "content": "And the south pier?"},
    ]
    with c.messages.stream(
        model=served.model, max_tokens=12, system=SYSTEM, messages=history
    ) as stream:
        kinds = {event.type for event in stream}
        second = stream.get_final_message()
    assert {"message_start", "content_block_delta", "message_delta", "message_stop"} <= kinds
    v = second.usage
    assert (v.cache_read_input_tokens or 0) >= counted.input_tokens  # the first turn, cached
    assert v.input_tokens <= 24, v  # the new question (and the turn's framing)
    assert second.content and second.content[0].type == "text"


@pytest.fixture(scope="module")
def thinking_served(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``lamplight serve`` over the default model with a tool template that thinks, given
    with ``--chat-template-file``."""
    from tests.model.test_tools_engine import THINKING_TOOLS

    root = tmp_path_factory.mktemp("thinking-serve")
    template = root / "thinking-tools.jinja"
    template.write_text(THINKING_TOOLS, encoding="utf-8")
    args = ["--port", "0", "--threads", "1", "--n-ctx", "2048", "--model", str(model_path)]
    with running(root / "data", [*args, "--chat-template-file", str(template)]) as s:
        yield s


def test_a_forced_tool_use_its_result_and_thinking_on_the_real_model(
    thinking_served: Served,
) -> None:
    c, model = client(thinking_served.root), thinking_served.model
    ask: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
    thinking: Any = {"type": "enabled", "budget_tokens": 8}
    # Greedy (the SDK has no `temperature` now): a sampled reply may close its thinking at once.
    called = c.messages.create(
        model=model,
        max_tokens=120,
        extra_body={"temperature": 0},
        messages=ask,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        thinking=thinking,
    )
    assert called.stop_reason == "tool_use"
    kinds = [b.type for b in called.content]
    # Blank text between the thinking and the call ("\n\n") is kept as the model said it:
    # sent back, it keeps the cached prefix, so the next request reads only what is new.
    assert kinds[0] == "thinking" and kinds[-1] == "tool_use" and kinds.count("tool_use") == 1
    assert all(b.text.strip() == "" for b in called.content if b.type == "text"), kinds
    use = called.content[-1]
    assert use.type == "tool_use" and use.name == "get_weather"
    assert isinstance(use.input, dict) and isinstance(use.input.get("city"), str)
    history: Any = [
        *ask,
        {"role": "assistant", "content": [b.model_dump() for b in called.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 21 C"}],
        },
    ]
    with c.messages.stream(
        model=model,
        max_tokens=30,
        extra_body={"temperature": 0},
        messages=history,
        tools=[WEATHER],
        tool_choice={"type": "none"},
        thinking=thinking,
    ) as stream:
        answer = stream.get_final_message()
    assert [b.type for b in answer.content][:1] == ["thinking"]
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert answer.usage.output_tokens_details is not None
    assert answer.usage.output_tokens_details.thinking_tokens == 8  # the budget, never more
    # The result is all the follow-up read: the call was in the cache.
    assert answer.usage.input_tokens <= 40, answer.usage


def test_responses_go_on_from_a_stored_one_reading_only_the_new_input(served: Served) -> None:
    c = openai.OpenAI(base_url=served.url, api_key="none", max_retries=0, timeout=300)
    first = c.responses.create(
        model=served.model, instructions=SYSTEM, input=QUESTION, max_output_tokens=12
    )
    assert first.status in ("completed", "incomplete") and first.output_text
    with c.responses.stream(
        model=served.model,
        instructions=SYSTEM,
        input="And the south pier?",
        previous_response_id=first.id,
        max_output_tokens=12,
    ) as stream:
        kinds, second = [], None
        for event in stream:
            kinds.append(event.type)
            if event.type in ("response.completed", "response.incomplete"):
                second = event.response  # the SDK's final response needs "completed"
    assert second is not None
    assert kinds[0] == "response.created" and "response.output_text.delta" in kinds
    u = second.usage
    assert u is not None and u.input_tokens_details.cached_tokens >= first.usage.input_tokens  # type: ignore[union-attr]
    assert u.input_tokens - u.input_tokens_details.cached_tokens <= 24, u  # the new input
    assert c.responses.retrieve(second.id).output_text == second.output_text
    c.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(first.id)


def test_a_forced_function_call_and_its_output_through_responses(
    thinking_served: Served,
) -> None:
    base, model = thinking_served.url, thinking_served.model
    c = openai.OpenAI(base_url=base, api_key="none", max_retries=0, timeout=300)
    tool: Any = {
        "type": "function",
        "name": "get_weather",
        "description": WEATHER["description"],
        "parameters": WEATHER["input_schema"],
    }
    called = c.responses.create(
        model=model,
        input="What is the weather in Paris?",
        tools=[tool],
        tool_choice={"type": "function", "name": "get_weather"},
        parallel_tool_calls=False,
        max_output_tokens=120,
        temperature=0,  # greedy: a sampled reply may close its thinking at once
        extra_body={"thinking_budget_tokens": 8},
    )
    calls = [o for o in called.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert isinstance(json.loads(calls[0].arguments).get("city"), str)
    assert called.output[0].type == "reasoning"
    answer = c.responses.create(
        model=model,
        previous_response_id=called.id,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny"}],
        tools=[tool],
        tool_choice="none",
        max_output_tokens=30,
    )
    assert answer.output and answer.usage is not None
    # The call was in the cache: the output (and its turn's framing) is what was read.
    assert answer.usage.input_tokens - answer.usage.input_tokens_details.cached_tokens <= 40


def test_an_input_longer_than_the_context_is_refused_or_truncated(served: Served) -> None:
    """``truncation`` "disabled" (the default) refuses an input the context cannot hold,
    naming ``input``; "auto" drops the oldest turns and answers the last."""
    c = openai.OpenAI(base_url=served.root + "/v1", api_key="none", max_retries=0, timeout=300)
    tide = "The tide rises and falls along the quay twice a day. " * 10
    turns: Any = []
    for i in range(20):  # about 2,800 tokens, in a context of 2,048
        turns += [
            {"role": "user", "content": f"Tell me about berth {i}. {tide}"},
            {"role": "assistant", "content": f"Berth {i} is free at noon."},
        ]
    turns.append({"role": "user", "content": "Which berth is free?"})
    with pytest.raises(openai.BadRequestError) as err:
        c.responses.create(model=served.model, input=turns, max_output_tokens=8)
    assert err.value.code == "context_length_exceeded" and err.value.param == "input"
    auto = c.responses.create(
        model=served.model, input=turns, max_output_tokens=8, truncation="auto", temperature=0
    )
    assert auto.truncation == "auto" and auto.output_text and auto.usage is not None
    assert auto.usage.input_tokens < 2048 - 8


def test_tool_round_trips_against_lamplight_serve(served: Served) -> None:
    """The default (base) model through ``lamplight serve``, forced to call a named tool
    (the generic tool format, by grammar): Anthropic's ``tool_use`` and its
    ``tool_result``, OpenAI's ``function_call`` and its output, each read back."""
    c = client(served.root)
    ask: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
    called = c.messages.create(
        model=served.model,
        max_tokens=80,
        messages=ask,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
    )
    use = called.content[-1]
    assert called.stop_reason == "tool_use" and use.type == "tool_use"
    assert isinstance(use.input.get("city"), str)
    result: Any = {"type": "tool_result", "tool_use_id": use.id, "content": "Sunny"}
    answer = c.messages.create(
        model=served.model,
        max_tokens=8,
        messages=[
            *ask,
            {"role": "assistant", "content": called.content},
            {"role": "user", "content": [result]},
        ],
        tools=[WEATHER],
        tool_choice={"type": "none"},
    )
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert answer.usage.input_tokens <= 40, answer.usage  # the result: the call was cached
    o = openai.OpenAI(base_url=served.url, api_key="none", max_retries=0, timeout=300)
    tool: Any = {
        "type": "function",
        "name": "get_weather",
        "parameters": WEATHER["input_schema"],
    }
    made = o.responses.create(
        model=served.model,
        input="What is the weather in Rome?",
        tools=[tool],
        tool_choice={"type": "function", "name": "get_weather"},
        parallel_tool_calls=False,
        max_output_tokens=80,
    )
    calls = [item for item in made.output if item.type == "function_call"]
    assert len(calls) == 1 and isinstance(json.loads(calls[0].arguments).get("city"), str)
    after = o.responses.create(
        model=served.model,
        previous_response_id=made.id,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "Rain"}],
        tools=[tool],
        tool_choice="none",
        max_output_tokens=8,
    )
    assert after.usage is not None
    assert after.usage.input_tokens - after.usage.input_tokens_details.cached_tokens <= 40
