"""Pictures and the caches that keep them: a chat with more pictures than the projector
keeps tokenized, and snapshots and pooled caches tied to the projector that read them.
Real engine (the default model with tiny random projectors, ``tests/vision_model.py``,
16 pixels square so that 40 pictures cost 240 tokens) where llama.cpp is involved; the
header rules alone run without a model."""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.chat.session_cache import SessionCache
from app.chat.snapshot import (
    MAGIC,
    SnapshotError,
    SnapshotHeader,
    read_header,
    read_snapshot,
    write_snapshot,
)
from app.chat.store import ConversationStore
from app.config.setting_records import SamplingParams
from app.engine.backend import Finished, KvState
from app.engine.chat_message import ChatMessage, ImagePart
from app.engine.image_part import image_marker, image_token_id, is_image_token
from app.engine.local.engine import Engine
from app.engine.local.vision import _KEEP
from app.host.kv_pool import KvPool
from app.util.hashing import FingerprintCache
from tests import vision_model
from tests.conftest import ONE_THREAD
from tests.hypothesis_budget import examples
from tests.vision_model import build_projector, image_part

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, seed=1)
N_PICTURES = 40  # more than the projector keeps tokenized
PER_TURN = 4
SIDE = 16  # pixels: 4-pixel patches pooled 2x2 make 4 embeddings a picture
PICTURE_TOKENS = 6  # and Gemma 3's <start_of_image>, <end_of_image>


def pictures(n: int) -> list[ImagePart]:
    """``n`` distinct small pictures (one colour each)."""
    return [image_part((40 + 5 * i, 255 - 5 * i, (97 * i) % 256), f"p{i}.png") for i in range(n)]


def picture_chat(images: list[ImagePart]) -> list[ChatMessage]:
    """Turns of ``PER_TURN`` pictures each, with short replies between them."""
    msgs: list[ChatMessage] = []
    for t in range(0, len(images), PER_TURN):
        if msgs:
            msgs.append(ChatMessage("assistant", f"Noted {t}."))
        msgs.append(ChatMessage("user", f"Pictures {t}.", images=tuple(images[t : t + PER_TURN])))
    return msgs


def finish(engine: Engine, messages: list[ChatMessage]) -> Finished:
    events = list(engine.generate(messages, GREEDY))
    last = events[-1]
    assert isinstance(last, Finished)
    return last


def image_runs(tokens: list[int]) -> int:
    return sum(
        1 for i, t in enumerate(tokens) if is_image_token(t) and (i == 0 or tokens[i - 1] != t)
    )


def small_projector(out: Path, seed: int) -> Path:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(vision_model, "IMAGE_SIZE", SIDE)
        return build_projector(out, seed=seed)


@pytest.fixture(scope="module")
def projectors(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two projectors for the same model: the same shape, other random weights."""
    folder = tmp_path_factory.mktemp("projectors")
    return small_projector(folder / "mmproj-a.gguf", 7), small_projector(
        folder / "mmproj-b.gguf", 8
    )


@pytest.fixture(scope="module")
def vision_a(model_path: Path, projectors: tuple[Path, Path]) -> Iterator[Engine]:
    engine = Engine()
    engine.load(model_path, replace(ONE_THREAD, mmproj=str(projectors[0])))
    yield engine
    engine.unload()


@pytest.fixture(scope="module")
def vision_b(model_path: Path, projectors: tuple[Path, Path]) -> Iterator[Engine]:
    engine = Engine()
    engine.load(model_path, replace(ONE_THREAD, mmproj=str(projectors[1])))
    yield engine
    engine.unload()


@pytest.fixture()
def eng(vision_a: Engine) -> Engine:
    vision_a.reset()
    return vision_a


# -- any number of pictures -------------------------------------------------------------------
def test_a_chat_with_more_pictures_than_kept_replies_read_from_the_start(eng: Engine) -> None:
    projector = eng._loaded.projector if eng._loaded is not None else None
    assert projector is not None
    chat = picture_chat(pictures(N_PICTURES))
    assert eng.image_tokens(chat[0].images[0]) == PICTURE_TOKENS
    before = projector.tokenized
    done = finish(eng, chat)  # failed on every reply: the first pictures were let go of
    assert done.metrics.stop_reason != "error"
    assert done.metrics.evaluated_tokens == done.metrics.prompt_tokens
    assert image_runs(eng.cached_tokens) == N_PICTURES
    assert done.metrics.prompt_tokens > N_PICTURES * PICTURE_TOKENS
    # Memory stays bounded, and only the pictures the prompt's tokenization let go of
    # are tokenized again (each read one is the first to go), not every one after them.
    assert len(projector._seqs) <= _KEEP
    assert projector.tokenized - before <= N_PICTURES + (N_PICTURES - _KEEP)
    # An edit of the first turn's text reads every later picture again, kept or not.
    edited = [replace(chat[0], content="The first pictures."), *chat[1:]]
    again = finish(eng, edited)
    assert again.metrics.stop_reason != "error"
    assert again.metrics.cached_tokens >= PER_TURN * PICTURE_TOKENS
    assert again.metrics.evaluated_tokens > (N_PICTURES - PER_TURN) * PICTURE_TOKENS
    assert image_runs(eng.cached_tokens) == N_PICTURES
    # And the next turn, prepared while the reply is read, reads only its own words.
    reply = ChatMessage("assistant", again.text)
    eng.prewarm(edited, reply)
    question = "And now?"
    follow = finish(eng, [*edited, reply, ChatMessage("user", question)])
    # Its words and the template's "<end_of_turn>\n<start_of_turn>model\n": no picture.
    assert follow.metrics.evaluated_tokens <= len(eng.tokenize(question)) - 1 + 5


# -- snapshots tied to their projector ---------------------------------------------------------


@pytest.fixture()
def caches(vision_a: Engine, vision_b: Engine, tmp_path: Path) -> tuple[SessionCache, SessionCache]:
    """Session caches over one data folder for the engine with projector A and with B."""
    vision_a.reset()
    vision_b.reset()
    store = ConversationStore(tmp_path / "data")
    prints = FingerprintCache(tmp_path / "data" / "fingerprints.json")
    return SessionCache(vision_a, store, prints), SessionCache(vision_b, store, prints)


def test_a_snapshot_of_pictures_is_refused_under_another_projector(
    caches: tuple[SessionCache, SessionCache], projectors: tuple[Path, Path]
) -> None:
    cache_a, cache_b = caches
    a, b = cache_a.engine, cache_b.engine
    assert isinstance(a, Engine) and isinstance(b, Engine)
    chat = [ChatMessage("user", "What is in it?", images=(image_part(),))]
    finish(a, chat)
    cache_a.save("pictures")
    header, _, _ = read_header(cache_a.store.snapshot_path("pictures"))
    assert header.projector["name"] == projectors[0].name
    assert len(header.projector["sha256"]) == 64
    result = cache_b.restore("pictures")  # restored under B, with A's view of the picture
    assert not result.restored and b.cached_tokens == []
    assert "\n" not in result.note and "vision projector" in result.note
    assert projectors[0].name in result.note
    rebuilt = finish(b, chat)  # continue: the cache is rebuilt under B
    assert rebuilt.metrics.evaluated_tokens == rebuilt.metrics.prompt_tokens
    # Under the projector that read it, it still restores.
    a.reset()
    assert cache_a.restore("pictures").restored
    assert image_runs(a.cached_tokens) == 1
    # A cache of text alone restores whatever projector is loaded.
    a.reset()
    finish(a, [ChatMessage("user", "Only words here.")])
    cache_a.save("words")
    assert read_header(cache_a.store.snapshot_path("words"))[0].projector == {}
    words = cache_b.restore("words")
    assert words.restored and words.note == ""


def test_the_kv_pool_reuses_a_cache_of_pictures_only_under_its_projector(
    vision_a: Engine, vision_b: Engine
) -> None:
    vision_a.reset()
    vision_b.reset()
    pool = KvPool(vision_a, min_tokens=1)
    chat = [ChatMessage("user", "What is in it?", images=(image_part(),))]
    assert pool.prepare(None, chat) == "none"
    done = finish(vision_a, chat)
    reply = ChatMessage("assistant", done.text)
    pool.finish(None, chat, reply)
    pool.stash_live()
    assert len(pool.entries) == 1
    follow = [*chat, reply, ChatMessage("user", "More?")]
    # The same model and settings with projector B loaded (a reload that kept the pool):
    # A's view of the picture must not be put back.
    pool.backend = vision_b
    assert pool.prepare(None, follow) == "none"
    assert vision_b.cached_tokens == []
    # Under A the entry is still taken.
    pool.backend = vision_a
    vision_a.reset()
    assert pool.prepare(None, follow) == "restored"


# -- the header rules, without a model --------------------------------------------------------

HEADER = SnapshotHeader(
    model={"name": "m.gguf", "size": 1, "sha256": "00" * 32},
    runtime={"llama_cpp_python": "x"},
    cache={"n_ctx": 64},
    lora=[],
)
PROJ_A = {"name": "a.gguf", "size": 10, "sha256": "aa" * 32}
PROJ_B = {"name": "b.gguf", "size": 10, "sha256": "bb" * 32}


def picture_kv() -> KvState:
    digest = "12" * 32
    text = image_marker(digest) + "hi"
    return KvState(b"state", [2, *[image_token_id(digest)] * 3, 5], text, [(0, 0)])


def _parts(path: Path) -> tuple[dict[str, Any], bytes]:
    data = path.read_bytes()
    (n,) = struct.unpack("<I", data[4:8])
    head: dict[str, Any] = json.loads(data[8 : 8 + n])
    return head, data[8 + n :]


def _file(head: dict[str, Any], payload: bytes) -> bytes:
    raw = json.dumps(head).encode()
    return MAGIC + struct.pack("<I", len(raw)) + raw + payload


def test_the_projector_record_decides_only_for_pictures(tmp_path: Path) -> None:
    path = tmp_path / "s.lpkv"
    write_snapshot(path, replace(HEADER, projector=PROJ_A), picture_kv())
    assert read_header(path)[0].projector == PROJ_A
    assert read_snapshot(path, replace(HEADER, projector=PROJ_A)).tokens[0] == 2
    for current, why in ((PROJ_B, "another vision projector"), ({}, "not loaded now")):
        with pytest.raises(SnapshotError, match=why):
            read_snapshot(path, replace(HEADER, projector=current))
    # Pictures with no record (a file from before it was kept, or the record cut out).
    write_snapshot(path, HEADER, picture_kv())
    with pytest.raises(SnapshotError, match="which vision projector"):
        read_snapshot(path, replace(HEADER, projector=PROJ_A))
    # Text alone: no record, any projector.
    write_snapshot(path, HEADER, KvState(b"state", [2, 3], "hi", [(0, 0)]))
    assert read_snapshot(path, replace(HEADER, projector=PROJ_B)).tokens == [2, 3]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record=JSON)
def test_fuzz_the_projector_record(record: Any) -> None:
    """Any JSON in the header's projector field: a one-line refusal or a header whose
    record is flat, and a snapshot of pictures restores only under a matching sha256."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "s.lpkv"
        write_snapshot(path, replace(HEADER, projector=PROJ_A), picture_kv())
        head, payload = _parts(path)
        head["projector"] = record
        head["crc32"] = zlib.crc32(payload)
        path.write_bytes(_file(head, payload))
        for current in (PROJ_A, {}):
            try:
                kv = read_snapshot(path, replace(HEADER, projector=current))
            except SnapshotError as exc:
                assert "\n" not in str(exc) and len(str(exc)) < 300
                continue
            assert isinstance(record, dict) and record.get("sha256") == current.get("sha256")
            assert current and kv.tokens[0] == 2
