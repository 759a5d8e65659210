"""The search index repairs itself from the transcripts, and never follows a link.

A damaged FTS5 table used to be taken for "this SQLite has no FTS5" and switched
search off for good; a ``-wal`` that is a directory did the same; the index file,
its journal and the transcripts were read and written through links out of the
data folder.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.chat import search_index
from app.chat.conversation import Conversation, Message
from app.chat.store import ConversationStore
from tests.hypothesis_budget import examples

WORD = "marmalade"


def chat(title: str, text: str) -> Conversation:
    conv = Conversation(title=title)
    conv.messages = [Message("user", text), Message("assistant", "noted")]
    return conv


def saved(root: Path) -> tuple[Conversation, Path]:
    """A data folder with one saved chat; the index closed, as after a quit."""
    store = ConversationStore(root)
    conv = chat("Kept", f"a sentence with the word {WORD}")
    store.save(conv)
    store.index.close()
    return conv, store.index.path


def search_again(root: Path) -> tuple[list[str], str, list[str]]:
    """A fresh start's search: the hits' chats, the index's problem and the notes."""
    store = ConversationStore(root)
    try:
        hits = [h.conv_id for h in store.search(WORD)]
        return hits, store.index.problem, store.take_notes()
    finally:
        store.index.close()


DAMAGE = {
    "fts5 format version": "UPDATE messages_config SET v = 99 WHERE k = 'version'",
    "structure record": "UPDATE messages_data SET block = x'0102030405' WHERE id = 10",
    "leaf pages gone": "DELETE FROM messages_data WHERE id > 10",
    "shadow table gone": "DROP TABLE messages_data",
    "content changed": "UPDATE messages_content SET c0 = 'other words'",
}


@pytest.mark.parametrize("sql", DAMAGE.values(), ids=DAMAGE.keys())
def test_a_damaged_fts5_table_is_rebuilt(tmp_path: Path, sql: str) -> None:
    conv, path = saved(tmp_path)
    with sqlite3.connect(path, isolation_level=None) as db:
        db.execute(sql)
    db.close()
    hits, problem, notes = search_again(tmp_path)
    assert (hits, problem) == ([conv.id], "")
    assert any("rebuilt from the conversations" in n for n in notes), notes
    assert path.with_name(path.name + ".bad").is_file()  # the damaged file is kept aside
    hits, problem, notes = search_again(tmp_path)  # and the next start is clean
    assert (hits, problem, notes) == ([conv.id], "", [])


@pytest.mark.parametrize("suffix", ["", "-wal", "-shm", "-journal"])
@pytest.mark.parametrize("kind", ["directory", "pipe"])
def test_side_files_that_are_not_files_are_set_aside(
    tmp_path: Path, suffix: str, kind: str
) -> None:
    conv, path = saved(tmp_path)
    odd = path.with_name(path.name + suffix)
    odd.unlink(missing_ok=True)
    if kind == "directory":
        odd.mkdir()
        (odd / "inside").write_text("kept")
    else:
        os.mkfifo(odd)
    hits, problem, notes = search_again(tmp_path)
    assert (hits, problem) == ([conv.id], "")
    assert any(odd.name in n for n in notes), notes
    aside = odd.with_name(odd.name + ".bad")
    assert (aside / "inside").read_text() == "kept" if kind == "directory" else aside.is_fifo()


@pytest.mark.parametrize("suffix", ["", "-wal", "-shm"])
def test_the_index_is_never_written_through_a_link(tmp_path: Path, suffix: str) -> None:
    data = tmp_path / "data"
    conv, path = saved(data)
    outside = tmp_path / "outside.sqlite3"
    outside.write_bytes(path.read_bytes() if not suffix else b"not the app's")
    before = outside.read_bytes()
    link = path.with_name(path.name + suffix)
    link.unlink(missing_ok=True)
    link.symlink_to(outside)
    hits, problem, _notes = search_again(data)
    assert (hits, problem) == ([conv.id], "")
    assert outside.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "outside.sqlite3"]
    assert not link.is_symlink()


def test_a_transcript_that_is_a_link_is_not_indexed(tmp_path: Path) -> None:
    data = tmp_path / "data"
    conv, _path = saved(data)
    secret = chat("Secret", "the vault code is xylophone")
    elsewhere = tmp_path / "elsewhere"
    ConversationStore(elsewhere).save(secret)
    target = elsewhere / "conversations" / f"{secret.id}.json"
    (data / "conversations" / f"{secret.id}.json").symlink_to(target)
    store = ConversationStore(data)
    try:
        assert store.search("xylophone") == []
        assert [h.conv_id for h in store.search(WORD)] == [conv.id]
    finally:
        store.index.close()


def test_a_sqlite_without_fts5_switches_search_off_and_touches_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _conv, path = saved(tmp_path)
    before = path.read_bytes()
    monkeypatch.setattr(search_index, "fts5_available", lambda: False)
    hits, problem, notes = search_again(tmp_path)
    assert (hits, problem, notes) == ([], search_index.NO_FTS5, [])
    assert path.read_bytes() == before and not path.with_name(path.name + ".bad").exists()


def test_fts5_is_asked_of_sqlite() -> None:
    assert search_index.fts5_available()  # this test suite's Python has it


TABLES = ["messages_data", "messages_idx", "messages_content", "messages_docsize"]
TABLES += ["messages_config", "docs", "meta"]
VALUES = st.one_of(
    st.binary(max_size=40),
    st.integers(-(2**63), 2**63 - 1),
    st.text(max_size=20),
    st.none(),
    st.floats(allow_nan=True),
)


@settings(
    max_examples=examples(80),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    table=st.sampled_from(TABLES),
    action=st.sampled_from(["delete", "set", "insert"]),
    column=st.integers(0, 3),
    value=VALUES,
)
def test_any_damage_to_the_tables_never_loses_a_search(
    tmp_path_factory: pytest.TempPathFactory, table: str, action: str, column: int, value: object
) -> None:
    root = tmp_path_factory.mktemp("idx")
    conv, path = saved(root)
    with sqlite3.connect(path, isolation_level=None) as db:
        names = [r[1] for r in db.execute(f"PRAGMA table_info({table})")]
        name = names[column % len(names)]
        try:
            if action == "delete":
                db.execute(f"DELETE FROM {table}")
            elif action == "set":
                db.execute(f"UPDATE {table} SET {name} = ?", (value,))
            else:
                row = [value if i == column % len(names) else None for i in range(len(names))]
                db.execute(f"INSERT INTO {table} VALUES({','.join('?' * len(row))})", row)
        except sqlite3.Error:
            pass  # a constraint refused it: the file is as it was
    db.close()
    hits, problem, _notes = search_again(root)
    assert (hits, problem) == ([conv.id], "")
