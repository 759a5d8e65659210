"""Tool calls and results in transcripts: round trip, hostile files, what the model reads,
Markdown export."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.chat.conversation import Conversation, ConversationError, Message
from app.chat.store import ConversationStore
from app.chat.tool_records import CALL_STATES, MAX_CALLS, read_calls
from app.chat.transcript_markdown import to_markdown
from app.engine.chat_message import ToolCall
from tests.hypothesis_budget import examples

CALL = {"id": "call_1", "name": "read", "arguments": '{"path": "a"}', "server": "files"}


def chain() -> Conversation:
    conv = Conversation(title="t")
    conv.messages = [
        Message("user", "read a"),
        Message("assistant", "Looking.", tool_calls=[{**CALL, "state": "done", "ms": 12.5}]),
        Message("tool", "contents of a", tool_call_id="call_1", name="read"),
        Message("assistant", "It says a."),
    ]
    return conv


def test_a_chain_round_trips_and_plain_messages_gain_no_fields(tmp_path: Path) -> None:
    store = ConversationStore(tmp_path)
    conv = chain()
    store.save(conv)
    back = store.load(conv.id)
    assert back.messages == conv.messages
    data = conv.to_dict()
    assert set(data["messages"][0]) == {
        "role",
        "content",
        "created",
        "id",
        "token_offset",
        "metrics",
        "forgotten",
    }
    assert data["messages"][2]["tool_call_id"] == "call_1"
    assert "is_error" not in data["messages"][2]
    assert data["format"] == 2


def test_the_model_reads_calls_and_a_cut_result() -> None:
    conv = chain()
    conv.messages[2].content = "x" * 48_211
    sent = conv.chat(16_000)
    assert sent[1].tool_calls == (ToolCall("call_1", "read", '{"path": "a"}'),)
    assert sent[2].role == "tool" and sent[2].tool_call_id == "call_1" and sent[2].name == "read"
    assert sent[2].content.endswith("[Result truncated: 48,211 characters, the first 16,000 shown]")
    assert sent[2].content.startswith("x" * 16_000)
    assert len(conv.messages[2].content) == 48_211  # the transcript keeps it whole


def dump(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"format": 2, "id": "abc", "messages": messages}


def test_hostile_tool_fields_are_repaired() -> None:
    calls: list[Any] = [
        {"id": "call_1", "name": "a", "arguments": "{}", "state": "exploded", "ms": -1},
        {"id": 5, "name": ["x"], "arguments": {"a": 1}, "server": 7, "state": "running"},
        "not a call",
        {"id": "call_1", "name": "dup", "arguments": "x" * 200_000, "state": "ask", "ms": 1e300},
    ]
    data = dump(
        [
            {"role": "user", "content": "q", "tool_calls": [CALL], "tool_call_id": "x"},
            {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "content": "r", "tool_call_id": "\n" * 3, "is_error": "yes"},
        ]
    )
    conv = Conversation.from_dict(json.loads(json.dumps(data)))
    user, reply = conv.messages[:2]
    assert user.tool_calls == [] and user.tool_call_id == ""
    assert [c["state"] for c in reply.tool_calls] == ["error", "cancelled", "cancelled"]
    assert "ms" not in reply.tool_calls[0] and "ms" not in reply.tool_calls[2]
    assert reply.tool_calls[1]["name"] == "" and reply.tool_calls[1]["arguments"] == "{}"
    assert reply.tool_calls[1]["server"] == ""
    assert reply.tool_calls[2]["arguments"] == "{}"
    ids = [c["id"] for c in reply.tool_calls]
    assert len(set(ids)) == 3
    # Every call has a result for the model: the stored one is not any of theirs.
    results = [m for m in conv.messages if m.role == "tool"]
    assert len(results) == 4 and not results[0].is_error and results[0].tool_call_id == ""
    assert {m.tool_call_id for m in results[1:]} == set(ids)


def test_counts_are_bounded() -> None:
    many = [{**CALL, "id": f"c{i}", "state": "done"} for i in range(MAX_CALLS * 3)]
    assert len(read_calls(many)) == MAX_CALLS
    assert read_calls("nope") == [] and read_calls(None) == []


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=30,
)
_CALLS = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "id": _JSON | st.text(max_size=200),
            "name": _JSON,
            "arguments": _JSON | st.text(max_size=30),
            "server": _JSON,
            "state": st.sampled_from([*CALL_STATES, "x"]) | _JSON,
            "ms": _JSON,
        },
    )
    | _JSON,
    max_size=8,
)


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_CALLS, _JSON, _JSON, st.sampled_from(["assistant", "tool", "user"]))
def test_any_tool_fields_read_as_valid_calls(
    calls: Any, call_id: Any, is_error: Any, role: str
) -> None:
    raw = dump(
        [
            {"role": role, "content": "c", "tool_calls": calls, "tool_call_id": call_id},
            {"role": "tool", "content": "r", "tool_call_id": call_id, "is_error": is_error},
        ]
    )
    try:
        conv = Conversation.from_dict(json.loads(json.dumps(raw, allow_nan=True)))
    except ConversationError:  # pragma: no cover - the structure is always valid here
        raise
    for m in conv.messages:
        assert isinstance(m.is_error, bool) and isinstance(m.tool_call_id, str)
        for c in m.tool_calls:
            assert c["state"] in CALL_STATES and c["state"] not in ("ask", "running")
            assert isinstance(c["arguments"], str) and isinstance(c["name"], str)
        m.chat()  # what the model would read builds
    again = Conversation.from_dict(json.loads(json.dumps(conv.to_dict())))
    assert again.messages == conv.messages
    to_markdown(conv)


def test_markdown_shows_calls_and_results_without_breaking_out() -> None:
    conv = chain()
    conv.messages[1].tool_calls[0]["arguments"] = '{"code": "```\\n</details>"}'
    conv.messages[2].content = "</details><script>x</script>\n```\n<!-- y"
    text = to_markdown(conv)
    assert "*Tool call: read on files (done)*" in text
    assert "````json\n" in text or "```json\n" in text
    section = text[text.index("<details><summary>Result of read</summary>") :]
    body = section[: section.index("\n</details>")]
    assert "</details>" not in body and "<script" not in body and "<!--" not in body
    assert re.search(r"^```+$", body, re.M)
    assert "It says a." in text
