"""A reply streamed through llama.cpp's parser in the decode loop's shapes
(``chat_format.stream``): thinking and answer apart at every split, calls out of the
answer, a cut call reported and never shown as syntax."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.engine.chat_format.native import ChatRequest, NativeFormatter
from app.engine.chat_format.stream import NativeCalls, NativeSplitter, NativeStream
from app.engine.chat_format.thinking import native_reasoning, opens_thinking
from app.engine.native.chat_shim import ChatShim
from app.engine.native.chat_worker import ChatWorker
from app.engine.tools.grammar import call_openers
from tests import llama_chat

WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city"],
        },
    },
}
QWEN_REPLY = (
    "Let me look it up.\n</think>\n\nChecking.\n\n<tool_call>\n<function=weather>\n"
    "<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>"
)


def _stream(
    name: str, shim: ChatShim, worker: ChatWorker, tools: bool = True
) -> tuple[NativeSplitter, NativeCalls]:
    fmt = NativeFormatter(llama_chat.template_source(name), worker=worker, shim=shim)
    request = ChatRequest(
        [{"role": "user", "content": "Weather in Oslo?"}],
        tools=[WEATHER] if tools else [],
        now=llama_chat.FIXED_NOW,
    )
    formatted = fmt.apply(request)
    stream = NativeStream(
        fmt.parser(formatted, tools=tools), formatted.thinking_ends, opens_thinking(formatted)
    )
    calls = NativeCalls(stream, openers=call_openers(formatted))
    return NativeSplitter(stream, native_reasoning(formatted)), calls


def _run(splitter: NativeSplitter, calls: NativeCalls, pieces: list[str]) -> dict[str, Any]:
    thought, answer, inside = "", "", [splitter.inside]
    for piece in pieces:
        for is_thought, text in splitter.feed(piece):
            if is_thought:
                thought += text
            else:
                answer += calls.feed(text)
        inside.append(splitter.inside)
    for is_thought, text in splitter.flush():
        thought, answer = (thought + text, answer) if is_thought else (thought, answer + text)
    answer += calls.finish()
    return {"thought": thought, "answer": answer, "calls": calls.calls, "inside": inside}


@pytest.mark.parametrize("size", [1, 2, 3, 7, 50])
def test_thinking_answer_and_a_call_come_apart_at_every_split(
    size: int, shim: ChatShim, worker: ChatWorker
) -> None:
    splitter, calls = _stream("Qwen3.5-4B.jinja", shim, worker)
    pieces = [QWEN_REPLY[i : i + size] for i in range(0, len(QWEN_REPLY), size)]
    out = _run(splitter, calls, pieces)
    assert out["thought"].strip() == "Let me look it up."
    assert out["answer"].strip() == "Checking."
    assert "<" not in out["answer"]  # no markup, not even half a marker
    assert [(c.name, json.loads(c.arguments)) for c in out["calls"]] == [
        ("weather", {"city": "Oslo"})
    ]
    assert out["calls"][0].id.startswith("call_")
    assert out["inside"][0] and not out["inside"][-1]  # the prompt opened the block


def test_a_call_cut_off_is_reported_not_run_and_not_shown(
    shim: ChatShim, worker: ChatWorker
) -> None:
    splitter, calls = _stream("Qwen3.5-4B.jinja", shim, worker)
    cut = QWEN_REPLY[: QWEN_REPLY.index("Oslo") + 2]
    out = _run(splitter, calls, list(cut))
    assert out["calls"] == []
    assert "<tool_call>" not in out["answer"] and "<function" not in out["answer"]
    assert any("weather" in p and "ended inside" in p for p in calls.problems)


def test_a_reply_cut_before_its_call_has_a_name_is_reported(
    shim: ChatShim, worker: ChatWorker
) -> None:
    """llama.cpp's parser keeps the start of a call out of the answer but reads no call
    from it: the note says the reply ended inside one; a whole answer gets no note."""
    splitter, calls = _stream("Qwen3.5-4B.jinja", shim, worker)
    cut = QWEN_REPLY[: QWEN_REPLY.index("<function=") + 4]
    out = _run(splitter, calls, list(cut))
    assert out["calls"] == [] and "<tool_call>" not in out["answer"]
    assert calls.problems == ["The model's reply ended inside a tool call; it was not run."]
    splitter, calls = _stream("Qwen3.5-4B.jinja", shim, worker)
    whole = QWEN_REPLY[: QWEN_REPLY.index("<tool_call>")]
    out = _run(splitter, calls, list(whole))
    assert out["calls"] == [] and calls.problems == []


def test_a_reply_that_breaks_the_format_keeps_its_text(shim: ChatShim, worker: ChatWorker) -> None:
    splitter, calls = _stream("Qwen3.5-4B.jinja", shim, worker)
    out = _run(splitter, calls, ["Thinking only, never closed"])
    assert "Thinking only, never closed" in out["thought"] + out["answer"]
    assert out["calls"] == []


@pytest.mark.parametrize(
    ("name", "reply", "thought", "answer"),
    [
        (
            "google-gemma-4-31B-it.jinja",
            "<|channel>thought\nHmm.<channel|>Sunny.",
            "Hmm.",
            "Sunny.",
        ),
        ("MiniMax-M3.jinja", "<mm:think>Hmm.</mm:think>Sunny.", "Hmm.", "Sunny."),
        ("Kimi-K3.jinja", "Hmm.<|close|>think<|sep|>Sunny.", "Hmm.", "Sunny."),
    ],
)
def test_thinking_markers_of_the_families_the_python_port_missed(
    name: str, reply: str, thought: str, answer: str, shim: ChatShim, worker: ChatWorker
) -> None:
    splitter, calls = _stream(name, shim, worker, tools=False)
    out = _run(splitter, calls, list(reply))
    assert (out["thought"].strip(), out["answer"].strip()) == (thought, answer)
