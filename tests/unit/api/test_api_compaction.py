"""The API's ``compact`` field (issue 45) over the scripted gateway (fast): the summary
is a job of its own on a copy of the cache, asked over the history as the client sent
it before; the answer is written from the system message with the summary, the kept
exchanges and the new message; the response reports what to send from now on, in the
whole body or in a stream's first chunk. Too little to compact is reported, not
refused; bad values are a 400 naming the field."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import httpx2
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.api import compact_field
from app.api.compact_field import CompactAsk, compacted, plan, read_compact
from app.api.errors import ApiError
from app.api.gateway import ProjectView
from app.api.project_field import with_project
from app.api.schema import parse_chat, parse_completion
from app.chat.compaction import DEFAULT_PROMPT
from app.chat.conversation import SUMMARY_HEADING
from app.engine.backend import Capabilities
from app.engine.chat_message import ChatMessage
from app.engine.tool_spec import NONE
from tests.conftest import Serve
from tests.hypothesis_budget import examples

MODEL = "gemma-3-270m-it-Q4_K_M"
SUMMARY = "Hello there, friend."  # what the scripted gateway writes


def history(turns: int, system: str = "Be brief.") -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for i in range(turns):
        out += [
            {"role": "user", "content": f"question {i}"},
            {"role": "assistant", "content": f"answer {i}"},
        ]
    return [*out, {"role": "user", "content": "the new question"}]


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=10)


def test_a_compacted_request_is_answered_from_the_summary_and_the_kept_turns(
    serve: Serve,
) -> None:
    server, gw = serve()
    messages = history(4)
    reply = client(server.url).chat.completions.create(
        model=MODEL, messages=messages, max_tokens=40, extra_body={"compact": True}
    )
    summary_job, answer_job = gw.submitted
    assert summary_job.compaction and not answer_job.compaction
    assert summary_job.id.startswith("compact-") and summary_job.tools is None
    # The summary's request: the history before the new question, then the instruction.
    asked = [(m.role, m.content) for m in summary_job.messages]
    assert asked[:-1] == [(m["role"], m["content"]) for m in messages[:-1]]
    assert asked[-1] == ("user", DEFAULT_PROMPT.replace("{kept}", "4"))
    # Its own length limit (not the answer's), plain text.
    assert summary_job.params.max_tokens == 512 and summary_job.params.output_format == "text"
    assert answer_job.params.max_tokens == 40
    # The answer: the system text with the summary, two kept exchanges, the question.
    sent = [(m.role, m.content) for m in answer_job.messages]
    system = f"Be brief.\n\n{SUMMARY_HEADING}\n{SUMMARY}"
    assert sent == [
        ("system", system),
        *[(m["role"], m["content"]) for m in messages[5:]],
    ]
    found = (reply.model_extra or {})["compaction"]
    assert found["summary"] == SUMMARY and found["system"] == system
    assert found["replaced"] == [1, 5] and found["summarised"] == 4
    assert found["summary_tokens"] == 5 and found["read_tokens"] >= 0
    # What the client sends next: the new system message, then what stayed.
    assert messages[: found["replaced"][0]] == [{"role": "system", "content": "Be brief."}]


def test_a_stream_reports_the_compaction_in_its_first_chunk(serve: Serve) -> None:
    server, _gw = serve()
    body = {"model": MODEL, "messages": history(3, system=""), "stream": True, "compact": True}
    with httpx2.stream("POST", f"{server.url}/chat/completions", json=body, timeout=10) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: {")]
    first = json.loads(lines[0][6:])
    assert first["choices"][0]["delta"]["role"] == "assistant"
    assert first["compaction"]["replaced"] == [0, 2]
    assert first["compaction"]["system"] == f"{SUMMARY_HEADING}\n{SUMMARY}"
    assert all("compaction" not in json.loads(line[6:]) for line in lines[1:])


def test_the_summary_is_offered_the_requests_tools_none_callable(serve: Serve) -> None:
    """The tools are described in the prompt the cache holds: the summary's request
    renders them too (none callable), so it reads only its instruction."""
    server, gw = serve()
    assert gw.info is not None
    gw.info = dataclasses.replace(gw.info, capabilities=Capabilities(tools=True))
    tools: Any = [{"type": "function", "function": {"name": "clock", "parameters": {}}}]
    client(server.url).chat.completions.create(
        model=MODEL, messages=history(3), tools=tools, extra_body={"compact": True}
    )
    summary_job, answer_job = gw.submitted
    assert summary_job.tools is not None and answer_job.tools is not None
    assert summary_job.tools.choice == NONE and answer_job.tools.choice == "auto"
    assert summary_job.tools.tools == answer_job.tools.tools


def test_too_little_to_compact_is_reported_and_answered(serve: Serve) -> None:
    server, gw = serve()
    reply = client(server.url).chat.completions.create(
        model=MODEL, messages=history(2), extra_body={"compact": {"keep": 2}}
    )
    assert len(gw.submitted) == 1 and not gw.submitted[0].compaction
    assert "not enough to compact" in (reply.model_extra or {})["compaction"]["skipped"]


def test_an_empty_summary_is_reported_and_the_messages_answered_as_sent(serve: Serve) -> None:
    server, gw = serve()
    gw.tokens = [" ", ""]
    reply = client(server.url).chat.completions.create(
        model=MODEL, messages=history(4), extra_body={"compact": True}
    )
    assert (reply.model_extra or {})["compaction"] == {"skipped": compact_field.EMPTY}
    assert len(gw.submitted[1].messages) == len(history(4))


def test_a_summary_that_fails_fails_the_request(serve: Serve) -> None:
    from app.api.gateway import ApiFailure

    server, gw = serve()
    gw.fail = ApiFailure(500, "server_error", "engine_error", "the engine broke")
    with pytest.raises(openai.InternalServerError):
        client(server.url).chat.completions.create(
            model=MODEL, messages=history(4), extra_body={"compact": True}
        )
    assert len(gw.submitted) == 1  # no answer was asked for


@pytest.mark.parametrize(
    "value",
    [
        1,
        "yes",
        [],
        {"keep": -1},
        {"keep": 65},
        {"keep": True},
        {"prompt": ""},
        {"other": 1},
        {"max_tokens": 8},
        {"max_tokens": 5000},
    ],
)
def test_a_bad_compact_value_names_the_field(value: object) -> None:
    with pytest.raises(ApiError) as err:
        parse_chat({"messages": history(1), "compact": value})
    assert err.value.param == "compact" and err.value.status == 400


def test_compact_is_read_and_refused_on_text_completions() -> None:
    assert parse_chat({"messages": history(1)}).compact is None
    assert parse_chat({"messages": history(1), "compact": False}).compact is None
    asked = parse_chat({"messages": history(1), "compact": {"keep": 1, "prompt": "Sum up."}})
    assert asked.compact == CompactAsk(1, "Sum up.", 512)
    longer = parse_chat({"messages": history(1), "compact": {"max_tokens": 1000}})
    assert longer.compact == CompactAsk(max_tokens=1000)
    with pytest.raises(ApiError) as err:
        parse_completion({"prompt": "Once", "compact": True})
    assert err.value.param == "compact"


def test_a_projects_chat_sends_the_summary_as_its_one_system_message() -> None:
    view = ProjectView("p1", "Answer as the harbour master.")
    block = f"{SUMMARY_HEADING}\nWe spoke of tides."
    sent = [ChatMessage("system", block), ChatMessage("user", "And the berths?")]
    merged = with_project(view, "p1", sent)
    assert [(m.role, m.content) for m in merged] == [
        ("system", f"{view.system_text}\n\n{block}"),
        ("user", "And the berths?"),
    ]
    with pytest.raises(ApiError) as err:  # any other system message still conflicts
        with_project(view, "p1", [ChatMessage("system", "Be brief."), *sent[1:]])
    assert err.value.code == "project_conflict"


ROLES = st.sampled_from(["system", "developer", "user", "assistant", "tool"])


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(ROLES, max_size=24), st.integers(0, 5))
def test_a_plan_keeps_every_message_after_it_and_the_new_part(roles: list[str], keep: int) -> None:
    messages = [ChatMessage(role, f"m{i}") for i, role in enumerate(roles)]  # type: ignore[arg-type]
    found = plan(messages, keep)
    if found is None:
        return
    assert 0 <= found.start < found.end <= found.ask < len(messages)
    assert found.end - found.start >= 2 and messages[found.ask].role == "user"
    assert all(m.role in ("system", "developer") for m in messages[: found.start])
    after = compacted(messages, found, "S")
    assert after[0].role == "system" and after[0].content.endswith(f"{SUMMARY_HEADING}\nS")
    assert after[1:] == messages[found.end :]
    users_kept = sum(1 for m in messages[found.end : found.ask] if m.role == "user")
    assert users_kept == keep


@settings(max_examples=examples(200), deadline=None)
@given(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.text(max_size=8),
        st.dictionaries(
            st.sampled_from(["keep", "prompt", "max_tokens", "x"]),
            st.one_of(st.integers(-5, 100), st.text(max_size=5000), st.none()),
            max_size=3,
        ),
    )
)
def test_any_compact_value_is_read_or_refused_with_a_400(value: object) -> None:
    try:
        read = read_compact({"compact": value})
    except ApiError as err:
        assert err.status == 400 and err.param == "compact"
        return
    assert read is None or (0 <= read.keep <= 64 and 0 < len(read.prompt) <= 4000)
    assert read is None or 16 <= read.max_tokens <= 4096
