"""Drafting with a model's own next-token (MTP) layers, on the real engine (issue 43):
``tests/mtp_model.py``'s tiny hybrid qwen35 with one NextN block. Its guesses are
checked like any drafter's, so every greedy reply equals the plain one token for token,
through rejections on a hybrid state, regenerates, next turns and a reopened chat."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from app.chat.snapshot import read_snapshot, write_snapshot
from app.config.setting_records import LoadConfig
from app.engine.chat_message import ChatMessage
from app.engine.local.engine import Engine
from app.engine.metrics import MessageMetrics
from tests.arch_models import arch_model_path
from tests.model.test_recurrent_memory import GREEDY, PLAIN, SNAPSHOT, reply
from tests.mtp_model import mtp_model_path
from ui.common.draft_stats import draft_text

PLAIN_REPLY = replace(GREEDY, max_tokens=100, mtp=False)
MTP = replace(PLAIN_REPLY, mtp=True, adaptive_draft=False, draft_len=3)
ASKS = ("Hello there, how are you today? ", "abc abc abc abc", "The cat sat on the mat.")


@pytest.fixture(scope="module")
def mtp_engine() -> Iterator[Engine]:
    engine = Engine()
    engine.load(mtp_model_path(), LoadConfig(n_ctx=512, n_threads=1))
    engine.set_template(PLAIN)
    yield engine
    engine.unload()


def test_the_engine_finds_next_token_layers_and_says_where_there_are_none(
    mtp_engine: Engine, engine: Engine
) -> None:
    assert mtp_engine.capabilities.mtp and "mtp" not in mtp_engine.capabilities.why_not
    # The default model (Gemma 3) and the plain qwen35 have none: off, with the reason.
    assert not engine.capabilities.mtp
    assert "no next-token (MTP) layers" in engine.capabilities.why_not["mtp"]
    plain = Engine()
    plain.load(arch_model_path("qwen35"), LoadConfig(n_ctx=256, n_threads=1))
    try:
        assert not plain.capabilities.mtp and plain.native.after_decode is None
    finally:
        plain.unload()


def test_greedy_replies_with_mtp_drafting_are_the_plain_ones(mtp_engine: Engine) -> None:
    drafted = kept = 0
    for text in ASKS:
        ask = [ChatMessage("user", text)]
        mtp_engine.reset()
        want = reply(mtp_engine, ask, PLAIN_REPLY)
        assert want.metrics.draft_kind == ""  # switched off: plain decoding
        mtp_engine.reset()
        got = reply(mtp_engine, ask, MTP)
        assert got.text == want.text, text
        assert got.metrics.draft_kind == "mtp"
        drafted += got.metrics.drafted_tokens
        kept += got.metrics.accepted_tokens
    # Guesses were kept (far above chance: the block reads the target's hidden rows) and
    # rejected (each rejection goes back through the hybrid state's copy).
    assert drafted > kept > drafted / 10, (drafted, kept)


def test_mtp_stays_exact_through_regenerate_next_turn_and_a_reopened_chat(
    mtp_engine: Engine, tmp_path: Path
) -> None:
    mtp_engine.reset()
    ask = [ChatMessage("user", ASKS[0])]
    first = reply(mtp_engine, ask, MTP)
    again = reply(mtp_engine, ask, MTP)  # a regenerate: back to a checkpoint
    assert again.text == first.text and again.metrics.evaluated_tokens == 1
    answer = ChatMessage("assistant", "Fine, thanks.")
    chat = [*ask, answer, ChatMessage("user", "And you?")]
    mtp_engine.prewarm(ask, answer)
    path = tmp_path / "chat.lpkv"
    write_snapshot(path, SNAPSHOT, mtp_engine.export_state())
    turn = reply(mtp_engine, chat, MTP)
    mtp_engine.reset()
    want = reply(mtp_engine, chat, PLAIN_REPLY)
    assert turn.text == want.text
    # Reopened: the next-token layers' own cache was not saved; they guess from what
    # they read from then on, and the reply is still the plain one.
    mtp_engine.reset()
    mtp_engine.import_state(read_snapshot(path, SNAPSHOT))
    reopened = reply(mtp_engine, chat, MTP)
    assert reopened.text == want.text and reopened.metrics.drafted_tokens > 0


def test_the_reply_footer_names_the_next_token_layers() -> None:
    m = MessageMetrics(generated_tokens=40, drafted_tokens=30, accepted_tokens=12)
    m.draft_kind, m.draft_ms = "mtp", 21.0
    assert draft_text(m).startswith("next-token layers: 12/30 guesses kept (40%)")
