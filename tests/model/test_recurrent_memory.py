"""Hybrid and recurrent models on the real engine (issue 43), with tiny random models of
the real architectures (``tests/arch_models.py``: mamba2, lfm2, qwen35): the engine
knows how each remembers the conversation, drafting never changes a reply, an overflow
never fails, and a removal llama.cpp refuses is never ignored."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from app.chat.snapshot import SnapshotHeader, read_snapshot, write_snapshot
from app.config.setting_records import LoadConfig, SamplingParams
from app.engine.backend import Finished
from app.engine.chat_message import ChatMessage
from app.engine.local.engine import Engine
from app.engine.local.guess_check import take_back
from app.engine.native.handles import ATTENTION, HYBRID, RECURRENT, SLIDING_WINDOW
from app.engine.templates.override import TemplateOverride
from app.util.errors import DraftError
from tests.arch_models import ARCHS, arch_model_path

PLAIN = TemplateOverride(
    "custom",
    source="{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}",
)
GREEDY = SamplingParams.greedy(max_tokens=30)
MEMORY = {"mamba2": RECURRENT, "lfm2": HYBRID, "qwen35": HYBRID}


@pytest.fixture(scope="module", params=ARCHS)
def arch_engine(request: pytest.FixtureRequest) -> Iterator[tuple[str, Engine]]:
    engine = Engine()
    # A byte vocabulary: 256 tokens of context fill in a few turns.
    engine.load(arch_model_path(request.param), LoadConfig(n_ctx=256, n_threads=1))
    engine.set_template(PLAIN)
    yield request.param, engine
    engine.unload()


def reply(engine: Engine, messages: list[ChatMessage], params: SamplingParams) -> Finished:
    events = list(engine.generate(messages, params))
    done = events[-1]
    assert isinstance(done, Finished) and sum(isinstance(e, Finished) for e in events) == 1
    return done


def test_the_engine_says_how_each_model_remembers(
    arch_engine: tuple[str, Engine], engine: Engine
) -> None:
    arch, tiny = arch_engine
    caps = tiny.capabilities
    assert caps.memory == MEMORY[arch] and caps.draft_model
    # The default model (Gemma 3) has sliding-window layers and a KV cache that rewinds.
    assert engine.capabilities.memory == SLIDING_WINDOW and engine.capabilities.draft_model
    assert ATTENTION not in (caps.memory, engine.capabilities.memory)


ASKS = (
    "Hello there, how are you today? " * 4,
    "abc abc abc abc abc abc abc",
    "The cat sat on the mat. The cat sat on the mat. The cat",
)


def test_drafting_takes_rejected_guesses_back_exactly(arch_engine: tuple[str, Engine]) -> None:
    # Before: a rejected guess stayed in the state; the reply changed (first difference
    # at token 59 of 100) or failed with "llama.cpp failed while generating (code -1)".
    arch, tiny = arch_engine
    plain = replace(GREEDY, max_tokens=120)
    drafting = replace(plain, speculative=True, adaptive_draft=False)
    drafted = rejected = 0
    for text in ASKS:
        ask = [ChatMessage("user", text)]
        tiny.reset()
        want = reply(tiny, ask, plain)
        tiny.reset()
        got = reply(tiny, ask, drafting)
        assert got.text == want.text, (text, got.metrics.notes)
        drafted += got.metrics.drafted_tokens
        rejected += got.metrics.drafted_tokens - got.metrics.accepted_tokens
    assert drafted and rejected, arch  # guesses were made, and some were taken back
    # A recurrent draft model cannot cut its own cache back after a round: refused.
    with pytest.raises(DraftError, match="recurrent"):
        tiny.set_draft(arch_model_path(arch))


def test_an_overflow_reads_the_kept_part_again_and_never_fails(
    arch_engine: tuple[str, Engine],
) -> None:
    # The app's flow: each reply, then the next turn's opening read ahead (prewarm), so
    # the cache holds the chat when the context fills and the oldest turns are dropped.
    _arch, tiny = arch_engine
    tiny.reset()
    params = replace(GREEDY, overflow="rolling")
    chat = [ChatMessage("user", "Hi")]
    drops = []
    for turn in range(10):
        done = reply(tiny, chat, params)
        assert done.metrics.stop_reason in ("max_tokens", "eos"), done.metrics.notes
        if done.metrics.dropped_count:
            drops.append(done.metrics.notes)
        answer = ChatMessage("assistant", done.text)
        tiny.prewarm(chat, answer)
        chat = [*chat, answer, ChatMessage("user", f"More {turn}")]
    # Before (qwen35): llama.cpp refused to cut the state, the kept text was read onto
    # it, and every reply from then on failed ("llama.cpp failed to evaluate the prompt
    # (code 1)").
    assert drops, "ten turns never filled 256 tokens"
    assert all(any("left the model's memory" in n for n in notes) for notes in drops)


def test_a_removal_llama_cpp_refuses_empties_the_cache(arch_engine: tuple[str, Engine]) -> None:
    arch, tiny = arch_engine
    tiny.reset()
    reply(tiny, [ChatMessage("user", "Hi")], GREEDY)
    loaded, kv = tiny._loaded, tiny._kv
    assert loaded is not None and kv is not None and len(kv.map.tokens) > 4
    # A cut inside a recurrent state is refused: nothing of the old state may stay.
    assert not take_back(loaded.native, kv.map, 2), arch
    assert kv.map.tokens == [] and loaded.native.seq_pos_min() == -1
    assert reply(tiny, [ChatMessage("user", "Hi")], GREEDY).metrics.evaluated_tokens > 4


def test_the_window_says_how_the_model_remembers(
    arch_engine: tuple[str, Engine], qtbot: QtBot
) -> None:
    from PySide6.QtWidgets import QMainWindow

    from app.engine.native.hardware import HardwareInfo
    from ui.models.model_status import ModelStatus, memory_text
    from ui.perf.backend_page import BackendPage

    arch, tiny = arch_engine
    info = tiny.model
    assert info is not None
    text = memory_text(info)
    assert text.startswith("Memory: ") and "checkpoints" in text
    assert ("hybrid" in text) == (arch != "mamba2")
    window = QMainWindow()
    qtbot.addWidget(window)
    status = ModelStatus(window, window.statusBar(), lambda: None)
    status.loaded(info)
    assert text in status.label.toolTip()  # the status bar's model corner
    page = BackendPage(HardwareInfo(False), "", None, memory=text)  # Help -> Hardware
    qtbot.addWidget(page)
    assert page.memory.text() == text and not page.memory.isHidden()


def test_a_regenerate_reads_only_the_last_prompt_token_and_gives_the_same_reply(
    arch_engine: tuple[str, Engine],
) -> None:
    _arch, tiny = arch_engine
    tiny.reset()
    ask = [ChatMessage("user", "Hello there, how are you today? " * 2)]
    first = reply(tiny, ask, GREEDY)
    again = reply(tiny, ask, GREEDY)
    # Before: "llama.cpp could not rewind the cache", and the whole prompt was read again.
    assert again.metrics.evaluated_tokens == 1 and not again.metrics.cache_note
    assert again.text == first.text


def test_the_next_turn_and_an_edit_read_only_what_is_new(arch_engine: tuple[str, Engine]) -> None:
    _arch, tiny = arch_engine
    tiny.reset()
    chat = [ChatMessage("user", "Hello there, how are you today? " * 2)]
    answer = ChatMessage("assistant", reply(tiny, chat, GREEDY).text)
    tiny.prewarm(chat, answer)  # the app reads the next turn's opening after each reply
    second = reply(tiny, [*chat, answer, ChatMessage("user", "And again?")], GREEDY)
    new = len(tiny.tokenize("And again?\n<|assistant|>"))
    assert second.metrics.evaluated_tokens <= new, second.metrics  # mamba2 read all 272
    edited = reply(tiny, [*chat, answer, ChatMessage("user", "Or else?")], GREEDY)
    assert edited.metrics.evaluated_tokens <= new and not edited.metrics.cache_note


SNAPSHOT = SnapshotHeader(
    model={"name": "tiny.gguf", "size": 1, "sha256": "00" * 32},
    runtime={"llama_cpp_python": "x"},
    cache={"n_ctx": 256},
    lora=[],
)


def test_a_reopened_chat_rewinds_as_the_open_one_did(
    arch_engine: tuple[str, Engine], tmp_path: Path
) -> None:
    _arch, tiny = arch_engine
    tiny.reset()
    ask = [ChatMessage("user", "Hello there, how are you today? " * 2)]
    first = reply(tiny, ask, GREEDY)
    saved = tiny.export_state()
    assert len(saved.checkpoints) == 2  # before the prompt's last token, the reply's end
    path = tmp_path / "chat.lpkv"
    write_snapshot(path, SNAPSHOT, saved)
    tiny.reset()
    tiny.import_state(read_snapshot(path, SNAPSHOT))
    # A regenerate after reopening: before, the whole chat was read again (no checkpoint
    # was saved with it), and lfm2 saved no snapshot at all (its cache had been dropped).
    again = reply(tiny, ask, GREEDY)
    assert again.metrics.evaluated_tokens == 1 and again.text == first.text
    # Checkpoints llama.cpp cannot read (a file rewritten with its sum fixed): refused,
    # and the chat is read again with a note, never a crash.
    garbage = tuple((n, bytes(len(d))) for n, d in saved.checkpoints)
    tiny.reset()
    tiny.import_state(replace(saved, checkpoints=garbage))
    fresh = reply(tiny, ask, GREEDY)
    assert fresh.metrics.evaluated_tokens == fresh.metrics.prompt_tokens
    assert "no checkpoint" in fresh.metrics.cache_note and fresh.text == first.text


def test_a_version_switch_reads_the_chosen_reply_and_what_follows(
    arch_engine: tuple[str, Engine],
) -> None:
    _arch, tiny = arch_engine
    tiny.reset()
    ask = [ChatMessage("user", "Hello there, how are you today? " * 2)]
    # An earlier version of the reply, in words (a random model's bytes do not survive
    # the trip to text and back, so a read from scratch would differ for that reason).
    first = ChatMessage("assistant", "Fine, thanks. And you?")
    reply(tiny, ask, GREEDY)  # the version now in the cache...
    again = reply(tiny, ask, GREEDY)  # ... regenerated
    assert again.metrics.evaluated_tokens == 1
    tiny.prewarm(ask, ChatMessage("assistant", again.text))
    # The user switches back to the first version and writes on.
    chat = [*ask, first, ChatMessage("user", "And again?")]
    switched = reply(tiny, chat, GREEDY)
    new = len(tiny.tokenize(f"{first.content}\n<|user|>And again?\n<|assistant|>"))
    assert switched.metrics.evaluated_tokens <= new + 1, switched.metrics
    assert not switched.metrics.cache_note
    tiny.reset()
    assert reply(tiny, chat, GREEDY).text == switched.text  # as a read from scratch


def test_a_reopened_chat_reads_only_the_new_message(
    arch_engine: tuple[str, Engine], tmp_path: Path
) -> None:
    _arch, tiny = arch_engine
    tiny.reset()
    ask = [ChatMessage("user", "Hello there, how are you today? " * 2)]
    answer = ChatMessage("assistant", reply(tiny, ask, GREEDY).text)
    tiny.prewarm(ask, answer)  # after each reply, as the app does, then saved
    path = tmp_path / "chat.lpkv"
    write_snapshot(path, SNAPSHOT, tiny.export_state())
    chat = [*ask, answer, ChatMessage("user", "And again?")]
    want = reply(tiny, chat, GREEDY)
    tiny.reset()
    tiny.import_state(read_snapshot(path, SNAPSHOT))
    got = reply(tiny, chat, GREEDY)
    new = len(tiny.tokenize("And again?\n<|assistant|>"))
    assert got.metrics.evaluated_tokens <= new and not got.metrics.cache_note
    assert got.text == want.text  # a restore changes nothing in the reply


def test_the_apps_snapshot_path_resumes_a_hybrid_chat_without_reading_it_again(
    arch_engine: tuple[str, Engine], tmp_path: Path
) -> None:
    # The case: lfm2 saved nothing (its cache had been dropped before the save)
    # and a resumed chat read all of it again.
    from app.chat.session_cache import SessionCache
    from app.chat.store import ConversationStore
    from app.util.hashing import FingerprintCache

    _arch, tiny = arch_engine
    tiny.reset()
    store = ConversationStore(tmp_path / "data")
    cache = SessionCache(tiny, store, FingerprintCache(tmp_path / "data" / "fingerprints.json"))
    ask = [ChatMessage("user", "Describe the sea. " * 4)]
    answer = ChatMessage("assistant", "Blue.")
    first = reply(tiny, ask, GREEDY)
    tiny.prewarm(ask, answer)
    size, _ = cache.save("conv")
    assert size > 0 and tiny.export_state().checkpoints
    chat = [*ask, answer, ChatMessage("user", "And the sky?")]
    tiny.reset()
    result = cache.restore("conv")
    assert result.restored, result.note
    resumed = reply(tiny, chat, GREEDY)
    assert resumed.metrics.evaluated_tokens <= len(tiny.tokenize("And the sky?\n<|assistant|>"))
    tiny.reset()
    assert cache.restore("conv").restored
    again = reply(tiny, ask, GREEDY)  # a regenerate of the saved reply, after reopening
    assert again.metrics.evaluated_tokens == 1 and again.text == first.text
