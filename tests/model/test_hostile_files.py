"""Hostile and damaged data files: snapshots, transcripts and imports, settings, presets.

Each loader is fuzzed (Hypothesis) with mutations of real files the app wrote:
values replaced by any JSON (huge and negative numbers, NaN, lone surrogates,
wrong types), deep nesting, deleted keys, flipped bytes, truncations and other
encodings. The invariant: a typed Lamplight error or a clean fallback within a
time budget; no other exception; nothing written outside the data directory;
no other file changed. Targeted tests pin each reported case; two run the
real model in child processes with a memory cap (the app's smoke test on a
hostile settings file; llama.cpp reading damaged KV state).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import stat
import struct
import subprocess
import sys
import time
import zlib
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pytestqt.qtbot import QtBot

from app.chat import compaction
from app.chat import store as store_module
from app.chat.conversation import (
    Conversation,
    ConversationError,
    Message,
    new_id,
)
from app.chat.metrics_csv import metrics_csv
from app.chat.metrics_record import metrics_to_dict
from app.chat.session_cache import SessionCache
from app.chat.snapshot import MAGIC, SnapshotError, SnapshotHeader, read_snapshot, write_snapshot
from app.chat.store import ConversationStore
from app.chat.transcript_markdown import to_markdown
from app.config.field_spec import SettingError, check
from app.config.params import check_structured, sampling_to_dict, validate_sampling
from app.config.paths import data_dirs
from app.config.presets import PresetStore
from app.config.setting_records import LoadConfig, SamplingParams
from app.config.setting_specs import SPEC_BY_NAME
from app.config.settings import AppSettings
from app.engine.backend import KvState
from app.engine.metrics import MessageMetrics
from app.util.hashing import FingerprintCache
from tests.conftest import ROOT, make_unreadable
from tests.fakes.engine import FakeEngine
from tests.hostile_json import NEST, mutated, one_line, timed, tree
from tests.hypothesis_budget import examples
from ui.chat.conversation_list import human_time

# Cases per fuzzer (``--hypothesis-profile=deep`` for a longer, random search).
FUZZ = settings(
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# -- helpers ---------------------------------------------------------------------------------

ORIGINALS: dict[Path, bytes] = {}  # files as the app wrote them, before any example


def original_of(path: Path) -> bytes:
    """``path`` as its fixture wrote it (a fixture runs once for all of a test's examples)."""
    if path not in ORIGINALS:
        ORIGINALS[path] = path.read_bytes()
    return ORIGINALS[path]


# -- snapshots --------------------------------------------------------------------------------


@pytest.fixture()
def snapshot_setup(tmp_path: Path) -> tuple[SessionCache, FakeEngine, Path]:
    """A data dir with one real snapshot (the module's writer around fake KV bytes) made for
    the fake engine's model, a disabled LoRA adapter in its header, and a transcript."""
    data = tmp_path / "base" / "data"
    store = ConversationStore(data)
    fake = FakeEngine()
    model = data / "model.gguf"
    model.write_bytes(b"fake model")
    fake.load(model, LoadConfig())
    cache = SessionCache(fake, store, FingerprintCache(data / "fingerprints.json"))
    adapter = data / "adapter.gguf"
    adapter.write_bytes(b"fake adapter")
    entry = {
        "name": adapter.name,
        "path": str(adapter),
        "size": 12,
        "sha256": "00" * 32,
        "scale": 0.5,
        "enabled": False,
    }
    header = cache.header()
    header = SnapshotHeader(header.model, header.runtime, header.cache, [entry])
    rng = random.Random(7)
    text = "The sea is wide. " * 30
    kv = KvState(rng.randbytes(20_000), list(range(300)), text, [(0, 0), (150, 250), (300, 510)])
    conv = Conversation(id="conv1", messages=[Message("user", "hi")])
    store.save(conv)
    write_snapshot(store.snapshot_path("conv1"), header, kv)
    (tmp_path / "base" / "outside").mkdir()
    (tmp_path / "base" / "outside" / "keep.txt").write_text("not the app's")
    return cache, fake, store.snapshot_path("conv1")


def snapshot_file(header: dict[str, Any], payload: bytes, n: int | None = None) -> bytes:
    raw = json.dumps(header).encode()
    return MAGIC + struct.pack("<I", len(raw) if n is None else n) + raw + payload


def parts_of(path: Path) -> tuple[dict[str, Any], bytes]:
    data = path.read_bytes()
    (n,) = struct.unpack("<I", data[4:8])
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def check_restore(cache: SessionCache, path: Path, content: bytes | None) -> None:
    """Restore through SessionCache: a result with a one-line note, or a restore; nothing
    else in the base directory changes; read_snapshot raises only SnapshotError."""
    base = path.parents[2]
    if content is not None:
        path.write_bytes(content)
    before = tree(base)
    result = timed(lambda: cache.restore("conv1"))
    if result.restored:
        assert result.note == "" and result.n_tokens == 300
    else:
        one_line(result.note)
        assert cache.engine.export_state().tokens == []
    try:
        timed(lambda: read_snapshot(path, cache.header()))
    except SnapshotError as exc:
        one_line(str(exc))
    after = tree(base)
    for files in (before, after):  # adapters a header names get fingerprinted
        files.pop("data/fingerprints.json", None)
    assert after == before  # a restore writes nothing (mtime aside)


HUGE_LENGTHS = [2**40, 2**50, 2**63 - 1, 2**63, 2**64, 2**100]


@pytest.mark.parametrize(
    "damage",
    [
        *(f"lengths-{n}" for n in HUGE_LENGTHS),
        "lora-entry-string",
        "lora-entry-list",
        "lora-not-list",
        "lora-scale-nan",
        "lora-path-nul",
        "lora-enabled-missing-adapter",
        "model-list",
        "cache-nested",
        "n_tokens-string",
        "n_tokens-huge",
        "crc-string",
        "format-string",
        "header-deep",
        "header-not-utf8",
        "header-utf16",
        "header-length-max",
        "truncated-payload",
        "trailing-data",
        "negative-token",
    ],
)
def test_damaged_snapshot_headers_fall_back_with_one_line(
    snapshot_setup: tuple[SessionCache, FakeEngine, Path], damage: str
) -> None:
    cache, _, path = snapshot_setup
    head, payload = parts_of(path)
    entry = head["lora"][0]
    changes: dict[str, Any] = {
        "lora-entry-string": {"lora": ["adapter.gguf"]},
        "lora-entry-list": {"lora": [[1, 2]]},
        "lora-not-list": {"lora": {"path": "x"}},
        "lora-scale-nan": {"lora": [{**entry, "scale": math.nan}]},
        "lora-path-nul": {"lora": [{**entry, "path": "a\0b", "enabled": True}]},
        "lora-enabled-missing-adapter": {
            "lora": [{**entry, "path": "/nope.gguf", "enabled": True}]
        },
        "model-list": {"model": [1, 2]},
        "cache-nested": {"cache": {"n_ctx": {"a": [1]}}},
        "n_tokens-string": {"n_tokens": "300"},
        "n_tokens-huge": {"n_tokens": 2**62},
        "crc-string": {"crc32": "0"},
        "format-string": {"format": "1"},
    }
    expected = "damaged header"
    if damage.startswith("lengths-"):
        n = int(damage.split("-")[1])
        content = snapshot_file({**head, "lengths": [n, 1200, 510, 24]}, payload)
        expected = "truncated" if n < 2**63 else "damaged header (lengths)"
    elif damage in changes:
        content = snapshot_file({**head, **changes[damage]}, payload)
        expected = {
            "lora-enabled-missing-adapter": "LoRA adapter adapter.gguf is missing",
            "format-string": "format '1'",
        }.get(damage, expected)
    elif damage == "header-deep":
        raw = b'{"a":' * 50_000 + b"1" + b"}" * 50_000
        content = MAGIC + struct.pack("<I", len(raw)) + raw + payload
    elif damage == "header-not-utf8":
        raw = json.dumps(head).encode().replace(b'"model"', b'"mod\xffl"')
        content = MAGIC + struct.pack("<I", len(raw)) + raw + payload
    elif damage == "header-utf16":
        raw = json.dumps(head).encode("utf-16")
        content = MAGIC + struct.pack("<I", len(raw)) + raw + payload
    elif damage == "header-length-max":
        content = snapshot_file(head, payload, n=2**32 - 1)
    elif damage == "truncated-payload":
        content = snapshot_file(head, payload[:-5000])
        expected = "truncated"
    elif damage == "trailing-data":
        content = snapshot_file(head, payload + b"x")
        expected = "trailing data"
    else:  # a token id below 0, the checksum made to match
        state_len = head["lengths"][0]
        bad = bytearray(payload)
        bad[state_len : state_len + 4] = struct.pack("<i", -5)
        content = snapshot_file({**head, "crc32": zlib.crc32(bad)}, bytes(bad))
        expected = "inconsistent"
    path.write_bytes(content)
    result = timed(lambda: cache.restore("conv1"))
    assert not result.restored
    one_line(result.note)
    assert expected in result.note, result.note
    with pytest.raises(SnapshotError):
        read_snapshot(path, cache.header())


@pytest.mark.parametrize("kind", ["fifo", "directory", "device", "dangling-link", "unreadable"])
def test_a_snapshot_that_is_not_a_regular_file_never_blocks(
    snapshot_setup: tuple[SessionCache, FakeEngine, Path],
    kind: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cache, _, path = snapshot_setup
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)  # opening it for reading would wait for a writer forever
    elif kind == "directory":
        path.mkdir()
    elif kind == "device":
        path.symlink_to("/dev/zero")  # reading it never ends
    elif kind == "dangling-link":
        path.symlink_to(path.parent / "nowhere")
    else:
        path.write_bytes(b"LPKV")
        make_unreadable(path, monkeypatch)
    result = timed(lambda: cache.restore("conv1"))
    assert not result.restored
    one_line(result.note)
    assert {
        "fifo": "named pipe",
        "directory": "directory",
        "device": "device",
        "dangling-link": "no saved cache",
        "unreadable": "could not be read",
    }[kind] in result.note
    assert cache.saved_stack("conv1") is None


def test_a_good_snapshot_still_restores(
    snapshot_setup: tuple[SessionCache, FakeEngine, Path],
) -> None:
    cache, fake, _ = snapshot_setup
    result = cache.restore("conv1")
    assert result.restored and result.n_tokens == 300 and fake.kv_tokens == list(range(300))


@FUZZ
@given(data=st.data())
def test_fuzz_snapshot_files(
    snapshot_setup: tuple[SessionCache, FakeEngine, Path], data: st.DataObject
) -> None:
    """Mutated header JSON (optionally with a matching length and checksum, to reach the
    deeper checks), mutated lengths fields, flipped or cut payload bytes."""
    cache, fake, path = snapshot_setup
    original = original_of(path)  # the fixture runs once
    path.write_bytes(original)
    head, payload = parts_of(path)
    raw_head = json.dumps(head).encode()
    what = data.draw(st.sampled_from(["header", "header", "payload", "whole"]))
    if what == "header":
        new_head = data.draw(mutated(raw_head))
        n = data.draw(st.one_of(st.just(len(new_head)), st.integers(0, 2**32 - 1)))
        body = payload
        if data.draw(st.booleans()):
            try:
                parsed = json.loads(new_head)
                if isinstance(parsed, dict):
                    parsed["crc32"] = zlib.crc32(body)
                    new_head = json.dumps(parsed).encode()
                    n = len(new_head)
            except (ValueError, RecursionError):
                pass
        content = MAGIC + struct.pack("<I", n) + new_head + body
    elif what == "payload":
        body = bytearray(payload)
        for pos in data.draw(st.lists(st.integers(0, len(body) - 1), min_size=1, max_size=4)):
            body[pos] ^= 0xFF
        if data.draw(st.booleans()):
            head = {**head, "crc32": zlib.crc32(body)}  # only the structure checks are left
        content = snapshot_file(head, bytes(body))
    else:
        content = original[: data.draw(st.integers(0, len(original)))]
    check_restore(cache, path, content)
    fake.kv_tokens = []


# -- the snapshot folder ----------------------------------------------------------------------


def test_the_snapshot_folder_tolerates_strays(tmp_path: Path) -> None:
    store = ConversationStore(tmp_path / "data")
    conv = Conversation(messages=[Message("user", "hi")])
    store.save(conv)
    store.snapshot_path(conv.id).write_bytes(b"x" * 100)
    store.snapshot_path("orphan").write_bytes(b"y" * 100)  # its transcript was never written
    snaps = store.snapshots_dir
    strays = {
        ".lpkv": b"hidden",
        "a-b.lpkv": b"bad id",
        "..lpkv": b"dots",
        ("x" * 200) + ".lpkv": b"long id",
        "notes.txt": b"not ours",
    }
    for name, content in strays.items():
        (snaps / name).write_bytes(content)
    (snaps / "dir.lpkv").mkdir()
    os.mkfifo(snaps / "fifo.lpkv")
    (snaps / "zero.lpkv").symlink_to("/dev/zero")
    (snaps / "dangling.lpkv").symlink_to(snaps / "nowhere")
    before = tree(snaps)

    store.drop_orphan_snapshots()
    assert not store.snapshot_path("orphan").exists()
    assert store.total_snapshot_bytes() == 100
    store.budget_bytes = 0
    assert store.prune() == [conv.id]
    assert store.total_snapshot_bytes() == 0
    after = tree(snaps)
    for name in (*strays, "dir.lpkv", "fifo.lpkv", "zero.lpkv", "dangling.lpkv"):
        assert after[name] == before[name], name  # strays are never touched
    assert [s.id for s in store.list()] == [conv.id]


def test_folders_replaced_by_files_are_set_aside(tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    for name in ("conversations", "snapshots", "models", "logs"):
        (root / name).write_text(f"a file called {name}")
    notes: list[str] = []
    dirs = data_dirs(root, notes)
    store = ConversationStore(dirs.root)
    notes += store.take_notes()
    assert len(notes) == 4 and all("was not a folder" in n for n in notes)
    for name in ("conversations", "snapshots", "models", "logs"):
        assert (root / name).is_dir()
        assert (root / f"{name}.bad").read_text() == f"a file called {name}"


# -- conversations ----------------------------------------------------------------------------


def real_conversation(conv_id: str = "") -> Conversation:
    conv = Conversation(model_name="tiny.gguf", system_prompt="Be brief.", project_id=new_id())
    if conv_id:
        conv.id = conv_id
    conv.messages.append(Message("user", "Tell me about the sea — “ünïcode” 😀"))
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
        notes=["a note"],
    )
    conv.messages.append(Message("assistant", "It is wide.", metrics=metrics_to_dict(metrics)))
    for question in ("And deep?", "And cold?"):
        conv.messages += [Message("user", question), Message("assistant", "Yes.")]
    found = compaction.plan(conv)  # a compacted chat: its summary, and the version before
    assert found is not None
    compaction.apply(conv, found, "They asked about the sea.")
    conv.sampling = sampling_to_dict(SamplingParams(stop=("END",)))
    conv.auto_title()
    return conv


@pytest.fixture()
def conv_dir(tmp_path: Path) -> tuple[ConversationStore, list[Conversation], Path]:
    """A data dir with three saved conversations (messages, metrics, settings)."""
    base = tmp_path / "base"
    store = ConversationStore(base / "data")
    convs = [real_conversation() for _ in range(3)]
    for conv in convs:
        store.save(conv)
    (base / "outside").mkdir()
    (base / "outside" / "keep.txt").write_text("not the app's")
    return store, convs, base


def usable(conv: Conversation) -> None:
    """Everything the app does with a loaded conversation works on it."""
    human_time(conv.updated)
    human_time(conv.created)
    to_markdown(conv).encode("utf-8")
    json.dumps(conv.to_dict(), ensure_ascii=False, allow_nan=False).encode("utf-8")
    metrics_csv(conv.messages)
    for m in conv.messages:
        m.content.encode("utf-8")  # what tokenizing does
        metrics = m.message_metrics()
        if metrics is not None:
            metrics.summary()
            metrics.short_text()
    for chat in conv.chat():
        chat.content.encode("utf-8")
    if conv.sampling:
        with contextlib.suppress(SettingError):  # the view keeps its settings then
            validate_sampling(conv.sampling)


def check_list(
    store: ConversationStore, base: Path, target: Path, others: list[Conversation]
) -> None:
    """``store.list()`` with ``target`` damaged: the others load unchanged, ``target`` is
    loaded, listed with a reason, or set aside as .bad with a note; nothing else moves."""
    content = target.read_bytes() if target.is_file() and not target.is_symlink() else None
    before = tree(base)
    rows = timed(store.list)
    notes = store.take_notes()
    after = tree(base)
    by_id = {r.id: r for r in rows}
    for conv in others:
        assert by_id[conv.id].error == "" and store.load(conv.id) == conv
    rel = str(target.relative_to(base))
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    row = by_id.get(target.stem)
    if row is None:  # set aside, with a note
        [note] = notes
        one_line(note)
        assert changed == {rel, rel + ".bad"}
        if content is not None:
            assert after[rel + ".bad"] == content
    else:
        assert notes == [] and changed == set()
        if row.error:
            one_line(row.error)
        else:
            usable(store.load(target.stem))
    for r in rows:
        human_time(r.updated)
    assert sorted(os.listdir(base)) == ["data", "outside"]


@FUZZ
@given(data=st.data())
def test_fuzz_transcripts(
    conv_dir: tuple[ConversationStore, list[Conversation], Path], data: st.DataObject
) -> None:
    store, convs, base = conv_dir
    target = store.transcript_path(convs[0].id)
    for stray in target.parent.glob("*.bad"):
        stray.unlink()
    original = json.dumps(convs[0].to_dict(), indent=1).encode()
    target.write_bytes(data.draw(mutated(original)))
    store._summaries.clear()
    check_list(store, base, target, convs[1:])


@FUZZ
@given(data=st.data())
def test_fuzz_imports(
    conv_dir: tuple[ConversationStore, list[Conversation], Path], data: st.DataObject
) -> None:
    store, convs, base = conv_dir
    exported = json.dumps(convs[0].to_dict(), indent=1).encode()
    content = data.draw(mutated(exported))
    source = base / "outside" / "import.json"
    source.write_bytes(content)
    before = tree(base)
    try:
        conv = timed(lambda: store.import_file(source))
    except ConversationError as exc:
        one_line(str(exc))
        assert tree(base) == before
    else:
        added = set(tree(base)) - set(before)
        assert added == {f"data/conversations/{conv.id}.json"}
        assert store.load(conv.id) == conv
        usable(conv)
        store.delete_transcript(conv.id)
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        return
    try:
        conv = timed(lambda: store.import_json(text))
    except ConversationError as exc:
        one_line(str(exc))
    else:
        usable(conv)
        store.delete_transcript(conv.id)


BAD_TIMES = [1e20, -1e20, math.nan, math.inf, -math.inf, "yesterday", True, None, [1], 2**70]


@pytest.mark.parametrize("value", BAD_TIMES, ids=repr)
def test_impossible_times_are_repaired_and_the_app_lists_everything(
    conv_dir: tuple[ConversationStore, list[Conversation], Path], value: Any
) -> None:
    store, convs, _ = conv_dir
    path = store.transcript_path(convs[0].id)
    doc = convs[0].to_dict()
    doc.update(updated=value, created=value)
    doc["messages"][0]["created"] = value
    path.write_text(json.dumps(doc))
    rows = store.list()
    assert {r.id for r in rows} == {c.id for c in convs} and all(r.error == "" for r in rows)
    conv = store.load(convs[0].id)
    assert 0 <= conv.updated <= time.time() + 5 and conv.updated == path.stat().st_mtime
    usable(conv)


@pytest.mark.parametrize("ts", [1e20, -1e20, math.nan, math.inf, -1.0, 2**70, 253402300800.0])
def test_sidebar_time_formatting_is_total(ts: float) -> None:
    text = human_time(ts)
    assert text and isinstance(text, str)
    assert human_time(1e20) == human_time(math.nan) == "unknown date"


@pytest.mark.parametrize(
    ("where", "depth", "outcome"),
    [("metrics", 10, "loads"), ("metrics", 5000, "set aside"), ("sampling", 50, "set aside")],
)
def test_deep_nesting_in_metrics_and_sampling(
    conv_dir: tuple[ConversationStore, list[Conversation], Path],
    where: str,
    depth: int,
    outcome: str,
) -> None:
    store, convs, base = conv_dir
    doc = convs[0].to_dict()
    if where == "metrics":
        doc["messages"][1]["metrics"]["token_times_ms"] = NEST
    else:
        doc["sampling"]["top_k"] = NEST
    text = json.dumps(doc).replace(json.dumps(NEST), "[" * depth + "1" + "]" * depth)
    path = store.transcript_path(convs[0].id)
    path.write_text(text)
    check_list(store, base, path, convs[1:])
    if outcome == "loads":
        conv = store.load(convs[0].id)
        metrics = conv.messages[1].message_metrics()
        assert metrics is not None and metrics.token_times_ms == [] and metrics.seed == 7
    else:
        assert path.with_name(path.name + ".bad").exists()
    # The same file as an import is refused (or cleaned) and never raises RecursionError.
    try:
        usable(store.import_json(text))
    except ConversationError as exc:
        assert "nested too deeply" in str(exc)


def test_lone_surrogates_are_replaced_so_export_and_generation_work(
    conv_dir: tuple[ConversationStore, list[Conversation], Path],
) -> None:
    store, convs, _ = conv_dir
    doc = convs[0].to_dict()
    doc["title"] = "bad \ud800 title"
    doc["messages"][0]["content"] = "half a pair: \udfff, a whole one: \ud83d\ude00"
    doc["system_prompt"] = "\ud800"
    doc["messages"][1]["metrics"]["notes"] = ["\udc00"]
    path = store.transcript_path(convs[0].id)
    path.write_text(json.dumps(doc))  # ASCII JSON with \\u escapes, as an editor might
    conv = store.load(convs[0].id)
    assert conv.messages[0].content == "half a pair: \ufffd, a whole one: 😀"
    assert conv.title == "bad \ufffd title" and conv.system_prompt == "\ufffd"
    usable(conv)
    store.save(conv)  # and it saves
    imported = store.import_json(json.dumps(doc))
    assert imported.messages[0].content == conv.messages[0].content
    usable(imported)


@pytest.mark.parametrize(
    "bad_id", ["../x", "..", ".", "", "a/b", "a\\b", "x" * 129, "x" * 5000, "é", "a\0b", "CON."]
)
def test_ids_never_become_paths(tmp_path: Path, bad_id: str) -> None:
    base = tmp_path / "base"
    store = ConversationStore(base / "data")
    with pytest.raises(ConversationError, match="invalid conversation id"):
        store.transcript_path(bad_id)
    doc = real_conversation().to_dict()
    doc["id"] = bad_id
    imported = store.import_json(json.dumps(doc))  # an import gets a new id
    assert imported.id != bad_id and store.load(imported.id) == imported
    path = store.conversations_dir / "ok1.json"
    path.write_text(json.dumps(doc))
    assert store.list() == [store.summary(imported.id)]  # the file holding it is set aside
    assert path.with_name("ok1.json.bad").exists()
    assert sorted(os.listdir(base)) == ["data"]
    settings_file = base / "settings.json"
    settings_file.write_text(json.dumps({"last_conversation": bad_id}))
    assert AppSettings.load_from(settings_file).last_conversation is None


@pytest.mark.parametrize(
    "content",
    [
        {"format": 1, "id": "x1", "messages": {"role": "user"}},
        {"format": 1, "id": "x1", "messages": [{"role": "robot", "content": "x"}]},
        {"format": 1, "id": "x1", "messages": [{"role": "user", "content": ["x"]}]},
        {"format": 1, "id": "x1", "messages": [None]},
        {"format": "1", "id": "x1", "messages": []},
        [],
        "x",
    ],
)
def test_structurally_damaged_transcripts_are_set_aside_with_a_note(
    conv_dir: tuple[ConversationStore, list[Conversation], Path], content: Any
) -> None:
    store, convs, base = conv_dir
    path = store.conversations_dir / "x1.json"
    path.write_text(json.dumps(content))
    check_list(store, base, path, convs)
    assert not path.exists() and path.with_name("x1.json.bad").exists()
    # ... and a second damaged file with the same name does not overwrite the first.
    path.write_text("{")
    store.list()
    [note] = store.take_notes()
    assert "x1.json.2.bad" in note and path.with_name("x1.json.2.bad").read_text() == "{"


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_a_transcript_that_is_not_a_file_is_set_aside_without_blocking(
    conv_dir: tuple[ConversationStore, list[Conversation], Path], kind: str
) -> None:
    store, convs, base = conv_dir
    path = store.conversations_dir / "x2.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to("/dev/zero")
    check_list(store, base, path, convs)


def test_newer_unreadable_or_huge_transcripts_stay_where_they_are(
    conv_dir: tuple[ConversationStore, list[Conversation], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """They may be fine (a newer version, a permission to fix, a very long chat): listed
    with the reason, never moved."""
    store, _, base = conv_dir
    newer = store.conversations_dir / "n1.json"
    newer.write_text(json.dumps({"format": 3, "id": "n1", "messages": []}))
    huge = store.conversations_dir / "h1.json"
    huge.write_text(json.dumps({**real_conversation("h1").to_dict(), "pad": "x" * 5000}))
    monkeypatch.setattr(store_module, "MAX_TRANSCRIPT_BYTES", 4000)
    rows = {r.id: r for r in store.list()}
    assert store.take_notes() == []
    assert "newer Lamplight" in rows["n1"].error and "too large" in rows["h1"].error
    assert newer.exists() and huge.exists()
    with pytest.raises(ConversationError, match="too large"):
        store.import_json(huge.read_text())
    with pytest.raises(ConversationError, match="too large"):
        store.import_file(huge)
    fifo = base / "outside" / "pipe.json"
    os.mkfifo(fifo)
    with pytest.raises(ConversationError, match="named pipe"):
        timed(lambda: store.import_file(fifo))


# -- settings and presets --------------------------------------------------------------------


@pytest.fixture()
def settings_dir(tmp_path: Path) -> Path:
    """A data dir with real settings (not the defaults), presets and a conversation."""
    base = tmp_path / "base"
    data = base / "data"
    data.mkdir(parents=True)
    AppSettings(
        model_path="/models/m.gguf",
        system_prompt="Be kind.",
        last_conversation="abc123",
        imported_models=["/a.gguf"],
        load=LoadConfig(n_ctx=8192, n_threads=4, n_batch=256, kv_type="q8_0"),
        sampling=SamplingParams(temperature=0.2, stop=("END",), repeat_penalty=1.1),
    ).save(data / "settings.json")
    presets = PresetStore(data / "presets.json")
    presets.save("Mine", SamplingParams(top_k=7, stop=("###",)))
    presets.save("Other", SamplingParams(temperature=1.3, mirostat="v2"))
    presets.set_model_default("m.gguf:1", "Mine")
    ConversationStore(data).save(real_conversation())
    (base / "outside").mkdir()
    (base / "outside" / "keep.txt").write_text("not the app's")
    return data


def settings_in_range(s: AppSettings) -> None:
    """Nothing out of its declared range can reach llama.cpp."""
    assert s.load.mmproj == ""  # a projector is paired per model, never a setting
    for group in (s.load, s.sampling):
        for f in fields(group):
            if f.name != "mmproj":
                check(SPEC_BY_NAME[f.name], getattr(group, f.name))
    check_structured(s.sampling)
    assert s.snapshot_budget_mb >= 0
    s.to_json().encode("utf-8")


def check_set_aside_or_repaired(
    data: Path, name: str, notes: list[str], original: bytes, before: dict[str, Any]
) -> str:
    """The file is unchanged (no notes, or a newer version's file: not this one's to
    repair), set aside (``.bad`` = original, gone), or repaired (``.bad`` = original, a
    clean file in its place). Nothing else changed."""
    after = tree(data.parent)
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    rel = f"data/{name}"
    for note in notes:
        one_line(note)
    if not notes or any("written by a newer Lamplight" in note for note in notes):
        assert changed == set()
        return "kept"
    assert after[rel + ".bad"] == original
    if rel in after:
        assert changed == {rel, rel + ".bad"}
        return "repaired"
    assert changed == {rel, rel + ".bad"}
    return "set aside"


def mutate_in_place(path: Path, data: st.DataObject) -> tuple[Path, bytes, dict[str, Any]]:
    """Replace ``path`` with a mutation of its original; the data dir's files before that."""
    for stray in path.parent.glob("*.bad"):
        stray.unlink()
    content = data.draw(mutated(original_of(path)))
    path.write_bytes(content)
    return path, content, tree(path.parent.parent)


@FUZZ
@given(data=st.data())
def test_fuzz_settings(settings_dir: Path, data: st.DataObject) -> None:
    path, content, before = mutate_in_place(settings_dir / "settings.json", data)
    loaded, notes = timed(lambda: AppSettings.load_with_notes(path))
    settings_in_range(loaded)
    outcome = check_set_aside_or_repaired(settings_dir, "settings.json", notes, content, before)
    if outcome == "set aside":
        assert loaded == AppSettings()
    elif outcome == "repaired":
        again, more = AppSettings.load_with_notes(path)
        assert (again, more) == (loaded, [])  # the repaired file is clean


@FUZZ
@given(data=st.data())
def test_fuzz_presets(settings_dir: Path, data: st.DataObject) -> None:
    path, content, before = mutate_in_place(settings_dir / "presets.json", data)
    store = timed(lambda: PresetStore(path))
    for name in store.user:
        validate_sampling(sampling_to_dict(store.get(name)))
        assert 0 < len(name) <= 60
    for key, value in store.model_defaults.items():
        assert isinstance(key, str) and isinstance(value, str)
    store.default_for("m.gguf:1")
    outcome = check_set_aside_or_repaired(
        settings_dir, "presets.json", store.notes, content, before
    )
    if outcome == "set aside":
        assert store.user == {}
    elif outcome == "repaired":
        again = PresetStore(path)
        assert again.notes == [] and again.user == store.user
    try:
        name = store.import_preset(content.decode("utf-8", errors="replace"))
        assert name in store.user
    except SettingError as exc:
        one_line(str(exc))


WHOLE_FILE_DAMAGE: dict[str, bytes | None] = {
    "not-utf8": b'{"system_prompt": "\xff\xfe"}',
    "utf16-bom": json.dumps({"system_prompt": "x"}).encode("utf-16"),
    "deep": b"[" * 100_000 + b"]" * 100_000,
    "deep-object": b'{"load": ' * 20 + b"{}" + b"}" * 20,
    "list": b"[1, 2]",
    "string": b'"settings"',
    "huge": b'{"system_prompt": "' + b"x" * (5 * 1024 * 1024) + b'"}',
    "empty": b"",
    "directory": None,
    "fifo": None,
}


@pytest.mark.parametrize("damage", list(WHOLE_FILE_DAMAGE))
@pytest.mark.parametrize("name", ["settings.json", "presets.json"])
def test_unusable_settings_and_presets_are_set_aside(
    settings_dir: Path, name: str, damage: str
) -> None:
    path = settings_dir / name
    path.unlink()
    content = WHOLE_FILE_DAMAGE[damage]
    if content is not None:
        path.write_bytes(content)
    elif damage == "directory":
        path.mkdir()
        (path / "inside").write_text("kept")
    else:
        os.mkfifo(path)
    if name == "settings.json":
        loaded, notes = timed(lambda: AppSettings.load_with_notes(path))
        assert loaded == AppSettings()
    else:
        presets = timed(lambda: PresetStore(path))
        notes, loaded = presets.notes, None
        assert presets.user == {} and presets.names() == ["Precise", "Balanced", "Creative"]
    [note] = notes
    one_line(note)
    assert f"set aside as {name}.bad" in note, note
    aside = path.with_name(name + ".bad")
    assert not os.path.lexists(path)
    if content is not None:
        assert aside.read_bytes() == content
    elif damage == "directory":
        assert (aside / "inside").read_text() == "kept"
    else:
        assert stat.S_ISFIFO(aside.lstat().st_mode)
    if name == "settings.json":
        assert loaded is not None
        loaded.save(path)  # the app can write its settings again
        assert AppSettings.load_with_notes(path) == (loaded, [])


OUT_OF_RANGE = {
    "n_batch": (0, 512),
    "n_threads": (100000, 0),
    "n_ctx": (2**32 + 512, 4096),
    "kv_type": ("bogus", "f16"),
    "n_gpu_layers": (-3, -2),
    "flash_attn": ("yes", False),
}
SAMPLING_OUT_OF_RANGE = {
    "repeat_penalty": (0, 1.0),  # below the range: the default ("off"), never 0.01
    "temperature": (7.5, 5.0),  # above the range: clamped
    "top_k": (10**400, 1000),
    "max_tokens": (-5, 1024),
    "top_p": (math.nan, 0.95),
    "mirostat": ("v3", "off"),
    "stop": (["", 5], ()),
}


def test_settings_values_are_checked_against_their_declaration(settings_dir: Path) -> None:
    path = settings_dir / "settings.json"
    doc = json.loads(path.read_text())
    doc["load"].update({k: v for k, (v, _) in OUT_OF_RANGE.items()})
    doc["sampling"].update({k: v for k, (v, _) in SAMPLING_OUT_OF_RANGE.items()})
    doc.update(model_path="a\0b", system_prompt=["x"], snapshot_budget_mb=-1)
    text = json.dumps(doc)
    path.write_text(text)
    loaded, notes = AppSettings.load_with_notes(path)
    for name, (_, want) in OUT_OF_RANGE.items():
        assert getattr(loaded.load, name) == want, name
    for name, (_, want) in SAMPLING_OUT_OF_RANGE.items():
        assert getattr(loaded.sampling, name) == want, name
    assert (
        loaded.model_path is None
        and loaded.system_prompt == ""
        and loaded.snapshot_budget_mb == 1024
    )
    assert loaded.load.n_ctx != 512  # no silent 32-bit wrap
    settings_in_range(loaded)
    assert len(notes) == len(OUT_OF_RANGE) + len(SAMPLING_OUT_OF_RANGE) + 3 + 1
    assert any("Repeat penalty must be between 0.01 and 3.0 (got 0)" in n for n in notes)
    assert notes[-1] == "settings.json was repaired; the original is kept as settings.json.bad."
    assert (settings_dir / "settings.json.bad").read_text() == text
    assert AppSettings.load_with_notes(path) == (loaded, [])  # repaired on disk
    # Values still in range are kept.
    assert loaded.sampling.stop == () and loaded.last_conversation == "abc123"


def test_presets_with_bad_values_are_repaired_and_bad_presets_left_out(settings_dir: Path) -> None:
    path = settings_dir / "presets.json"
    doc = json.loads(path.read_text())
    doc["presets"]["Mine"]["repeat_penalty"] = 0
    doc["presets"]["Mine"]["top_k"] = "many"
    doc["presets"]["Broken"] = [1, 2]
    doc["presets"]["x" * 100] = {}
    doc["presets"]["Balanced"] = {}
    doc["model_defaults"]["m2"] = {"name": "Mine"}
    path.write_text(json.dumps(doc))
    store = PresetStore(path)
    assert sorted(store.user) == ["Mine", "Other"]
    assert store.user["Mine"].repeat_penalty == 1.0 and store.user["Mine"].top_k == 40
    assert store.user["Mine"].stop == ("###",) and store.user["Other"].mirostat == "v2"
    assert store.model_defaults == {"m.gguf:1": "Mine"}
    assert len(store.notes) == 7 and "kept as presets.json.bad" in store.notes[-1]
    assert PresetStore(path).notes == []


def test_repeat_penalty_zero_is_refused_everywhere(qtbot: QtBot) -> None:
    from PySide6.QtWidgets import QDoubleSpinBox

    from ui.settings.settings_form import SettingsForm

    spec = SPEC_BY_NAME["repeat_penalty"]
    assert spec.minimum is not None and spec.minimum > 0
    for bad in (0, 0.0, -1.0):
        with pytest.raises(SettingError, match=r"Repeat penalty must be between 0\.01"):
            check(spec, bad)
        with pytest.raises(SettingError):
            validate_sampling({"repeat_penalty": bad})
    form = SettingsForm()
    qtbot.addWidget(form)
    spin = form.findChild(QDoubleSpinBox, "field_repeat_penalty")
    assert spin is not None and spin.minimum() == spec.minimum  # from the declaration
    spin.setValue(0.0)
    assert spin.value() == spec.minimum


# -- the app starts ---------------------------------------------------------------------------


def test_the_app_starts_on_a_hostile_data_dir(qtbot: QtBot, tmp_path: Path) -> None:
    """Every kind of damage at once: the window opens, lists the good conversations and
    says what was set aside or repaired."""
    from ui.engine.worker import EngineClient
    from ui.main import open_window

    root = tmp_path / "data"
    good = real_conversation()
    ConversationStore(root).save(good)
    conversations = root / "conversations"
    doc = real_conversation().to_dict()
    (conversations / f"{doc['id']}.json").write_text(
        json.dumps({**doc, "updated": 1e20, "created": float("nan")})
    )
    (conversations / "broken1.json").write_bytes(b"\xff\xfe{")
    (conversations / "deep1.json").write_text("[" * 50_000)
    os.mkfifo(conversations / "pipe1.json")
    (root / "snapshots" / "a-b.lpkv").write_bytes(b"stray")
    os.mkfifo(root / "snapshots" / f"{good.id}.lpkv")
    (root / "settings.json").write_text(
        json.dumps(
            {
                "load": {"n_ctx": 2**32 + 512, "n_batch": -1},
                "sampling": {"repeat_penalty": 0},
                "last_conversation": good.id,
            }
        )
    )
    (root / "presets.json").write_bytes(json.dumps({"presets": []}).encode("utf-16"))
    (root / "models").write_text("not a folder")

    notes: list[str] = []
    dirs = data_dirs(root, notes)
    loaded, more = AppSettings.load_with_notes(dirs.settings_file)
    notes += more
    fake = FakeEngine()
    win = open_window(
        dirs,
        loaded,
        notes,
        lambda s: EngineClient(dirs.models, engine_factory=lambda: fake, store=s),
    )
    qtbot.addWidget(win)
    try:
        assert win.isVisible() and win.conversation.id == good.id
        assert set(win.sidebar.ids()) == {good.id, doc["id"]}
        shown = win.transcript.toPlainText()
        for text in ("models was not a folder", "Context size", "presets.json", "broken1.json"):
            assert text in shown, text
        assert "set aside or repaired" in win.statusBar().currentMessage()
        for name in ("broken1.json.bad", "deep1.json.bad", "pipe1.json.bad"):
            assert os.path.lexists(conversations / name), name
        assert (root / "presets.json.bad").exists() and (root / "models.bad").is_file()
        assert loaded.load == LoadConfig()
        assert loaded.sampling.repeat_penalty == 1.0
    finally:
        win.close()


# -- the real model, in child processes with a memory cap (an abort fails the test, not the run)

CAPPED = (
    "import resource, runpy, sys; "
    "resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30)); "
    "sys.argv = ['lamplight', *sys.argv[1:]]; "
    "runpy.run_module('ui.main', run_name='__main__')"
)


def test_settings_that_crashed_llama_cpp_are_repaired_before_a_load(
    model_path: Path, tmp_path: Path
) -> None:
    """n_batch < 1 segfaulted, 100000 threads aborted (std::bad_alloc), n_ctx 2^32+512
    wrapped to 512, a bogus KV type failed late: the app's own smoke test loads the real
    model with such a settings file and generates."""
    data = tmp_path / "data"
    data.mkdir()
    hostile = {
        "load": {
            "n_ctx": 2**32 + 512,
            "n_batch": -5,
            "n_threads": 100000,
            "kv_type": "bogus",
            "n_gpu_layers": 10**6,
            "flash_attn": "yes",
        },
        "sampling": {"repeat_penalty": 0},
    }
    (data / "settings.json").write_text(json.dumps(hostile))
    proc = subprocess.run(
        [sys.executable, "-c", CAPPED, "--smoke-test", "--data-dir", str(data), str(model_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["ok"] and result["metrics"]["generated_tokens"] > 0
    assert result["metrics"]["n_ctx"] == LoadConfig().n_ctx
    assert json.loads((data / "settings.json.bad").read_text()) == hostile
    log = (data / "logs" / "lamplight.log").read_text()
    assert "Context size must be between 256 and 262144" in log


# -- llama.cpp reading damaged KV state --------------------------------------------------------

CHILD = """
import random, resource, sys, zlib
from pathlib import Path
resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))  # a runaway allocation fails here
from app.chat.session_cache import SessionCache
from app.chat.snapshot import write_snapshot
from app.chat.store import ConversationStore
from app.config.setting_records import LoadConfig, SamplingParams
from app.engine.backend import Finished, KvState
from app.engine.local.engine import Engine
from app.engine.chat_message import ChatMessage
from app.util.hashing import FingerprintCache

root, model, n = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
engine = Engine()
engine.load(model, LoadConfig(n_ctx=1024, n_threads=1))
store = ConversationStore(root)
cache = SessionCache(engine, store, FingerprintCache(root / "fp.json"))
history = [ChatMessage("user", "Tell me about the sea.")]
for event in engine.generate(history, SamplingParams.greedy(8)):
    pass
cache.save("c1")
kv = engine.export_state()
header = cache.header()
rng = random.Random(int(sys.argv[4]))
restored = generated = 0
for i in range(n):
    state = bytearray(kv.state)
    how = rng.choice(["flip", "head", "cut", "random"])
    if how == "flip":
        for _ in range(rng.randint(1, 16)):
            j = rng.randrange(len(state)); state[j] ^= 1 << rng.randrange(8)
    elif how == "head":
        for _ in range(rng.randint(1, 6)):
            j = rng.randrange(min(256, len(state))); state[j] = rng.randrange(256)
    elif how == "cut":
        state = state[: rng.randrange(len(state))]
    else:
        state = bytearray(rng.randbytes(rng.randint(0, 4096)))
    # the snapshot writer computes a matching checksum: only llama.cpp can tell
    damaged = KvState(bytes(state), kv.tokens, kv.text, kv.marks)
    write_snapshot(store.snapshot_path("c1"), header, damaged)
    result = cache.restore("c1")
    assert result.restored or (result.note and "\\n" not in result.note), result
    restored += result.restored
    if result.restored and generated < 3:
        msgs = [*history, ChatMessage("assistant", kv.text), ChatMessage("user", "More.")]
        events = list(engine.generate(msgs, SamplingParams.greedy(4)))
        done = [e for e in events if isinstance(e, Finished)]
        assert done, "no reply"
        generated += 1
print(f"ok {n} cases, {restored} accepted by llama.cpp, {generated} continued", flush=True)
"""


def test_llama_cpp_reads_damaged_kv_state_without_dying(model_path: Path, tmp_path: Path) -> None:
    """Snapshots whose checksum matches but whose llama.cpp state is damaged: restore falls
    back with a note or restores; generation goes on. In a child process with a memory cap,
    so an abort (GGML_ASSERT) fails this test instead of the run."""
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "data"), str(model_path), "60", "20240611"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("ok 60 cases"), proc.stdout
    print(proc.stdout.strip())
