"""Regenerate and edit keep what they replace, as versions shown "‹ 2/3 ›" (issue 26)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pytestqt.qtbot import QtBot

from app.chat.conversation import (
    Conversation,
    ConversationError,
    Message,
)
from app.chat.session import ChatSession
from app.chat.store import ConversationStore
from app.chat.transcript_markdown import to_markdown
from app.config.paths import data_dirs
from app.config.setting_records import SamplingParams
from app.engine.metrics import MessageMetrics
from tests.fakes.engine import FakeEngine
from tests.fakes.window import send
from tests.hypothesis_budget import examples
from ui.window.main_window import MainWindow


def msg(role: str, text: str, at: float) -> Message:
    return Message(role, text, created=at)


def chat(*texts: str) -> Conversation:
    roles = ["user", "assistant"]
    return Conversation(messages=[msg(roles[i % 2], t, 1000.0 + i) for i, t in enumerate(texts)])


# -- the model ----------------------------------------------------------------------------


def test_a_replaced_reply_is_a_version_and_switching_swaps_tails() -> None:
    conv = chat("q", "a1")
    conv.keep_replaced(1, conv.messages[1:])
    conv.messages = [*conv.messages[:1], msg("assistant", "a2", 2000.0)]
    assert conv.version_of(1) == (2, 2)
    assert conv.version_of(0) == (1, 1)
    assert conv.switch_version(1, 1)
    assert [m.content for m in conv.messages] == ["q", "a1"]
    assert conv.version_of(1) == (1, 2)
    assert not conv.switch_version(1, 1)  # already shown
    assert not conv.switch_version(1, 3)
    assert sorted(m.content for m in conv.every_message()) == ["a1", "a2", "q"]


def test_an_edit_keeps_the_whole_branch_after_it_and_reveal_finds_any_message() -> None:
    conv = chat("q1", "a1", "q2", "a2")
    old_tail = conv.messages[2:]
    conv.keep_replaced(2, old_tail)
    conv.messages = [*conv.messages[:2], msg("user", "q2 edited", 3000.0)]
    assert conv.version_of(2) == (2, 2)
    # A regenerate inside the old branch's future: reveal climbs back through both.
    assert conv.reveal(old_tail[1].id) == 3
    assert [m.content for m in conv.messages] == ["q1", "a1", "q2", "a2"]
    assert conv.version_of(2) == (1, 2)


def test_versions_round_trip_through_the_file_and_fork_keeps_the_prefix_versions(
    tmp_path: Path,
) -> None:
    store = ConversationStore(tmp_path)
    conv = chat("q1", "a1", "q2", "a2")
    conv.keep_replaced(1, conv.messages[1:])
    conv.messages = [*conv.messages[:1], msg("assistant", "a1 bis", 5000.0)]
    conv.messages += [msg("user", "q3", 5001.0), msg("assistant", "a3", 5002.0)]
    conv.keep_replaced(3, conv.messages[3:])
    conv.messages = [*conv.messages[:3], msg("assistant", "a3 bis", 6000.0)]
    store.save(conv)
    back = store.load(conv.id)
    assert [(b.after, [m.content for m in b.messages]) for b in back.alternatives] == [
        (conv.messages[0].id, ["a1", "q2", "a2"]),
        (conv.messages[2].id, ["a3"]),
    ]
    fork = store.fork(back, 1)  # q1, a1 bis: keeps a1's versions, not a3's
    assert [[m.content for m in b.messages] for b in fork.alternatives] == [["a1", "q2", "a2"]]
    text = to_markdown(back)
    assert "version 2 of 2" in text and "## Other versions" in text and "a3" in text


branch_graphs = st.lists(
    st.fixed_dictionaries(
        {
            "after": st.one_of(st.sampled_from(["", "m0", "m1", "b0", "b1", "b2"]), st.integers()),
            "messages": st.lists(
                st.fixed_dictionaries(
                    {
                        "role": st.sampled_from(["user", "assistant"]),
                        "content": st.text(max_size=5),
                        "id": st.sampled_from(["m0", "m1", "b0", "b1", "b2", "b3"]),
                        "created": st.floats(0, 10),
                    }
                ),
                max_size=3,
            ),
        }
    ),
    max_size=6,
)


@settings(max_examples=examples(300), deadline=None)
@given(branches=branch_graphs, target=st.sampled_from(["m0", "m1", "b0", "b1", "b2", "b3"]))
def test_any_stored_alternatives_load_and_every_operation_ends(
    branches: list[dict[str, object]], target: str
) -> None:
    """Circular, dangling, repeated-id branch graphs from a damaged file: load or a clear
    error; reveal and switching end; no message is lost by switching."""
    data = {
        "format": 2,
        "id": "c1",
        "messages": [
            {"role": "user", "content": "x", "id": "m0"},
            {"role": "assistant", "content": "y", "id": "m1"},
        ],
        "alternatives": branches,
    }
    try:
        conv = Conversation.from_dict(json.loads(json.dumps(data)))
    except ConversationError:
        return
    before = sorted(m.id for m in conv.every_message())
    assert len(set(before)) == len(before)  # ids made unique
    conv.reveal(target)
    for i in range(10):
        if i >= len(conv.messages):
            break
        position, count = conv.version_of(i)
        assert 1 <= position <= count
        conv.switch_version(i, count + 1 - position)
    assert sorted(m.id for m in conv.every_message()) == before


# -- in the window (fake engine) -----------------------------------------------------------


@pytest.fixture()
def fake() -> FakeEngine:
    return FakeEngine(reply="first reply")


def test_regenerate_keeps_the_old_reply_and_the_arrows_switch_back(
    qtbot: QtBot, window: MainWindow, fake: FakeEngine, tmp_path: Path
) -> None:
    with qtbot.waitSignal(window.replyEnded, timeout=5000):
        send(qtbot, window, "Hello")
    fake.reply = "second reply"
    time.sleep(0.01)  # versions are ordered by time
    with qtbot.waitSignal(window.replyEnded, timeout=5000):
        window.regenerate()
    shown = window.transcript.toPlainText()
    assert "second reply" in shown and "2/2" in shown and "first reply" not in shown
    window._on_message_action("prev-version", 1)
    shown = window.transcript.toPlainText()
    assert "first reply" in shown and "1/2" in shown and "second reply" not in shown
    saved = ConversationStore(data_dirs(tmp_path / "data").root).load(window.conversation.id)
    assert [m.content for m in saved.messages] == ["Hello", "first reply"]
    assert [m.content for m in saved.every_message()] == ["Hello", "first reply", "second reply"]
    # Search finds the version not shown, and the hit shows it.
    window._on_message_action("next-version", 1)
    assert window.messages[1].content == "second reply"
    hidden = saved.every_message()[1]
    assert window.session.reveal(hidden.id) == 1
    assert window.messages[1].content == "first reply"


def test_an_edit_keeps_the_branch_it_replaces(
    qtbot: QtBot, window: MainWindow, fake: FakeEngine
) -> None:
    for text in ("one", "two"):
        with qtbot.waitSignal(window.replyEnded, timeout=5000):
            send(qtbot, window, text)
    window._on_message_action("edit", 0)
    window.chat_input.clear()
    with qtbot.waitSignal(window.replyEnded, timeout=5000):
        send(qtbot, window, "one, edited")
    assert window.messages[0].content == "one, edited"
    assert len(window.messages) == 2
    assert "2/2" in window.transcript.toPlainText()
    window._on_message_action("prev-version", 0)
    assert [m.content for m in window.messages] == ["one", "first reply", "two", "first reply"]


def test_an_edit_that_fails_keeps_the_edited_message_and_the_old_branch(
    qtbot: QtBot, window: MainWindow, fake: FakeEngine
) -> None:
    with qtbot.waitSignal(window.replyEnded, timeout=5000):
        send(qtbot, window, "one")
    window._on_message_action("edit", 0)
    window.chat_input.clear()
    fake.fail_with = RuntimeError("the server went away")
    with qtbot.waitSignal(window.replyEnded, timeout=5000) as ended:
        send(qtbot, window, "one, edited")
    assert ended.args == ["failed"]
    assert [(m.role, m.content) for m in window.messages] == [("user", "one, edited")]
    assert [m.content for m in window.conversation.every_message()] == [
        "one, edited",
        "one",
        "first reply",
    ]
    assert window.chat_input.toPlainText() == ""


# -- what a failed or stopped turn gives back ----------------------------------------------


class StubLink:
    def __init__(self) -> None:
        self.n = 0

    def generate(self, conv_id: str, messages: object, params: object) -> int:
        self.n += 1
        return self.n

    def stop(self) -> None: ...
    def reset(self) -> None: ...
    def restore_snapshot(self, conv_id: str) -> None: ...
    def drop_snapshot(self, conv_id: str) -> None: ...


class StubView:
    def __init__(self) -> None:
        self.notices: list[str] = []

    def show_conversation(self, conv: object, opened: bool, restoring: bool) -> None: ...
    def reply_begun(self, shown: object, added_user: bool) -> None: ...
    def reply_ended(self, text: str, metrics: object, error: str) -> None: ...
    def open_failed(self, message: str) -> None: ...
    def notice(self, text: str) -> None:
        self.notices.append(text)

    def row_saved(self, conv_id: str) -> None: ...
    def row_removed(self, conv_id: str) -> None: ...


@pytest.fixture()
def session(tmp_path: Path) -> ChatSession:
    return ChatSession(ConversationStore(tmp_path), StubLink(), StubView())


def test_a_stop_whose_event_carries_no_text_keeps_what_was_streamed(
    session: ChatSession,
) -> None:
    """A backend that ends a stopped reply with empty text (a server stopped on quit)."""
    session.send("Tell me", SamplingParams())
    rid = session.request_id
    assert rid is not None
    session.on_tokens(rid, "Once upon")
    session.on_tokens(rid, " a time")
    session.on_cancelled(rid, "", MessageMetrics())
    saved = session.store.load(session.conversation.id)
    assert [m.content for m in saved.messages] == ["Tell me", "Once upon a time"]


def test_a_failure_part_way_keeps_the_text_shown_so_far(session: ChatSession) -> None:
    session.send("Tell me", SamplingParams())
    rid = session.request_id
    assert rid is not None
    session.on_tokens(rid, "Once upon")
    session.on_failed(rid, "The server closed the connection.")
    saved = session.store.load(session.conversation.id)
    assert [m.content for m in saved.messages] == ["Tell me", "Once upon"]


def test_a_regenerate_that_fails_restores_the_reply(session: ChatSession) -> None:
    session.send("Tell me", SamplingParams())
    rid = session.request_id
    assert rid is not None
    session.on_finished(rid, "A story.", MessageMetrics())
    assert session.regenerate(SamplingParams())
    session.on_failed(session.request_id or 0, "no room")
    assert [m.content for m in session.conversation.messages] == ["Tell me", "A story."]
    assert not session.conversation.alternatives


def test_a_full_conversation_refuses_the_message_and_writes_nothing(
    session: ChatSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The transcript never grows past what the store reads back."""
    import app.chat.transcript_writer as writer_module

    monkeypatch.setattr(writer_module, "MAX_TRANSCRIPT_BYTES", writer_module.REPLY_ROOM + 10)
    assert not session.send("x" * 100, SamplingParams())
    assert session.conversation.messages == []
    assert "This conversation is full" in session._view.notices[-1]  # type: ignore[attr-defined]


def test_the_store_never_writes_a_transcript_it_could_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import app.chat.store as store_module

    monkeypatch.setattr(store_module, "MAX_TRANSCRIPT_BYTES", 2000)
    store = ConversationStore(tmp_path)
    conv = chat("q", "a" * 5000)
    with pytest.raises(ConversationError, match="over the"):
        store.save(conv)
    assert not store.transcript_path(conv.id).exists()


def test_regenerate_after_an_imported_unanswered_question_answers_it(
    qtbot: QtBot, window: MainWindow, fake: FakeEngine
) -> None:
    """A transcript left by a crash, or an import, ends with a user turn: regenerate
    answers it instead of replacing it with another version of the reply before it."""
    data = chat("q1", "a1", "the unanswered question").to_dict()
    conv = window.store.import_json(json.dumps(data))
    with qtbot.waitSignal(window.conversationOpened, timeout=5000):
        window.open_conversation(conv.id)
    assert "not answered yet" in window.transcript.toPlainText()
    with qtbot.waitSignal(window.replyEnded, timeout=5000):
        window.regenerate()
    assert [m.content for m in window.conversation.messages] == [
        "q1",
        "a1",
        "the unanswered question",
        "first reply",
    ]
    assert not window.conversation.alternatives


def test_search_finds_a_version_not_shown_and_the_hit_shows_it(
    qtbot: QtBot, window: MainWindow, fake: FakeEngine
) -> None:
    fake.reply = "about lighthouses"
    with qtbot.waitSignal(window.replyEnded, timeout=5000):
        send(qtbot, window, "Hello")
    fake.reply = "about harbours"
    time.sleep(0.01)
    with qtbot.waitSignal(window.replyEnded, timeout=5000):
        window.regenerate()
    hits = window.store.search("lighthouses")
    assert len(hits) == 1 and hits[0].index >= len(window.conversation.messages)
    window.search_jump.open_at(hits[0].conv_id, hits[0].index, "lighthouses")
    assert window.conversation.messages[1].content == "about lighthouses"
    assert "1/2" in window.transcript.toPlainText()
