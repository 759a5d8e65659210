"""Reasoning through the server backends: an OpenAI-compatible server's
``reasoning_content`` / ``reasoning`` deltas (or a ``<think>`` block it left in the
content) come back as thinking, and the thinking settings go out as
``reasoning_effort`` / ``chat_template_kwargs``; llama-server, driven with this app's
own reasoning template, splits the stream and keeps to the thinking budget."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.config.setting_records import SamplingParams
from app.engine.backend import Finished, Token
from app.engine.chat_format.native import available as native_available
from app.engine.chat_message import ChatMessage
from app.remote.llama_server.backend import LlamaServerBackend
from app.remote.openai.backend import OpenAIBackend
from app.remote.openai.wire import ReplyStream
from tests import llama_chat
from tests.e2e.test_remote_openai import chunk, json_response, scripted, sse
from tests.hypothesis_budget import examples
from tests.reasoning_templates import QWEN3, R1, THINK_GRAMMAR, use
from tests.reasoning_templates import run as run_server
from tests.server_fixture import RunningServer, connected_backend

HI = [ChatMessage("user", "hi")]


def run(
    backend: OpenAIBackend, params: SamplingParams, messages: list[ChatMessage] = HI
) -> tuple[list[Token], Finished]:
    events = list(backend.generate(messages, params, threading.Event()))
    tokens = [e for e in events if isinstance(e, Token)]
    done = events[-1]
    assert isinstance(done, Finished)
    assert done.text == "".join(t.text for t in tokens if not t.reasoning)
    assert done.reasoning == "".join(t.text for t in tokens if t.reasoning).strip()
    return tokens, done


def thought(text: str, key: str = "reasoning_content") -> dict[str, Any]:
    event = chunk()
    event["choices"][0]["delta"] = {key: text}
    return event


def usage(completion: int, reasoning: int) -> dict[str, Any]:
    event = chunk(
        None,
        usage={
            "prompt_tokens": 5,
            "completion_tokens": completion,
            "completion_tokens_details": {"reasoning_tokens": reasoning},
        },
    )
    event["choices"] = []
    return event


@pytest.mark.parametrize("key", ["reasoning_content", "reasoning"])
def test_reasoning_deltas_come_back_as_thinking(key: str) -> None:
    with scripted() as (server, b):
        assert b.capabilities.thinking_control is False
        assert "Stop thinking" in b.capabilities.why_not["thinking_control"]
        events = [thought("Let me", key), thought(" think.", key), chunk("Hi"), chunk(" there")]
        server.script = [sse([*events, chunk(None, "stop")])]
        tokens, done = run(b, SamplingParams(max_tokens=20))
    assert [t.reasoning for t in tokens] == [True, True, False, False]
    assert (done.reasoning, done.text) == ("Let me think.", "Hi there")
    m = done.metrics
    assert m.reasoning_tokens == 2 and m.generated_tokens == 4
    assert 0 < m.token_times_ms[0] <= m.first_answer_ms == m.token_times_ms[2]


def test_the_servers_reasoning_count_wins() -> None:
    with scripted() as (server, b):
        events = [thought("Hmm"), chunk("Yes"), chunk(None, "stop"), usage(30, 25)]
        server.script = [sse(events)]
        _, done = run(b, SamplingParams(max_tokens=40))
    assert done.metrics.reasoning_tokens == 25 and done.metrics.generated_tokens == 30


def test_a_think_block_left_in_the_content_is_split() -> None:
    pieces = ["<th", "ink>\nI should", " greet.</th", "ink>\n\nHello", "!"]
    with scripted() as (server, b):
        server.script = [sse([*(chunk(p) for p in pieces), chunk(None, "stop")])]
        tokens, done = run(b, SamplingParams(max_tokens=20))
    assert (done.reasoning, done.text) == ("I should greet.", "Hello!")
    assert tokens[0].reasoning and not tokens[-1].reasoning
    assert done.metrics.reasoning_tokens >= 2


def test_content_that_only_mentions_think_is_left_alone() -> None:
    with scripted() as (server, b):
        events = [chunk("<b>bold</b>"), chunk(" and <think> later"), chunk(None, "stop")]
        server.script = [sse(events)]
        tokens, done = run(b, SamplingParams(max_tokens=20))
    assert done.text == "<b>bold</b> and <think> later" and done.reasoning == ""
    assert not any(t.reasoning for t in tokens) and done.metrics.reasoning_tokens == 0


def test_a_reply_of_just_a_lone_angle_bracket_is_kept() -> None:
    with scripted() as (server, b):
        server.script = [sse([chunk("<"), chunk(None, "stop")])]
        _, done = run(b, SamplingParams(max_tokens=5))
    assert done.text == "<"


def test_thinking_settings_are_sent() -> None:
    with scripted() as (server, b):
        server.script = [sse([chunk("x"), chunk(None, "stop")])]
        run(b, SamplingParams(max_tokens=5))
        assert "reasoning_effort" not in server.bodies[-1]
        assert "chat_template_kwargs" not in server.bodies[-1]
        params = SamplingParams(
            max_tokens=5, thinking="off", reasoning_effort="low", template_kwargs='{"x": [1]}'
        )
        run(b, params, [ChatMessage("user", "a"), ChatMessage("assistant", "b", "why"), *HI])
        body = server.bodies[-1]
    assert body["reasoning_effort"] == "low"
    assert body["chat_template_kwargs"] == {"x": [1], "enable_thinking": False}
    # History goes back as content only: the server's template re-renders it.
    assert body["messages"][1] == {"role": "assistant", "content": "b"}


def test_a_server_that_refuses_a_reasoning_field_gets_the_request_without_it() -> None:
    refusal = json_response(
        400, {"error": {"message": "Unrecognized request argument: chat_template_kwargs"}}
    )
    with scripted() as (server, b):
        server.script = [refusal, sse([chunk("ok"), chunk(None, "stop")])]
        _, done = run(b, SamplingParams(max_tokens=5, thinking="on"))
        assert "chat_template_kwargs" in server.bodies[0]
        assert "chat_template_kwargs" not in server.bodies[1]
        assert done.text == "ok"
        assert any("chat_template_kwargs" in n for n in done.metrics.notes)
        server.script = [sse([chunk("again"), chunk(None, "stop")])]
        run(b, SamplingParams(max_tokens=5, thinking="on"))
        assert "chat_template_kwargs" not in server.bodies[-1]  # remembered


_PIECES = st.lists(
    st.sampled_from(["<", "think", ">", "</", "x", " ", "\n", "<think>", "</think>", "y z"]),
    max_size=12,
)


@settings(max_examples=examples(300), deadline=None)
@given(pieces=_PIECES)
def test_inline_splitting_loses_nothing_but_markers(pieces: list[str]) -> None:
    """Whatever the split, thinking + answer is the content less the markers it used."""
    reply = ReplyStream()
    parts = [p for piece in pieces for p in reply.feed_parts(chunk(piece))] + reply.finish()
    whole = "".join(pieces)
    out = "".join(t for _, t in parts)
    assert reply.text == "".join(t for r, t in parts if not r)
    if not whole.lstrip().startswith("<think>"):
        assert out == whole and not reply.reasoning
    else:
        assert len(out) <= len(whole) and reply.reasoning + reply.text == out


# -- llama-server: this app's template, split and budgeted here ---------------------------


@pytest.fixture()
def server_backend(llama_server: RunningServer) -> Iterator[LlamaServerBackend]:
    with connected_backend(llama_server.url, "think") as backend:
        assert backend.capabilities.thinking_control
        yield backend


GREEDY = SamplingParams(temperature=0.0, seed=7, max_tokens=40)


def test_llama_server_splits_the_thinking(server_backend: LlamaServerBackend) -> None:
    use(server_backend, QWEN3)
    params = replace(GREEDY, output_format="gbnf", grammar=THINK_GRAMMAR, max_tokens=120)
    _tokens, done = run_server(server_backend, [ChatMessage("user", "Say hi.")], params)
    assert done.reasoning and done.text.strip()
    for text in (done.reasoning, done.text):
        assert "<think>" not in text and "</think>" not in text
    m = done.metrics
    assert 0 < m.reasoning_tokens < m.generated_tokens
    assert m.first_answer_ms >= m.ttft_ms > 0 and m.thinking_cut == ""


@pytest.mark.parametrize("budget", [1, 5, 12])
def test_llama_server_keeps_to_the_thinking_budget(
    server_backend: LlamaServerBackend, budget: int
) -> None:
    use(server_backend, R1)  # the prompt opens the block: the reply starts inside it
    params = replace(GREEDY, thinking_budget=budget, budget_message="Answer now.")
    tokens, done = run_server(server_backend, [ChatMessage("user", "Count to three.")], params)
    m = done.metrics
    assert m.reasoning_tokens == budget  # never more than the budget
    assert m.thinking_cut == "budget" and done.reasoning.endswith("Answer now.")
    assert done.text.strip(), (m.stop_reason, server_backend._slot.map.text[-200:], m.notes)
    assert any(not t.reasoning for t in tokens)
    assert "</think>" in server_backend._slot.map.text  # the block was closed in the slot
    assert m.first_answer_ms > 0


def test_llama_server_stop_thinking(server_backend: LlamaServerBackend) -> None:
    use(server_backend, R1)
    messages = [ChatMessage("user", "Count.")]
    _tokens, done = run_server(server_backend, messages, GREEDY, end_after=5)
    m = done.metrics
    assert m.thinking_cut == "user" and 5 <= m.reasoning_tokens <= 8
    assert done.text.strip() and "Answer now" not in done.reasoning
    # The next turn, past thinking dropped by the template: the slot is reworked to the
    # history as rendered, and the next message is about all that is read.
    reply = ChatMessage("assistant", done.text, done.reasoning)
    assert server_backend.prewarm(messages, reply) > 0
    follow = [*messages, reply, ChatMessage("user", "Again.")]
    _tokens, again = run_server(server_backend, follow, replace(GREEDY, max_tokens=4))
    assert again.metrics.evaluated_tokens <= 12


def test_llama_server_thinking_off(server_backend: LlamaServerBackend) -> None:
    params = replace(GREEDY, thinking="off", max_tokens=8)
    if native_available():  # llama.cpp closes the block of the real R1 distill template
        use(
            server_backend,
            llama_chat.template_source(llama_chat.R1_DISTILL),
        )
        _tokens, done = run_server(server_backend, [ChatMessage("user", "Hi.")], params)
        assert done.reasoning == "" and done.metrics.reasoning_tokens == 0
        assert "<think>\n</think>" in server_backend._slot.map.text
        return
    use(server_backend, R1)  # no switch: "off" writes the empty block itself
    _tokens, done = run_server(server_backend, [ChatMessage("user", "Hi.")], params)
    assert done.reasoning == "" and done.metrics.reasoning_tokens == 0
    assert "<think>\n</think>\n\n" in server_backend._slot.map.text
