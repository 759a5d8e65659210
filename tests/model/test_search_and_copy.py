"""Full-text search across saved chats (SQLite FTS5) and copying messages and code blocks."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PySide6.QtCore import Qt, QUrl
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.chat.conversation import Conversation, Message
from app.chat.search_index import HIT_END, HIT_START, SearchIndex, fts_query
from app.chat.store import ConversationStore
from app.util.atomic import atomic_write_text
from tests.hypothesis_budget import examples
from tests.real_window import close, open_window
from ui.chat.message_header import stamp_text
from ui.chat.transcript import TranscriptView
from ui.window.main_window import MainWindow


def chat(title: str, *texts: str) -> Conversation:
    conv = Conversation(title=title)
    for i, text in enumerate(texts):
        conv.messages.append(Message("user" if i % 2 == 0 else "assistant", text))
    return conv


@pytest.fixture()
def store(tmp_path: Path) -> Iterator[ConversationStore]:
    s = ConversationStore(tmp_path / "data")
    yield s
    s.index.close()


# -- the index -------------------------------------------------------------------------


def test_search_finds_a_word_from_the_middle_of_an_old_reply(store: ConversationStore) -> None:
    old = chat("Boats", "Tell me about boats.", "Sailing boats use the wind; a keel keeps them up.")
    other = chat("Cakes", "How do I bake?", "Mix flour and eggs.")
    store.save(old)
    store.save(other)
    hits = store.search("keel")
    assert [(h.conv_id, h.index, h.role, h.title) for h in hits] == [
        (old.id, 1, "assistant", "Boats")
    ]
    assert f"{HIT_START}keel{HIT_END}" in hits[0].snippet
    assert store.search("flour eggs")[0].conv_id == other.id  # every word, any order
    assert store.search("flour wind") == []
    assert store.search("sail")[0].conv_id == old.id  # the last word as a prefix
    assert store.search("SAILING")[0].conv_id == old.id
    assert store.search("   ") == []


def test_saves_deletes_and_outside_changes_keep_the_index_in_step(
    store: ConversationStore,
) -> None:
    conv = chat("Notes", "remember the lighthouse")
    store.save(conv)
    assert store.search("lighthouse")
    conv.messages.append(Message("assistant", "the harbour is calm"))
    store.save(conv)
    assert store.search("harbour")[0].index == 1
    # Written behind the store's back (a crash before indexing, another copy of the app,
    # a restored backup): the next search reads it again.
    conv.messages[0].content = "remember the windmill"
    time.sleep(0.01)
    atomic_write_text(store.transcript_path(conv.id), __import__("json").dumps(conv.to_dict()))
    assert store.search("windmill") and not store.search("lighthouse")
    store.delete_transcript(conv.id)
    assert store.search("windmill") == []
    # A transcript removed outside the app disappears from the results as well.
    again = chat("Again", "zeppelin")
    store.save(again)
    store.transcript_path(again.id).unlink()
    assert store.search("zeppelin") == []


def test_an_unreadable_transcript_is_not_searched_and_the_rest_are(
    store: ConversationStore,
) -> None:
    good = chat("Good", "the quick fox")
    bad = chat("Bad", "the quick hare")
    store.save(good)
    store.save(bad)
    store.transcript_path(bad.id).write_text("{ not json", encoding="utf-8")
    assert [h.conv_id for h in store.search("quick")] == [good.id]


@pytest.mark.parametrize(
    "damage",
    [
        b"this is not a database at all" * 100,
        b"SQLite format 3\x00" + b"\xff" * 4000,
        b"",
    ],
)
def test_a_damaged_index_is_set_aside_and_rebuilt(store: ConversationStore, damage: bytes) -> None:
    conv = chat("Kept", "an important sentence about orchids")
    store.save(conv)
    store.index.close()
    path = store.index.path
    for suffix in ("-wal", "-shm"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)
    path.write_bytes(damage)
    fresh = ConversationStore(path.parent)
    try:
        assert [h.conv_id for h in fresh.search("orchids")] == [conv.id]
        assert fresh.load(conv.id).messages[0].content == conv.messages[0].content
        if damage:
            assert any("search index" in n for n in fresh.take_notes())
            assert list(path.parent.glob("search.sqlite3*.bad"))
    finally:
        fresh.index.close()


def test_an_index_with_a_foreign_schema_is_rebuilt(store: ConversationStore) -> None:
    conv = chat("Kept", "tulips in spring")
    store.save(conv)
    store.index.close()
    path = store.index.path
    for suffix in ("", "-wal", "-shm"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE messages(content TEXT)")  # not an FTS table
    db.execute("CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT)")
    db.execute("INSERT INTO meta VALUES('schema', '1')")
    db.commit()
    db.close()
    fresh = ConversationStore(path.parent)
    try:
        assert [h.conv_id for h in fresh.search("tulips")] == [conv.id]
    finally:
        fresh.index.close()


@settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(st.text(max_size=300))
def test_any_typed_text_is_a_safe_query(store: ConversationStore, text: str) -> None:
    if not store.list():
        store.save(chat("Seed", 'quotes " and NEAR(a b) * OR - ^ {col}: stars'))
    query = fts_query(text)
    assert query.count('"') % 2 == 0
    store.search(text)  # never raises, whatever the operators or quotes


@settings(max_examples=examples(40), deadline=None)
@given(st.binary(max_size=6000), st.integers(0, 5000))
def test_any_bytes_in_the_index_file_never_lose_a_search(
    tmp_path_factory: pytest.TempPathFactory, noise: bytes, at: int
) -> None:
    root = tmp_path_factory.mktemp("idx")
    store = ConversationStore(root)
    conv = chat("Kept", "a sentence with the word marmalade")
    store.save(conv)
    store.index.close()
    path = store.index.path
    # Damage the real file in place: random bytes written over part of it.
    data = bytearray(path.read_bytes())
    data[at : at + len(noise)] = noise
    path.write_bytes(bytes(data))
    for suffix in ("-wal", "-shm"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)
    fresh = ConversationStore(root)
    try:
        assert [h.conv_id for h in fresh.search("marmalade")] == [conv.id]
    finally:
        fresh.index.close()


def test_index_without_fts5_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    index = SearchIndex(tmp_path / "search.sqlite3")

    def no_fts(_self: SearchIndex) -> sqlite3.Connection:
        raise sqlite3.OperationalError("no such module: fts5")

    monkeypatch.setattr(SearchIndex, "_connect", no_fts)
    assert index.search("anything") == []
    assert "FTS5" in index.problem


# -- copy and timestamps -------------------------------------------------------------


def test_copy_a_message_and_each_code_block(qtbot: QtBot) -> None:
    view = TranscriptView()
    qtbot.addWidget(view)
    reply = "Two ways:\n\n```python\nprint('a')\n```\n\nand\n\n```sh\necho b\n```\n"
    msgs = [Message("user", "How do I print?"), Message("assistant", reply)]
    view.show_messages(msgs)
    copied: list[str] = []
    view.copied.connect(copied.append)
    html = view.toHtml()
    assert html.count("copy-code/1/") == 2
    view._on_anchor_clicked(QUrl(f"lamplight://{view._key}/copy/1"))
    assert QApplication.clipboard().text() == reply
    view._on_anchor_clicked(QUrl(f"lamplight://{view._key}/copy-code/1/1"))
    assert QApplication.clipboard().text() == "echo b"
    view._on_anchor_clicked(QUrl(f"lamplight://{view._key}/copy/0"))
    assert QApplication.clipboard().text() == "How do I print?"
    assert copied == ["message", "code block", "message"]
    # A forged link (wrong key, out of range, junk) copies nothing.
    QApplication.clipboard().setText("unchanged")
    for bad in (
        "lamplight://nokey/copy/1",
        f"lamplight://{view._key}/copy-code/1/9",
        f"lamplight://{view._key}/copy/7",
        f"lamplight://{view._key}/copy/x",
    ):
        view._on_anchor_clicked(QUrl(bad))
    assert QApplication.clipboard().text() == "unchanged"


def test_model_text_cannot_make_a_copy_link(qtbot: QtBot) -> None:
    view = TranscriptView()
    qtbot.addWidget(view)
    view.show_messages(
        [Message("assistant", "[x](lamplight://k/copy/0) <a href='lamplight://k/copy/0'>y</a>")]
    )
    assert 'href="lamplight://k/' not in view.toHtml()


def test_headers_show_when_each_message_was_written(qtbot: QtBot) -> None:
    view = TranscriptView()
    qtbot.addWidget(view)
    now = time.time()
    old = time.mktime((2024, 3, 5, 9, 7, 0, 0, 0, -1))
    view.show_messages(
        [Message("user", "hi", created=old), Message("assistant", "yo", created=now)]
    )
    text = view.toPlainText()
    assert "2024-03-05 09:07" in text
    assert time.strftime("%H:%M", time.localtime(now)) in text
    stamp_text(float("nan"))  # never raises
    assert stamp_text(1e300) == ""


# -- in the window, on the real model --------------------------------------------------


@pytest.fixture()
def window(qtbot: QtBot, tmp_path: Path, model_path: Path) -> Iterator[MainWindow]:
    win = open_window(qtbot, tmp_path / "data", model_path, max_tokens=48)
    yield win
    close(win)
    win.store.index.close()


def test_search_opens_the_old_chat_at_the_message(qtbot: QtBot, window: MainWindow) -> None:
    with qtbot.waitSignal(window.replyEnded, timeout=60_000):
        qtbot.keyClicks(window.chat_input, "The lighthouse keeper said")
        qtbot.keyClick(window.chat_input, Qt.Key.Key_Return)
    old_id = window.conversation.id
    reply = window.messages[-1].content
    words = [w for w in reply.split() if w.isalpha() and len(w) > 3]
    assert words, reply
    word = words[len(words) // 2]  # from the middle of the reply
    window.new_chat()
    qtbot.waitUntil(lambda: window.conversation.id != old_id and not window.busy)
    window.sidebar.search.setText(word)
    window.sidebar.run_search()
    hits = window.sidebar.hits
    assert hits.count() >= 1 and hits.isVisibleTo(window)
    ids = [hits.item(i).data(Qt.ItemDataRole.UserRole) for i in range(hits.count())]
    assert old_id in ids
    with qtbot.waitSignal(window.conversationOpened, timeout=30_000):
        hits.itemClicked.emit(hits.item(ids.index(old_id)))
    assert window.conversation.id == old_id
    qtbot.waitUntil(
        lambda: window.transcript.textCursor().selectedText().lower() == word.lower(),
        timeout=5_000,
    )
