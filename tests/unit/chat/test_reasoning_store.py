"""A reply's thinking in the data: transcript, versions, session, search, export (issue 28)."""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.chat.conversation import Conversation, ConversationError, Message
from app.chat.metrics_csv import metrics_csv, read_metrics_csv
from app.chat.metrics_record import metrics_to_dict
from app.chat.search_index import SearchIndex
from app.chat.session import ChatSession
from app.chat.store import ConversationStore
from app.chat.transcript_markdown import to_markdown
from app.config.setting_records import SamplingParams
from app.engine.backend import MAX_REPLY_BYTES
from app.engine.chat_message import ChatMessage
from app.engine.metrics import MessageMetrics
from tests.hypothesis_budget import examples

THOUGHT = "The user greets me; a short friendly answer will do. zeppelin"


def thinking_chat() -> Conversation:
    conv = Conversation(title="Greeting", model_name="qwen3.gguf")
    metrics = MessageMetrics(
        generated_tokens=12,
        reasoning_tokens=9,
        token_times_ms=[100.0, 150.0, 400.0, 450.0],
        first_answer_ms=400.0,
        thinking_cut="budget",
    )
    conv.messages = [
        Message("user", "Hello there", created=1000.0),
        Message(
            "assistant",
            "Hi! How can I help?",
            created=1001.0,
            reasoning=THOUGHT,
            metrics=metrics_to_dict(metrics),
        ),
    ]
    return conv


# -- the transcript ----------------------------------------------------------------------


def test_thinking_round_trips_through_the_file_as_its_own_field(tmp_path: Path) -> None:
    store = ConversationStore(tmp_path)
    conv = thinking_chat()
    store.save(conv)
    raw = json.loads(store.transcript_path(conv.id).read_text())
    assert raw["messages"][1]["reasoning"] == THOUGHT
    assert raw["messages"][1]["content"] == "Hi! How can I help?"
    assert "reasoning" not in raw["messages"][0]  # no thinking, no field
    back = store.load(conv.id)
    assert back == conv
    assert back.messages[1].reasoning == THOUGHT
    assert back.chat()[1] == ChatMessage("assistant", "Hi! How can I help?", THOUGHT)
    figures = back.messages[1].message_metrics()
    assert figures is not None
    assert (figures.reasoning_tokens, figures.first_answer_ms, figures.thinking_cut) == (
        9,
        400.0,
        "budget",
    )
    assert figures.reasoning_ms == 300.0


def test_a_transcript_without_thinking_is_written_as_before_and_old_files_load(
    tmp_path: Path,
) -> None:
    conv = thinking_chat()
    conv.messages[1].reasoning = ""
    assert all("reasoning" not in m for m in conv.to_dict()["messages"])
    old = {
        "format": 1,
        "id": "old1",
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello", "metrics": {"generated_tokens": 3}},
        ],
    }
    loaded = Conversation.from_dict(old)
    assert [m.reasoning for m in loaded.messages] == ["", ""]
    figures = loaded.messages[1].message_metrics()
    assert figures is not None and figures.reasoning_tokens == 0 and figures.thinking_cut == ""


@pytest.mark.parametrize(
    ("value", "role", "kept"),
    [
        (None, "assistant", ""),
        (42, "assistant", ""),
        (["a", "b"], "assistant", ""),
        ({"text": "x"}, "assistant", ""),
        (True, "assistant", ""),
        ("thought", "user", ""),  # only a reply thinks
        ("thought", "system", ""),
        ("thought", "assistant", "thought"),
    ],
)
def test_odd_thinking_values_are_repaired(value: object, role: str, kept: str) -> None:
    data = {
        "format": 2,
        "id": "c1",
        "messages": [{"role": role, "content": "x", "reasoning": value}],
    }
    [m] = Conversation.from_dict(data).messages
    assert m.reasoning == kept


@settings(max_examples=examples(200), deadline=None)
@given(
    reasoning=st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=True),
        st.text(max_size=50),
        st.lists(st.text(max_size=3), max_size=3),
        st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    ),
    cut=st.one_of(st.text(max_size=8), st.integers(), st.none(), st.floats(allow_nan=True)),
    tokens=st.one_of(st.integers(), st.floats(allow_nan=True), st.text(max_size=3), st.none()),
    first=st.one_of(st.integers(), st.floats(allow_nan=True), st.text(max_size=3), st.none()),
)
def test_any_stored_thinking_loads_and_everything_works_on_it(
    reasoning: object, cut: object, tokens: object, first: object
) -> None:
    metrics = {"reasoning_tokens": tokens, "first_answer_ms": first, "thinking_cut": cut}
    data = {
        "format": 2,
        "id": "c1",
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a", "reasoning": reasoning, "metrics": metrics},
        ],
    }
    conv = Conversation.from_dict(json.loads(json.dumps(data)))
    m = conv.messages[1]
    assert isinstance(m.reasoning, str)
    figures = m.message_metrics()
    assert figures is not None
    assert figures.thinking_cut in ("", "budget", "user")
    assert isinstance(figures.reasoning_tokens, int)
    assert isinstance(figures.first_answer_ms, float)
    figures.summary()
    _ = figures.reasoning_ms
    to_markdown(conv).encode("utf-8")
    metrics_csv(conv.messages)
    json.dumps(conv.to_dict(), allow_nan=False)
    assert Conversation.from_dict(json.loads(json.dumps(conv.to_dict()))) == conv


def test_megabytes_of_thinking_load_whole_and_too_much_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ConversationStore(tmp_path)
    conv = thinking_chat()
    conv.messages[1].reasoning = "hmm " * 1_000_000  # 4 MB, as a budget-less reply can be
    store.save(conv)
    assert store.load(conv.id).messages[1].reasoning == conv.messages[1].reasoning
    # Over the transcript's size limit: refused as the content would be (nothing written).
    monkeypatch.setattr("app.chat.store.MAX_TRANSCRIPT_BYTES", 1 << 20)
    conv.messages[1].reasoning += "more"
    with pytest.raises(ConversationError, match="MB"):
        store.save(conv)
    monkeypatch.undo()
    assert store.load(conv.id).messages[1].reasoning.endswith("hmm ")


def test_json_export_and_import_carry_the_thinking(tmp_path: Path) -> None:
    store = ConversationStore(tmp_path)
    conv = thinking_chat()
    exported = json.dumps(conv.to_dict(), indent=1)
    back = store.import_json(exported)
    assert back.id != conv.id
    assert back.messages[1].reasoning == THOUGHT


# -- versions ------------------------------------------------------------------------------


def test_regenerate_versions_and_fork_keep_each_versions_thinking(tmp_path: Path) -> None:
    store = ConversationStore(tmp_path)
    conv = thinking_chat()
    conv.keep_replaced(1, conv.messages[1:])
    conv.messages = [
        conv.messages[0],
        Message("assistant", "Hey!", created=2000.0, reasoning="second thoughts"),
    ]
    conv.messages += [Message("user", "Bye", created=2001.0)]
    store.save(conv)
    back = store.load(conv.id)
    assert [m.reasoning for m in back.every_message()] == ["", "second thoughts", "", THOUGHT]
    fork = store.fork(back, 1)
    assert [m.reasoning for m in fork.messages] == ["", "second thoughts"]
    assert [m.reasoning for b in fork.alternatives for m in b.messages] == [THOUGHT]
    assert fork.switch_version(1, 1)
    assert fork.chat()[1] == ChatMessage("assistant", "Hi! How can I help?", THOUGHT)
    assert store.load(fork.id).messages[1].reasoning == "second thoughts"


# -- the session ---------------------------------------------------------------------------


class Link:
    """An EngineLink that records what each request sent."""

    def __init__(self) -> None:
        self.sent: list[list[ChatMessage]] = []

    def generate(
        self, conv_id: str, messages: Sequence[ChatMessage], params: SamplingParams
    ) -> int:
        self.sent.append(list(messages))
        return len(self.sent)

    def stop(self) -> None: ...
    def reset(self) -> None: ...
    def restore_snapshot(self, conv_id: str) -> None: ...
    def drop_snapshot(self, conv_id: str) -> None: ...


class View:
    def __init__(self) -> None:
        self.ended: list[tuple[str, str]] = []

    def show_conversation(self, conv: Conversation, opened: bool, restoring: bool) -> None: ...
    def reply_begun(self, shown: Sequence[Message], added_user: bool) -> None: ...
    def reply_ended(self, text: str, metrics: MessageMetrics | None, error: str) -> None:
        self.ended.append((text, error))

    def open_failed(self, message: str) -> None: ...
    def notice(self, text: str) -> None: ...
    def row_saved(self, conv_id: str) -> None: ...
    def row_removed(self, conv_id: str) -> None: ...


@pytest.fixture()
def link() -> Link:
    return Link()


@pytest.fixture()
def session(tmp_path: Path, link: Link) -> ChatSession:
    return ChatSession(ConversationStore(tmp_path), link, View())


def finish(session: ChatSession, answer: str, thinking: str) -> None:
    """Stream ``thinking`` then ``answer`` a few characters at a time, then finish."""
    request = session.request_id
    assert request is not None
    for i in range(0, len(thinking), 7):
        session.on_tokens(request, thinking[i : i + 7], reasoning=True)
    for i in range(0, len(answer), 7):
        session.on_tokens(request, answer[i : i + 7])
    metrics = MessageMetrics(generated_tokens=20, reasoning_tokens=12, first_answer_ms=80.0)
    session.on_finished(request, answer, metrics, reasoning=thinking)


def test_the_session_stores_the_answer_and_the_thinking_apart(
    session: ChatSession, link: Link
) -> None:
    params = SamplingParams.greedy(64)
    assert session.send("Hello", params)
    finish(session, "Hi!", "They said hello. I should greet back.")
    reply = session.conversation.messages[-1]
    assert (reply.content, reply.reasoning) == ("Hi!", "They said hello. I should greet back.")
    saved = session.store.load(session.conversation.id)
    assert saved.messages[-1].reasoning == reply.reasoning
    figures = saved.messages[-1].message_metrics()
    assert figures is not None and figures.reasoning_tokens == 12
    # The next request hands the thinking to the template, which decides what it shows.
    assert session.send("And you?", params)
    assert link.sent[-1][1] == ChatMessage(
        "assistant", "Hi!", "They said hello. I should greet back."
    )


def test_a_regenerate_keeps_the_old_replys_thinking_as_a_version(session: ChatSession) -> None:
    params = SamplingParams.greedy(64)
    session.send("Hello", params)
    finish(session, "Hi!", "first thoughts")
    assert session.regenerate(params)
    finish(session, "Hello!", "second thoughts")
    conv = session.conversation
    assert conv.messages[-1].reasoning == "second thoughts"
    assert [m.reasoning for m in conv.every_message()] == ["", "second thoughts", "first thoughts"]
    assert session.switch_version(1, -1)
    assert conv.messages[1].reasoning == "first thoughts"


@pytest.mark.parametrize("how", ["cancelled", "failed", "quit"])
def test_a_reply_cut_short_keeps_the_thinking_it_had(session: ChatSession, how: str) -> None:
    session.send("Hello", SamplingParams.greedy(64))
    request = session.request_id
    assert request is not None
    session.on_tokens(request, "Let me think ", reasoning=True)
    session.on_tokens(request, "about it", reasoning=True)
    if how == "cancelled":  # a backend that ends a stopped reply without its text
        session.on_cancelled(request, "", MessageMetrics(stop_reason="cancelled"))
    elif how == "failed":
        session.on_failed(request, "the server went away")
    else:
        assert session.save()
    reply = session.store.load(session.conversation.id).messages[-1]
    assert (reply.role, reply.content, reply.reasoning) == (
        "assistant",
        "",
        "Let me think about it",
    )


def test_a_regenerate_stopped_while_thinking_keeps_both_versions(session: ChatSession) -> None:
    params = SamplingParams.greedy(64)
    session.send("Hello", params)
    finish(session, "Hi!", "first thoughts")
    session.regenerate(params)
    request = session.request_id
    assert request is not None
    session.on_tokens(request, "hmm", reasoning=True)  # the new version has begun
    session.on_cancelled(request, "", MessageMetrics(stop_reason="cancelled"), reasoning="hmm")
    conv = session.conversation
    assert (conv.messages[-1].content, conv.messages[-1].reasoning) == ("", "hmm")
    assert [m.reasoning for m in conv.every_message()] == ["", "hmm", "first thoughts"]


def test_thinking_past_the_reply_limit_is_cut_so_the_transcript_keeps_room(
    session: ChatSession,
) -> None:
    session.send("Hello", SamplingParams.greedy(64))
    request = session.request_id
    assert request is not None
    huge = "é" * MAX_REPLY_BYTES  # twice the limit in UTF-8
    session.on_finished(request, "ok", MessageMetrics(), reasoning=huge)
    reply = session.conversation.messages[-1]
    assert len(reply.reasoning.encode()) + len(b"ok") <= MAX_REPLY_BYTES
    assert reply.reasoning and huge.startswith(reply.reasoning)


# -- search ----------------------------------------------------------------------------------


def test_search_finds_a_word_only_in_the_thinking_and_says_so(tmp_path: Path) -> None:
    store = ConversationStore(tmp_path)
    conv = thinking_chat()
    store.save(conv)
    [hit] = store.search("zeppelin")
    assert (hit.conv_id, hit.index, hit.role, hit.thinking) == (conv.id, 1, "assistant", True)
    assert "zeppelin" in hit.snippet
    [answer] = store.search("help")
    assert (answer.index, answer.thinking) == (1, False)
    # A version not shown is searched, its thinking too.
    conv.keep_replaced(1, conv.messages[1:])
    conv.messages = [conv.messages[0], Message("assistant", "Hey", reasoning="airship")]
    store.save(conv)
    [hit] = store.search("zeppelin")
    assert (hit.index, hit.thinking) == (2, True)
    assert conv.reveal(conv.every_message()[hit.index].id) == 1


def test_an_index_of_the_older_schema_is_rebuilt_quietly(tmp_path: Path) -> None:
    store = ConversationStore(tmp_path)
    conv = thinking_chat()
    store.save(conv)
    store.index.close()
    path = tmp_path / "search.sqlite3"
    path.unlink()
    with sqlite3.connect(path) as db:  # the index as schema 1 left it
        db.execute("CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        db.execute(
            "CREATE TABLE docs(conv_id TEXT PRIMARY KEY, stamp TEXT NOT NULL, title TEXT NOT NULL)"
        )
        db.execute(
            "CREATE VIRTUAL TABLE messages USING fts5(content, conv_id UNINDEXED,"
            " idx UNINDEXED, role UNINDEXED, tokenize='unicode61 remove_diacritics 2')"
        )
        db.execute("INSERT INTO meta VALUES('schema', '1')")
        db.execute("INSERT INTO docs VALUES(?, 'stale', 'Greeting')", (conv.id,))
        db.execute("INSERT INTO messages VALUES('Hello there', ?, 0, 'user')", (conv.id,))
    db.close()
    fresh = ConversationStore(tmp_path)
    [hit] = fresh.search("zeppelin")
    assert hit.thinking
    assert fresh.take_notes() == []  # an upgrade, not damage: nothing set aside
    assert not list(tmp_path.glob("*.bad"))
    assert isinstance(fresh.index, SearchIndex) and fresh.index.problem == ""


# -- export ----------------------------------------------------------------------------------


def test_markdown_puts_the_thinking_in_a_collapsed_section_before_the_answer() -> None:
    text = to_markdown(thinking_chat())
    assert (
        "**Assistant**\n\n<details><summary>Thinking</summary>\n\n"
        f"{THOUGHT}\n\n</details>\n\nHi! How can I help?\n"
    ) in text
    assert text.count("<details>") == 1  # the user's turn has none


@pytest.mark.parametrize(
    "thought",
    [
        "I could close it: </details> and go on",
        "</DETAILS>\n\n<details open><summary>fake</summary>",
        "an unclosed comment <!-- here",
        "raw text <script>let a = 1 and <textarea> and <style>",
        "code cut off at the budget:\n```python\nprint('hi')",
        "~~~~\nstill code",
    ],
)
def test_no_thinking_text_breaks_the_section(thought: str) -> None:
    conv = thinking_chat()
    conv.messages[1].reasoning = thought
    text = to_markdown(conv)
    body = text.split("<details><summary>Thinking</summary>", 1)[1]
    inside, after = body.split("\n</details>\n", 1)
    assert "Hi! How can I help?" in after
    assert not re.search(r"<(/?details|/?summary|script|textarea|style|!--)", inside, re.I)
    fences = re.findall(r"^ {0,3}(`{3,}|~{3,})", inside, re.M)
    assert len(fences) % 2 == 0  # every code block it opens is closed before the tag


def test_the_metrics_csv_has_the_thinking_figures() -> None:
    [row] = read_metrics_csv(metrics_csv(thinking_chat().messages))
    assert row["reasoning_tokens"] == "9"
    assert float(row["reasoning_ms"]) == 300.0
    assert float(row["first_answer_ms"]) == 400.0
