"""Saved conversations on disk: LRU pruning, damaged files, round trips, kill -9 safety."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from app.chat.conversation import (
    TITLE_CHARS,
    Conversation,
    ConversationError,
    Message,
)
from app.chat.metrics_record import metrics_to_dict
from app.chat.snapshot import SnapshotHeader, read_snapshot, write_snapshot
from app.chat.store import ConversationStore
from app.chat.transcript_markdown import to_markdown
from app.engine.backend import KvState
from app.engine.metrics import MessageMetrics
from tests.conftest import ROOT


@pytest.fixture()
def store(tmp_path: Path) -> ConversationStore:
    return ConversationStore(tmp_path / "data")


def chat(n: int = 2) -> Conversation:
    conv = Conversation(model_name="tiny.gguf", system_prompt="Be brief.")
    for i in range(n):
        conv.messages.append(Message("user" if i % 2 == 0 else "assistant", f"text number {i}"))
    return conv


# -- LRU pruning ---------------------------------------------------------------------------


def make_snapshots(
    store: ConversationStore, sizes: dict[str, int], start: float = 1_000_000.0
) -> None:
    """Snapshots (and transcripts) in ``sizes`` order, oldest first, 100 s apart."""
    for i, (conv_id, size) in enumerate(sizes.items()):
        conv = Conversation(id=conv_id, messages=[Message("user", conv_id)])
        store.save(conv)
        path = store.snapshot_path(conv_id)
        path.write_bytes(b"\0" * size)
        os.utime(path, (start + 100 * i, start + 100 * i))


def test_prune_drops_least_recently_used_first_within_budget(store: ConversationStore) -> None:
    sizes = {"a": 300_000, "b": 100_000, "c": 200_000, "d": 100_000, "e": 50_000}
    make_snapshots(store, sizes)
    assert store.total_snapshot_bytes() == 750_000
    store.budget_bytes = 240_000
    dropped = store.prune(keep=frozenset({"b"}))
    # Oldest first, skipping the kept one, until the rest fits: a, c, then d.
    assert dropped == ["a", "c", "d"]
    assert store.total_snapshot_bytes() <= store.budget_bytes
    assert store.snapshot_bytes("b") == 100_000 and store.snapshot_bytes("e") == 50_000
    for conv_id in sizes:  # transcripts are never dropped
        assert store.load(conv_id).messages[0].content == conv_id
    listed = {s.id: s.snapshot_bytes for s in store.list()}
    assert listed == {"a": 0, "b": 100_000, "c": 0, "d": 0, "e": 50_000}
    assert store.prune() == []  # already within budget


def test_prune_stops_as_soon_as_the_total_fits(store: ConversationStore) -> None:
    make_snapshots(store, {"a": 100, "b": 100, "c": 100, "d": 100})
    store.budget_bytes = 300
    assert store.prune() == ["a"]
    store.budget_bytes = 10_000
    assert store.prune() == []
    assert store.total_snapshot_bytes() == 300


def test_touch_snapshot_makes_it_most_recent(store: ConversationStore) -> None:
    make_snapshots(store, {"a": 100, "b": 100, "c": 100})
    store.touch_snapshot("a")  # now the most recent; b is the least
    store.touch_snapshot("missing")  # no snapshot: nothing happens
    store.budget_bytes = 200
    assert store.prune() == ["b"]
    store.budget_bytes = 100
    assert store.prune() == ["c"]
    assert store.snapshot_bytes("a") == 100


def test_prune_never_drops_kept_snapshots_even_over_budget(store: ConversationStore) -> None:
    make_snapshots(store, {"big": 5_000, "x": 100, "y": 100})
    store.budget_bytes = 1_000
    dropped = store.prune(keep=frozenset({"big"}))
    assert sorted(dropped) == ["x", "y"]
    assert store.snapshot_bytes("big") == 5_000
    assert {s.id for s in store.list()} == {"big", "x", "y"}


def test_prune_clears_only_stale_temp_files(store: ConversationStore) -> None:
    make_snapshots(store, {"a": 100})
    stale = store.snapshots_dir / ".a.lpkv.old1.tmp"
    fresh = store.snapshots_dir / ".a.lpkv.new1.tmp"
    for path in (stale, fresh):
        path.write_bytes(b"partial")
    old = time.time() - 2 * 3600
    os.utime(stale, (old, old))
    assert store.total_snapshot_bytes() == 100  # temp files are not snapshots
    store.prune()
    assert not stale.exists() and fresh.exists()
    assert store.snapshot_bytes("a") == 100


# -- damaged transcripts --------------------------------------------------------------------

GOOD = {"format": 1, "id": "broken", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"{not json", "broken.json: damaged"),
        (b"", "broken.json: damaged"),
        (json.dumps({**GOOD, "format": 99}).encode(), "broken.json: unknown format 99"),
        (json.dumps({**GOOD, "format": None}).encode(), "unknown format None"),
        (
            json.dumps({**GOOD, "messages": [{"role": "robot", "content": "x"}]}).encode(),
            "broken.json: message 1 has no valid role",
        ),
        (
            json.dumps({**GOOD, "messages": [{"role": "user", "content": "x"}, "text"]}).encode(),
            "broken.json: message 2 has no valid role",
        ),
        (
            json.dumps({**GOOD, "messages": [{"role": "user", "content": 5}]}).encode(),
            "message 1 has no text",
        ),
        (json.dumps({**GOOD, "messages": "hi"}).encode(), "broken.json: no message list"),
        (b"[1, 2, 3]", "broken.json: not a JSON object"),
        (b'"a string"', "broken.json: not a JSON object"),
        (json.dumps({**GOOD, "id": "other"}).encode(), "broken.json: holds conversation other"),
        (json.dumps({**GOOD, "id": "../x"}).encode(), "broken.json: bad id '../x'"),
        (b"\xff\xfe\x00garbage", "broken.json: damaged (not UTF-8"),
    ],
    ids=[
        "invalid-json",
        "empty",
        "wrong-format",
        "no-format",
        "bad-role",
        "message-not-object",
        "content-not-text",
        "messages-not-list",
        "list",
        "string",
        "other-id",
        "bad-id",
        "not-utf8",
    ],
)
def test_damaged_transcript_is_reported_not_fatal(
    store: ConversationStore, content: bytes, expected: str
) -> None:
    good = chat()
    store.save(good)
    store.transcript_path("broken").write_bytes(content)
    with pytest.raises(ConversationError) as info:
        store.load("broken")
    assert expected in str(info.value)
    assert "\n" not in str(info.value)

    listed = {s.id: s for s in store.list()}  # never raises
    notes = store.take_notes()
    assert listed[good.id].error == "" and listed[good.id].n_messages == 2
    if "unknown format 99" in expected:  # a newer version's file stays, listed with the reason
        assert set(listed) == {good.id, "broken"} and notes == []
        damaged = listed["broken"]
        assert expected in damaged.error
        assert "broken.json" in damaged.title and damaged.n_messages == 0
    else:  # damaged: set aside as .bad with a note; the others load
        assert set(listed) == {good.id}
        [note] = notes
        assert expected in note and note.endswith("set aside as broken.json.bad.")
        assert (store.conversations_dir / "broken.json.bad").read_bytes() == content


def test_missing_transcript(store: ConversationStore) -> None:
    with pytest.raises(ConversationError, match="no such conversation"):
        store.load("nothere")


def test_list_skips_files_that_are_not_conversations(store: ConversationStore) -> None:
    conv = chat()
    store.save(conv)
    (store.conversations_dir / f".{conv.id}.json.abc123.tmp").write_text("{partial")
    (store.conversations_dir / "notes.txt").write_text("hello")
    (store.conversations_dir / "some-thing.json").write_text("{}")
    assert [s.id for s in store.list()] == [conv.id]


# -- transcripts ----------------------------------------------------------------------------


def test_save_load_round_trip_keeps_everything(store: ConversationStore) -> None:
    conv = chat(3)
    conv.title = "Sea & sky — “quoted” ünïcode"
    conv.n_tokens = 321
    conv.forked_from = "abc123"
    conv.messages[0].token_offset = 0
    conv.messages[1].token_offset = 17
    metrics = MessageMetrics(
        prompt_tokens=17,
        cached_tokens=3,
        evaluated_tokens=14,
        prefill_ms=12.5,
        generated_tokens=3,
        token_times_ms=[20.0, 31.25, 40.5],
        stop_reason="eos",
        n_ctx=2048,
        seed=7,
        cache_note="",
        turn_offset=0,
    )
    conv.messages[1].metrics = metrics_to_dict(metrics)
    store.save(conv)
    loaded = store.load(conv.id)
    assert loaded == conv
    assert loaded.messages[1].message_metrics() == metrics
    assert loaded.messages[0].message_metrics() is None
    assert loaded.messages[2].token_offset is None
    [summary] = store.list()
    assert (summary.id, summary.title, summary.n_messages, summary.n_tokens) == (
        conv.id,
        conv.title,
        3,
        321,
    )
    assert summary.model_name == "tiny.gguf" and summary.error == ""


def test_list_is_newest_first(store: ConversationStore) -> None:
    first, second = chat(), chat()
    store.save(first)
    store.save(second)
    store.save(first)  # saved last: updated most recently
    assert [s.id for s in store.list()] == [first.id, second.id]


def test_rename_sets_a_custom_title(store: ConversationStore) -> None:
    conv = chat()
    conv.auto_title()
    store.save(conv)
    renamed = store.rename(conv.id, "  My   new\n title ")
    assert renamed.title == "My new title" and renamed.title_is_custom
    loaded = store.load(conv.id)
    assert loaded.title == "My new title" and loaded.title_is_custom
    loaded.messages.insert(0, Message("user", "something else entirely"))
    loaded.auto_title()  # a custom title is kept
    assert loaded.title == "My new title"


def test_auto_title_truncates_the_first_user_message() -> None:
    conv = Conversation(messages=[Message("assistant", "Hello!")])
    conv.auto_title()
    assert conv.title == "New chat"
    conv.messages.append(Message("user", "  Tell me\n\nabout   " + "the sea " * 30))
    conv.auto_title()
    assert len(conv.title) == TITLE_CHARS and conv.title.endswith("…")
    assert conv.title.startswith("Tell me about the sea the sea")
    short = Conversation(messages=[Message("user", "Short  question?")])
    short.auto_title()
    assert short.title == "Short question?"


def test_fork_copies_messages_up_to_an_index(store: ConversationStore) -> None:
    conv = chat(4)
    conv.title = "Original"
    conv.n_tokens = 99
    store.save(conv)
    fork = store.fork(conv, 1)
    assert fork.id != conv.id and fork.forked_from == conv.id
    assert [m.content for m in fork.messages] == ["text number 0", "text number 1"]
    assert fork.title == "Original (fork)" and fork.n_tokens == 0
    assert fork.system_prompt == conv.system_prompt
    assert store.load(fork.id) == fork
    assert len(store.load(conv.id).messages) == 4  # the original is unchanged
    fork.messages[0].content = "changed"
    assert conv.messages[0].content == "text number 0"  # a deep copy
    assert {s.id for s in store.list()} == {conv.id, fork.id}


@pytest.mark.parametrize("upto", [-1, 4, 100])
def test_fork_with_a_bad_index_raises(store: ConversationStore, upto: int) -> None:
    conv = chat(4)
    store.save(conv)
    with pytest.raises(ConversationError, match="cannot fork"):
        store.fork(conv, upto)
    assert [s.id for s in store.list()] == [conv.id]


def test_delete_removes_transcript_and_snapshot(store: ConversationStore) -> None:
    conv, other = chat(), chat()
    store.save(conv)
    store.save(other)
    store.snapshot_path(conv.id).write_bytes(b"kv")
    store.delete_transcript(conv.id)
    store.drop_snapshot(conv.id)  # the session has the engine thread do this
    assert not store.transcript_path(conv.id).exists()
    assert not store.snapshot_path(conv.id).exists()
    assert [s.id for s in store.list()] == [other.id]
    store.delete_transcript(conv.id)  # already gone: no error
    store.drop_snapshot(conv.id)


@pytest.mark.parametrize("bad", ["../x", "", "a/b", "a.b", "..", "x y", "é", "/etc/passwd"])
def test_invalid_ids_are_refused(store: ConversationStore, bad: str) -> None:
    for call in (
        store.transcript_path,
        store.snapshot_path,
        store.load,
        store.delete_transcript,
        store.touch_snapshot,
        store.drop_snapshot,
        store.snapshot_bytes,
    ):
        with pytest.raises(ConversationError, match="invalid conversation id"):
            call(bad)
    with pytest.raises(ConversationError, match="invalid conversation id"):
        store.save(Conversation(id=bad))
    with pytest.raises(ConversationError, match="invalid conversation id"):
        store.rename(bad, "title")


def test_import_of_an_export_gets_a_new_id(store: ConversationStore) -> None:
    conv = chat(3)
    conv.title = "Exported"
    conv.n_tokens = 50
    exported = json.dumps(conv.to_dict())
    imported = store.import_json(exported)
    assert imported.id != conv.id and imported.id.isalnum()
    assert imported.n_tokens == 0
    assert imported.title == "Exported"
    assert [(m.role, m.content) for m in imported.messages] == [
        (m.role, m.content) for m in conv.messages
    ]
    assert store.load(imported.id) == imported
    again = store.import_json(exported)
    assert again.id not in (conv.id, imported.id)
    assert len(store.list()) == 2


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("not json at all", "not valid JSON"),
        ("", "not valid JSON"),
        ("[]", "imported file: not a JSON object"),
        ('{"format": 1}', "imported file: no message list"),
        ('{"format": 3, "messages": []}', "imported file: unknown format 3"),
        ('{"format": 1, "messages": [{"role": "x", "content": "y"}]}', "no valid role"),
    ],
)
def test_import_of_garbage_is_refused(store: ConversationStore, text: str, expected: str) -> None:
    with pytest.raises(ConversationError, match=expected):
        store.import_json(text)
    assert store.list() == []


def test_markdown_export_contains_the_texts() -> None:
    conv = chat(2)
    conv.title = "About the sea"
    md = to_markdown(conv)
    assert md.startswith("# About the sea\n")
    for text in (
        "tiny.gguf",
        "Be brief.",
        "text number 0",
        "text number 1",
        "**You**",
        "**Assistant**",
    ):
        assert text in md
    assert md.index("text number 0") < md.index("text number 1")
    assert to_markdown(Conversation()).startswith("# Conversation")


# -- kill -9 while writing --------------------------------------------------------------------

HEADER = SnapshotHeader(
    model={"name": "fake.gguf", "size": 1234, "sha256": "ab" * 32},
    runtime={"llama_cpp_python": "test"},
    cache={"n_ctx": 4096, "kv_type": "f16", "swa_full": True, "n_swa": 512},
    lora=[],
)

CRASH_WRITER = f"""
import hashlib, os, random, sys
from pathlib import Path
from app.chat.conversation import Message
from app.engine.backend import KvState
from app.chat.snapshot import SnapshotHeader, write_snapshot
from app.chat.store import ConversationStore

store = ConversationStore(Path(sys.argv[1]))
conv_id = sys.argv[2]
rng = random.Random(int(sys.argv[3]))
header = SnapshotHeader(model={HEADER.model!r}, runtime={HEADER.runtime!r},
                        cache={HEADER.cache!r}, lora=[])
conv = store.load(conv_id)
print("ready", flush=True)
i = len(conv.messages)
while True:
    role = "user" if i % 2 == 0 else "assistant"
    conv.messages.append(Message(role, f"message {{i}} " + "x" * rng.randint(0, 4000)))
    conv.n_tokens = i
    store.save(conv)
    state = os.urandom(rng.randint(2 * 1024 * 1024, 4 * 1024 * 1024))
    n = 10 * i
    text = f"{{hashlib.sha256(state).hexdigest()}} {{i}}"
    write_snapshot(store.snapshot_path(conv_id), header,
                   KvState(state, list(range(n)), text, [(0, 0), (n, len(text))]))
    i += 1
"""


def fake_kv(state: bytes, iteration: int) -> KvState:
    """What the writer stores: the text carries the state's hash and the iteration."""
    n = 10 * iteration
    text = f"{hashlib.sha256(state).hexdigest()} {iteration}"
    return KvState(state, list(range(n)), text, [(0, 0), (n, len(text))])


def check_snapshot(path: Path) -> int:
    """The snapshot is one complete version: its state matches the hash written with it."""
    kv = read_snapshot(path, HEADER)
    digest, iteration = kv.text.split(" ")
    assert hashlib.sha256(kv.state).hexdigest() == digest
    assert kv.tokens == list(range(10 * int(iteration)))
    assert kv.marks == [(0, 0), (len(kv.tokens), len(kv.text))]
    return int(iteration)


def test_kill_9_while_saving_leaves_old_or_new_complete_files(tmp_path: Path) -> None:
    root = tmp_path / "data"
    store = ConversationStore(root)
    conv = Conversation(title="crash", messages=[Message("user", "first")])
    store.save(conv)
    write_snapshot(store.snapshot_path(conv.id), HEADER, fake_kv(b"first state", 0))
    rng = random.Random(20240611)
    kills = 0
    n_messages = [1]
    iterations = [check_snapshot(store.snapshot_path(conv.id))]
    interrupted = 0
    seen_temps: set[Path] = set()
    deadline = time.monotonic() + 15
    while kills < 40 and (kills < 20 or time.monotonic() < deadline):
        proc = subprocess.Popen(
            [sys.executable, "-c", CRASH_WRITER, str(root), conv.id, str(kills)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            assert proc.stdout is not None
            ready = proc.stdout.readline()
            assert ready == b"ready\n", proc.stderr.read().decode() if proc.stderr else ""
            time.sleep(rng.uniform(0.0, 0.3))
            proc.send_signal(signal.SIGKILL)
            _, err = proc.communicate(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]  # it was still writing
        kills += 1

        loaded = store.load(conv.id)  # the transcript is always whole
        assert len(loaded.messages) >= n_messages[-1]
        assert [m.content.split(" ")[0] for m in loaded.messages[1:]] == ["message"] * (
            len(loaded.messages) - 1
        )
        n_messages.append(len(loaded.messages))
        path = store.snapshot_path(conv.id)
        if path.exists():
            iterations.append(check_snapshot(path))
        temps = set(root.rglob(".*.tmp"))
        interrupted += bool(temps - seen_temps)  # this kill cut a write short
        seen_temps |= temps
        listed = store.list()  # temp files are never conversations
        assert [(s.id, s.error) for s in listed] == [(conv.id, "")]
        assert listed[0].n_messages == len(loaded.messages)

    assert kills >= 20
    assert n_messages[-1] > n_messages[0]  # the writer made progress between kills
    assert iterations == sorted(iterations) and iterations[-1] > iterations[0]  # never older
    print(f"{kills} kills, {interrupted} left a temp file, {iterations[-1]} snapshot writes")


# -- two threads -----------------------------------------------------------------------------


def indexed(root: Path) -> dict[str, tuple[str, list[str]]]:
    """What the search index holds: id -> (stamp, indexed texts), read with a connection
    of its own."""
    with contextlib.closing(sqlite3.connect(root / "search.sqlite3")) as db:
        stamps = dict(db.execute("SELECT conv_id, stamp FROM docs").fetchall())
        return {
            conv_id: (
                stamp,
                [
                    str(text)
                    for (text,) in db.execute(
                        "SELECT content FROM messages WHERE conv_id = ? ORDER BY rowid",
                        (conv_id,),
                    )
                ],
            )
            for conv_id, stamp in stamps.items()
        }


def test_two_threads_hammering_leave_whole_files_and_the_index_in_step(tmp_path: Path) -> None:
    """The GUI thread and the engine thread at once: saves, renames, deletes, lists and
    searches of the same conversations, with snapshots pruned meanwhile."""
    root = tmp_path / "data"
    store = ConversationStore(root, budget_bytes=3000)
    ids = [Conversation().id for _ in range(4)]
    errors: list[BaseException] = []
    start = threading.Barrier(3)

    def gui(name: str) -> None:
        rng = random.Random(name)
        start.wait()
        for i in range(60):
            conv_id = rng.choice(ids)
            words = [f"{name}w{i}", f"{name}x{i}"]
            conv = Conversation(id=conv_id, messages=[Message("user", w) for w in words])
            action = rng.random()
            if action < 0.6:
                row = store.save_row(conv)
                assert row.id == conv_id and row.n_messages == 2
            elif action < 0.7:
                store.delete_transcript(conv_id)
            elif action < 0.8:
                with contextlib.suppress(ConversationError):  # deleted meanwhile
                    store.rename(conv_id, f"{name} {i}")
            elif action < 0.9:
                store.list()
            else:
                store.search(f"{name}w")

    def engine() -> None:
        start.wait()
        for i in range(120):
            conv_id = ids[i % len(ids)]
            store.snapshot_path(conv_id).write_bytes(b"\0" * 1000)
            store.prune(frozenset({conv_id}))
            store.touch_snapshot(conv_id)

    def guarded(run: Callable[[], None]) -> Callable[[], None]:
        def body() -> None:
            try:
                run()
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)

        return body

    threads = [
        threading.Thread(target=guarded(lambda: gui("a"))),
        threading.Thread(target=guarded(lambda: gui("b"))),
        threading.Thread(target=guarded(engine)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert errors == []

    assert store.take_notes() == []  # nothing was found damaged
    on_disk = {p.stem for p in store.conversations_dir.glob("*.json")}
    assert list(store.conversations_dir.glob(".*.tmp")) == []
    index = indexed(root)
    assert set(index) == on_disk  # nothing deleted is still found, nothing saved is missing
    fresh = ConversationStore(root)  # reads every row from the files
    for conv_id in on_disk:
        conv = store.load(conv_id)  # a whole file
        st = store.transcript_path(conv_id).stat()
        assert index[conv_id] == (
            f"{st.st_size}:{st.st_mtime_ns}",
            [m.content for m in conv.messages],
        )
        assert store.summary(conv_id) == fresh.summary(conv_id)
    assert store.total_snapshot_bytes() <= 3000


@pytest.mark.parametrize("title", ["Sea & sky", "", "t" * 300])
def test_save_row_is_the_row_a_fresh_read_gives(store: ConversationStore, title: str) -> None:
    conv = chat(3)
    conv.title = title  # 300 characters: more than a read keeps
    conv.model_name = "m" * 1200
    conv.n_tokens = 12
    store.snapshot_path(conv.id).write_bytes(b"\0" * 10)
    row = store.save_row(conv)
    assert row.transcript_bytes == store.transcript_path(conv.id).stat().st_size > 0
    assert row == ConversationStore(store.conversations_dir.parent).summary(conv.id)
    assert store.summary(conv.id) == row
    assert store.save(conv) == store.transcript_path(conv.id).stat().st_size


def test_the_row_after_a_save_is_not_read_from_disk(
    store: ConversationStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    conv = chat()
    row = store.save_row(conv)

    def no_read(conv_id: str) -> Conversation:
        raise AssertionError(f"{conv_id} read again")

    monkeypatch.setattr(store, "load", no_read)
    assert store.summary(conv.id) == row
    assert store.list() == [row]
