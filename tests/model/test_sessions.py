"""Conversations with KV snapshots on the real model: resume, fallbacks, rewinds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.chat.session_cache import SessionCache
from app.chat.snapshot import SnapshotHeader, read_header, write_snapshot
from app.chat.store import ConversationStore
from app.config.setting_records import SamplingParams
from app.engine.backend import Finished
from app.engine.chat_message import ChatMessage
from app.engine.local.engine import Engine
from app.util.hashing import FingerprintCache
from tests.conftest import ROOT, TEST_LOAD

GREEDY = SamplingParams.greedy(16)


def reply(engine: Engine, messages: list[ChatMessage], params: SamplingParams = GREEDY) -> Finished:
    for event in engine.generate(messages, params):
        if isinstance(event, Finished):
            return event
    raise AssertionError("no Finished event")


def long_text(words: int) -> str:
    return " ".join(f"word{i % 97}" for i in range(words))


@pytest.fixture()
def cache(engine: Engine, tmp_path: Path) -> SessionCache:
    store = ConversationStore(tmp_path / "data")
    return SessionCache(engine, store, FingerprintCache(tmp_path / "data" / "fingerprints.json"))


def two_turns(
    engine: Engine, words: int = 120, params: SamplingParams = GREEDY
) -> tuple[list[ChatMessage], Finished]:
    first = [ChatMessage("user", "Describe the sea. " + long_text(words))]
    done = reply(engine, first, params)
    return [*first, ChatMessage("assistant", done.text)], done


def test_resume_in_a_new_process_continues_identically(
    engine: Engine, cache: SessionCache, model_path: Path, tmp_path: Path
) -> None:
    history, _ = two_turns(engine)
    size, _ = cache.save("conv1")
    kv_bytes = engine.state_size()
    assert 0 < size <= kv_bytes * 1.1 + 65536  # no logits: the file follows the KV state
    n_saved = len(engine.cached_tokens)
    follow_up = [*history, ChatMessage("user", "And the sky?")]
    without_restart = reply(engine, follow_up)

    script = f"""
import json, sys
from pathlib import Path
from app.engine.backend import Finished
from app.engine.local.engine import Engine
from app.util.hashing import FingerprintCache
from app.chat.session_cache import SessionCache
from app.config.setting_records import LoadConfig, SamplingParams
from app.chat.store import ConversationStore
from app.engine.chat_message import ChatMessage
engine = Engine()
engine.load({str(model_path)!r}, LoadConfig(n_ctx={TEST_LOAD.n_ctx}, n_threads=2))
data = Path({str(tmp_path / "data")!r})
cache = SessionCache(engine, ConversationStore(data), FingerprintCache(data / "fingerprints.json"))
result = cache.restore("conv1")
msgs = [ChatMessage(m["role"], m["content"]) for m in json.loads(sys.stdin.read())]
for ev in engine.generate(msgs, SamplingParams.greedy(16)):
    if isinstance(ev, Finished):
        print(json.dumps({{"restored": result.restored, "note": result.note,
                          "text": ev.text, "cached": ev.metrics.cached_tokens,
                          "evaluated": ev.metrics.evaluated_tokens}}))
"""
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        input=json.dumps([{"role": m.role, "content": m.content} for m in follow_up]),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    after = json.loads(out.stdout.strip().splitlines()[-1])
    assert after["restored"], after["note"]
    assert after["text"] == without_restart.text  # token for token
    # Nothing of the saved conversation is evaluated again: only the new turn.
    assert after["cached"] == n_saved
    assert after["evaluated"] == without_restart.metrics.evaluated_tokens
    assert after["evaluated"] < 16


def test_restore_in_process_evaluates_no_old_prompt(engine: Engine, cache: SessionCache) -> None:
    history, _ = two_turns(engine)
    cache.save("conv2")
    n_saved = len(engine.cached_tokens)
    engine.reset()
    result = cache.restore("conv2")
    assert result.restored and result.n_tokens == n_saved and result.note == ""
    done = reply(engine, [*history, ChatMessage("user", "Thanks.")])
    assert done.metrics.cached_tokens == n_saved
    assert done.metrics.cache_note == ""


@pytest.mark.parametrize(
    "damage", ["missing", "empty", "truncated", "corrupt", "garbage", "other-model", "other-ctx"]
)
def test_unusable_snapshots_fall_back_with_a_reason(
    engine: Engine, cache: SessionCache, damage: str
) -> None:
    # A short chat: only the reason for refusing its snapshot matters here.
    history, _ = two_turns(engine, words=20, params=SamplingParams.greedy(4))
    cache.save("conv3")
    path = cache.store.snapshot_path("conv3")
    data = path.read_bytes()
    if damage == "missing":
        path.unlink()
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "corrupt":
        path.write_bytes(data[:-100] + bytes(b ^ 0xFF for b in data[-100:]))
    elif damage == "garbage":
        path.write_bytes(os.urandom(5000))
    else:
        header, _, _ = read_header(path)
        kv = engine.export_state()
        if damage == "other-model":
            changed = SnapshotHeader(
                {**header.model, "sha256": "0" * 64, "name": "other.gguf"},
                header.runtime,
                header.cache,
                header.lora,
            )
        else:
            changed = SnapshotHeader(
                header.model, header.runtime, {**header.cache, "n_ctx": 999}, header.lora
            )
        write_snapshot(path, changed, kv)
    expected = {
        "missing": "no saved cache",
        "empty": "empty",
        "truncated": "truncated",
        "corrupt": "corrupt",
        "garbage": "not a Lamplight snapshot",
        "other-model": "another model (other.gguf)",
        "other-ctx": "n_ctx changed",
    }[damage]
    result = cache.restore("conv3")
    assert not result.restored
    assert expected in result.note
    assert engine.cached_tokens == []
    # The conversation goes on: the whole transcript is evaluated again.
    done = reply(engine, [*history, ChatMessage("user", "Go on.")], SamplingParams.greedy(4))
    assert done.metrics.cached_tokens == 0 and done.text.strip()


def test_long_rewind_matches_a_fresh_evaluation(engine: Engine) -> None:
    """Past the 512-token sliding window: rewinding the live cache stays exact."""
    first = [ChatMessage("user", long_text(300))]  # ~880 tokens
    reply(engine, first)
    assert len(engine.cached_tokens) > 700
    edited = [ChatMessage("user", long_text(40) + " Summarise.")]
    rewound = reply(engine, edited)
    assert rewound.metrics.cached_tokens > 50 and rewound.metrics.cache_note == ""
    engine.reset()
    fresh = reply(engine, edited)
    assert fresh.metrics.cached_tokens == 0
    assert rewound.text == fresh.text


def test_rewind_past_a_restored_window_rebuilds_and_says_so(
    engine: Engine, cache: SessionCache
) -> None:
    first = [ChatMessage("user", long_text(300))]
    reply(engine, first)
    cache.save("conv4")
    cache.restore("conv4")  # a restored cache keeps only the last window of the SWA layers
    edited = [ChatMessage("user", long_text(40) + " Summarise.")]
    rewound = reply(engine, edited)
    assert "sliding-window" in rewound.metrics.cache_note
    assert rewound.metrics.cached_tokens == 0
    engine.reset()
    assert reply(engine, edited).text == rewound.text


def test_regenerate_edit_and_fork_evaluate_only_the_changed_suffix(engine: Engine) -> None:
    t1 = [ChatMessage("user", "Name a colour.")]
    a1 = reply(engine, t1)
    t2 = [*t1, ChatMessage("assistant", a1.text), ChatMessage("user", "Name a fruit.")]
    a2 = reply(engine, t2)
    full = len(engine.cached_tokens)

    # Regenerate the last reply: the prompt is all cached; one token re-evaluated.
    again = reply(engine, t2)
    assert again.metrics.evaluated_tokens == 1
    assert again.text == a2.text

    # Edit the second user message: only the edited turn is evaluated.
    edited = [*t1, ChatMessage("assistant", a1.text), ChatMessage("user", "Name a car.")]
    e = reply(engine, edited)
    new_turn = engine.tokenize(
        "<end_of_turn>\n<start_of_turn>user\nName a car.<end_of_turn>\n<start_of_turn>model\n"
    )
    assert e.metrics.evaluated_tokens <= len(new_turn)
    assert e.metrics.cached_tokens >= a1.metrics.prompt_tokens + a1.metrics.generated_tokens - 1
    assert full > e.metrics.cached_tokens

    # Fork after the first reply and continue differently: same prefix reuse.
    forked = [*t1, ChatMessage("assistant", a1.text), ChatMessage("user", "Name a city.")]
    f = reply(engine, forked)
    assert f.metrics.evaluated_tokens <= len(new_turn) + 1


def test_q8_cache_halves_the_snapshot(model_path: Path, tmp_path: Path) -> None:
    from dataclasses import replace

    sizes = {}
    for kv_type in ("f16", "q8_0"):
        eng = Engine()
        eng.load(model_path, replace(TEST_LOAD, kv_type=kv_type))
        reply(eng, [ChatMessage("user", long_text(100))], SamplingParams.greedy(4))
        sizes[kv_type] = eng.state_size()
        eng.unload()
    assert sizes["q8_0"] < 0.6 * sizes["f16"]


def test_the_next_turn_is_prepared_ahead(engine: Engine) -> None:
    t1 = [ChatMessage("user", "Name a colour.")]
    a1 = reply(engine, t1)
    prepared = engine.prewarm(t1, ChatMessage("assistant", a1.text))
    opener = engine.tokenize("<end_of_turn>\n<start_of_turn>user\n")[1:]  # without BOS
    assert prepared == len(opener)
    t2 = [*t1, ChatMessage("assistant", a1.text), ChatMessage("user", "Name a fruit.")]
    a2 = reply(engine, t2)
    rest = engine.tokenize("Name a fruit.<end_of_turn>\n<start_of_turn>model\n")[1:]
    assert a2.metrics.evaluated_tokens == len(rest)
    engine.reset()
    assert reply(engine, t2).text == a2.text


def test_crafted_snapshot_headers_are_refused(engine: Engine, cache: SessionCache) -> None:
    """A header whose part lengths lie is refused even when its checksum is right."""
    import struct
    import zlib

    from app.chat.snapshot import MAGIC, SnapshotError, read_snapshot

    two_turns(engine)
    cache.save("conv5")
    path = cache.store.snapshot_path("conv5")
    _, head, offset = read_header(path)
    payload = path.read_bytes()[offset:]
    for lengths in (
        [-1, 0, 0, len(payload) + 1],
        ["x", 0, 0, 0],
        [len(payload) - 3, 3, 0, 0],
        [len(payload) - 8, 0, 0, 8],
    ):
        bad = {**head, "lengths": lengths, "crc32": zlib.crc32(payload)}
        raw = json.dumps(bad).encode()
        path.write_bytes(MAGIC + struct.pack("<I", len(raw)) + raw + payload)
        with pytest.raises(SnapshotError):
            read_snapshot(path, cache.header())
