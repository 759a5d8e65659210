"""Conversations that outgrow the context keep going: whole messages drop, the KV cache shifts."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pytestqt.qtbot import QtBot

from app.chat.store import ConversationStore
from app.config.paths import data_dirs
from app.config.setting_records import LoadConfig, SamplingParams
from app.config.settings import AppSettings
from app.engine.backend import Finished, KvState
from app.engine.chat_message import ChatMessage
from app.engine.local.engine import Engine
from app.engine.metrics import MessageMetrics
from app.engine.prompt.overflow import plan_drop, protected_head, reply_budget
from app.util.errors import ContextOverflowError
from tests import real_window
from tests.conftest import TEST_LOAD
from tests.hypothesis_budget import examples
from tests.near_tie import assert_greedy, reply_gaps, reply_nll, token_text
from ui.window.main_window import MainWindow

N_CTX = 512
SYSTEM = ChatMessage("system", "You answer in one short line.")


@pytest.fixture(scope="module")
def small(model_path: Path) -> Iterator[Engine]:
    # One thread, as conftest's ONE_THREAD: two threads on two shared cores wait on each
    # other (40 turns took 365 s beside a build here, past the 300 s test timeout; 45 s
    # on one thread).
    engine = Engine()
    engine.load(model_path, LoadConfig(n_ctx=N_CTX, n_threads=1))
    yield engine
    engine.unload()


def params(policy: str, max_tokens: int = 24) -> SamplingParams:
    # A repeat penalty keeps the base model from echoing one line until max_tokens.
    return replace(SamplingParams.greedy(max_tokens), overflow=policy, repeat_penalty=1.3)


def ask(
    engine: Engine, messages: list[ChatMessage], p: SamplingParams
) -> tuple[str, MessageMetrics]:
    end = None
    for event in engine.generate(messages, p):
        if isinstance(event, Finished):
            end = event
    assert end is not None
    return end.text, end.metrics


def question(turn: int) -> ChatMessage:
    return ChatMessage("user", f"Question {turn}: name one thing about the number {turn}.")


def converse(
    engine: Engine, p: SamplingParams, turns: int, system: bool
) -> Iterator[tuple[int, list[ChatMessage], MessageMetrics]]:
    """A chat the way ChatSession runs it: dropped messages are not sent again."""
    engine.reset()
    return go_on(engine, [SYSTEM] if system else [], p, range(turns))


def go_on(
    engine: Engine, chat: list[ChatMessage], p: SamplingParams, turns: Iterable[int]
) -> Iterator[tuple[int, list[ChatMessage], MessageMetrics]]:
    """``converse`` from ``chat``, whose cache the engine holds, asking ``turns``."""
    kept = list(chat)
    for turn in turns:
        kept.append(question(turn))
        text, metrics = ask(engine, kept, p)
        if metrics.dropped_count:
            del kept[metrics.dropped_from : metrics.dropped_from + metrics.dropped_count]
        kept.append(ChatMessage("assistant", text))
        engine.prewarm(kept[:-1], ChatMessage("assistant", text))
        yield turn, kept, metrics


def overflow_by(engine: Engine, p: SamplingParams, system: bool) -> int:
    """The turn by which the questions alone, with empty replies, no longer fit beside
    the reply budget: any chat's first overflow comes no later, whatever was replied."""
    assert engine.template is not None
    budget = reply_budget(p.max_tokens, N_CTX)
    chat = [SYSTEM] if system else []
    for turn in range(N_CTX):
        chat.append(question(turn))
        if len(engine.tokenize(engine.template.render(chat, True))) + budget > N_CTX:
            return turn
        chat.append(ChatMessage("assistant", ""))
    raise AssertionError("the questions never fill the context")


def kv_positions(engine: Engine) -> tuple[int, int]:
    """The lowest and highest position in KV sequence 0."""
    import llama_cpp

    mem = engine.native.memory
    return llama_cpp.llama_memory_seq_pos_min(mem, 0), llama_cpp.llama_memory_seq_pos_max(mem, 0)


OPEN_USER = "<end_of_turn>\n<start_of_turn>user\n"


def assert_read_only_the_new_turn(read: str, previous_reply: str, message: str) -> None:
    """``read``, the text a turn evaluated, is the new message's turn and nothing older
    than the turn markers after the previous reply (prewarm evaluates those ahead, unless
    the context had no room left); all of the previous reply too only where the template
    changed it (it strips replies) or it ended inside a character, so the cached text no
    longer matched."""
    turn = f"{message}<end_of_turn>\n<start_of_turn>model\n"
    assert read.endswith(turn), read
    assert f"{previous_reply.strip()}{OPEN_USER}{turn}".endswith(read), read
    if previous_reply == previous_reply.strip() and not previous_reply.endswith("\ufffd"):
        assert read in (turn, OPEN_USER + turn), read


# Turns checked after the first overflow: each drops a message or two, so the context
# overflows again and again, and every drop has been shifted past several times.
PAST_OVERFLOW = 8


@pytest.mark.parametrize("policy", ["truncate_middle", "rolling"])
def test_long_chats_never_dead_end_and_read_only_new_tokens(small: Engine, policy: str) -> None:
    """What the replies say, and so how long they are, when the context fills and where
    each turn's text ends, depends on the CPU's rounding (docs/NOTES.md): this checks
    what holds whatever the replies are, up to 40 turns."""
    system = policy == "truncate_middle"
    p = params(policy)
    first_overflow = None
    overflows = 0
    for turn, kept, m in converse(small, p, 40, system):
        overflows += m.dropped_count > 0
        assert m.stop_reason in ("eos", "max_tokens", "stop_string"), (turn, m.stop_reason)
        assert m.kv_tokens <= N_CTX
        assert m.evaluated_tokens == m.prompt_tokens - m.cached_tokens
        if m.dropped_count and first_overflow is None:
            first_overflow = turn
        # The cache holds exactly the messages the model still sees (what the next
        # prompt sends), whatever was dropped and shifted, then the reply, at positions
        # 0 to n - 1: every drop shifted what followed by exactly what it removed.
        sent = kept[:-1]
        cache = small.cached_tokens
        assert kv_positions(small) == (0, len(cache) - 1), turn
        expected = token_text(small, small.prompt_tokens(sent))
        assert cache[:1] == [small.llama.token_bos()], turn  # BOS is never shifted out
        assert token_text(small, cache[: m.prompt_tokens]) == expected, turn
        if first_overflow is not None and turn > first_overflow:
            # Only the new message and its turn markers are read, not the kept text.
            read = token_text(small, cache[m.cached_tokens : m.prompt_tokens])
            assert_read_only_the_new_turn(read, sent[-2].content, sent[-1].content)
            assert not m.cache_note
        if system:
            assert kept[0] == SYSTEM
            assert kept[1].content.startswith("Question 0:")  # the first exchange stays
            assert kept[2].role == "assistant"
        roles = [k.role for k in kept if k.role != "system"]
        assert roles == ["user", "assistant"] * (len(roles) // 2)
        if first_overflow is not None and turn >= first_overflow + PAST_OVERFLOW:
            break
    # Overflow comes when the context is full, which the questions alone make it by
    # ``overflow_by`` (turn 20 here; replies of 24 tokens overflow at turn 10).
    assert first_overflow is not None and first_overflow <= overflow_by(small, p, system)
    assert overflows >= 3, overflows


def test_stop_policy_says_so_and_the_way_on(
    small: Engine, shifted_chat: tuple[list[ChatMessage], KvState]
) -> None:
    kept, state = shifted_chat
    small.import_state(state)  # a full chat: the next turns run out of room
    with pytest.raises(ContextOverflowError) as caught:
        for _ in go_on(small, kept, params("stop", 64), range(100, 110)):
            pass
    assert ContextOverflowError.MARK in str(caught.value)
    assert "Drop older messages" in str(caught.value)


def test_a_reply_that_reaches_the_limit_continues_past_it(small: Engine) -> None:
    small.reset()
    story = [ChatMessage("user", "Tell me a long story about the sea. " * 30)]
    filler = ask(small, story, params("rolling", 8))[0]
    messages = [*story, ChatMessage("assistant", filler), ChatMessage("user", "Go on, at length.")]
    _, m = ask(small, messages, params("rolling", 300))
    assert m.prompt_tokens + 300 > N_CTX  # the reply could not fit without a shift
    assert m.stop_reason in ("max_tokens", "eos") and m.generated_tokens > N_CTX - m.prompt_tokens
    assert m.dropped_count == 2 and m.dropped_from == 0
    assert any("left the model's memory" in n for n in m.notes)
    assert m.kv_tokens <= N_CTX


def past_overflow(
    engine: Engine, p: SamplingParams, system: bool, turns_after: int = 3
) -> Iterator[tuple[int, list[ChatMessage], MessageMetrics]]:
    """``converse`` until ``turns_after`` turns past the first overflow, which comes
    sooner or later with the replies' lengths (so with the CPU's rounding)."""
    first = None
    for turn, kept, m in converse(engine, p, 40, system):
        yield turn, kept, m
        if m.dropped_count and first is None:
            first = turn
        if first is not None and turn >= first + turns_after:
            return
    raise AssertionError("40 turns never filled the context")


@pytest.fixture(scope="module")
def shifted_chat(small: Engine) -> tuple[list[ChatMessage], KvState]:
    """A chat whose cache has shifted more than once, and that cache's state: run once
    for the tests that start from it (each imports the state)."""
    *_, (_, kept, _) = past_overflow(small, params("truncate_middle"), True)
    return list(kept), small.export_state()


SHIFT_NLL = 1.0
"""Nats per token: how much less likely a fresh read may find the reply from a shifted
cache than its own greedy reply (measured: 0.25 here)."""


def test_greedy_reply_after_a_shift_matches_a_fresh_read(
    small: Engine, shifted_chat: tuple[list[ChatMessage], KvState]
) -> None:
    """Compared: the reply to the same kept text, from the shifted cache and from scratch.

    They need not be the same text. The kept tokens' keys and values were computed
    while the dropped messages were still in view, and a shift only rotates them to
    their new positions: a shifted cache remembers a little of what was dropped, which
    a fresh read of the kept text does not (measured here, one drop moves the top
    logits by 0.6 to 2.6, against 0.3 to 0.7 for the rotation alone and 0.5 for reading
    in another batch shape), and replies part where the fresh read's top two are ~2.5
    apart, which CPUs reach differently. What must hold exactly: the cache holds the
    kept text's tokens at positions 0 to n - 1 (a shift by the wrong amount, or none,
    fails here: the reply barely shows it), and only the question was read. The reply
    from the shifted cache must be about as likely under a fresh read as the fresh
    read's own greedy reply (``SHIFT_NLL``).
    """
    kept, state = shifted_chat
    small.import_state(state)
    question = [*kept, ChatMessage("user", "What is the capital of France?")]
    p = params("truncate_middle", 16)
    _, m1 = ask(small, question, p)
    assert m1.cached_tokens > 100
    # This question may itself have made room: compare with the text the model kept.
    del question[m1.dropped_from : m1.dropped_from + m1.dropped_count]
    n = m1.prompt_tokens
    shifted = small.cached_tokens
    assert kv_positions(small) == (0, len(shifted) - 1)
    assert token_text(small, shifted[:n]) == token_text(small, small.prompt_tokens(question))
    read = token_text(small, shifted[m1.cached_tokens : n])
    assert_read_only_the_new_turn(read, question[-2].content, question[-1].content)
    small.reset()
    _, m2 = ask(small, question, p)
    assert m2.cached_tokens == 0 and m2.evaluated_tokens == m2.prompt_tokens
    fresh = small.cached_tokens
    assert fresh[: m2.prompt_tokens] == shifted[:n]  # the same tokens, read afresh
    # Each reply is greedy for its own cache, and the fresh read's (one batch and
    # one-token steps) for one batched evaluation of its tokens, up to near-ties.
    assert_greedy(reply_gaps(small, fresh, n, p))
    shifted_nll = reply_nll(small, shifted, n, p)
    fresh_nll = reply_nll(small, fresh, n, p)
    assert shifted_nll <= fresh_nll + SHIFT_NLL, (shifted_nll, fresh_nll)


def test_snapshot_of_a_shifted_chat_resumes_and_regenerate_works(
    shifted_chat: tuple[list[ChatMessage], KvState], model_path: Path
) -> None:
    kept, state = shifted_chat
    other = Engine()
    other.load(model_path, LoadConfig(n_ctx=N_CTX, n_threads=1))
    try:
        other.import_state(state)
        _, m = ask(other, [*kept, ChatMessage("user", "And one more?")], params("truncate_middle"))
        assert m.evaluated_tokens <= 25 and not m.cache_note
        # Regenerate: the same prompt again reads nothing but its last token.
        again, m2 = ask(
            other, [*kept, ChatMessage("user", "And one more?")], params("truncate_middle")
        )
        assert m2.evaluated_tokens <= 2 and again
    finally:
        other.unload()


def test_a_cache_that_cannot_shift_reads_the_kept_text_again(
    small: Engine,
    shifted_chat: tuple[list[ChatMessage], KvState],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kept, state = shifted_chat
    small.import_state(state)  # a full chat: the next turns drop messages again
    monkeypatch.setattr(small._loaded, "can_shift", False)
    reread = []
    for _turn, _kept, m in go_on(small, kept, params("truncate_middle"), range(100, 106)):
        if m.dropped_count:
            reread.append(m.evaluated_tokens)
            assert any("cannot shift" in n for n in m.notes)
            break
    assert reread and max(reread) > 100  # the kept text was evaluated again


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(st.integers(0, 400), min_size=1, max_size=30),
    st.booleans(),
    st.sampled_from(["truncate_middle", "rolling", "stop"]),
    st.integers(-5, 3000),
)
def test_drop_plans_are_whole_turns_after_the_protected_head(
    sizes: list[int], system: bool, policy: str, need: int
) -> None:
    roles = (["system"] if system else []) + ["user", "assistant"] * len(sizes)
    sizes = ([5] if system else []) + [s for s in sizes for s in (s, s)]
    plan = plan_drop(sizes, roles, policy, need, keep_last=1)
    if plan is None:
        return
    a, b = plan
    assert policy != "stop" and need > 0
    assert a == protected_head(roles, policy) and a < b <= len(roles) - 1
    assert sum(sizes[a:b]) >= need
    assert roles[b] == "user"  # the kept tail starts a turn


def test_the_app_marks_dropped_messages_and_resumes_a_shifted_chat(
    qtbot: QtBot, tmp_path: Path, model_path: Path
) -> None:
    data = tmp_path / "data"
    sampling = params("truncate_middle", 48)

    def open_window() -> MainWindow:
        settings = AppSettings(load=replace(TEST_LOAD, n_ctx=N_CTX), sampling=sampling)
        return real_window.open_window(qtbot, data, model_path, settings)

    def send(win: MainWindow, text: str) -> MessageMetrics:
        win.chat_input.setPlainText(text)
        with qtbot.waitSignal(win.replyEnded, timeout=60_000):
            win.send()
        metrics = win.reply_metrics[-1]
        qtbot.waitUntil(lambda: win.store.snapshot_bytes(win.conversation.id) > 0)
        return metrics

    win = open_window()
    turn = 0
    while not any(m.forgotten for m in win.conversation.messages):
        assert turn < 20
        send(win, f"Question {turn}: name one thing about the number {turn}.")
        turn += 1
    conv_id = win.conversation.id
    forgotten = [i for i, m in enumerate(win.conversation.messages) if m.forgotten]
    assert forgotten[0] == 2  # truncate middle: the first exchange stays
    assert "not in the model's memory" in win.transcript.toPlainText()
    assert "dropped" in win.perf_panel.context_bar.format()
    m = send(win, "One more question, please.")
    assert m.evaluated_tokens <= 40
    win.close()

    saved = ConversationStore(data_dirs(data).root).load(conv_id)
    assert [i for i, m in enumerate(saved.messages) if m.forgotten][: len(forgotten)] == forgotten
    again = open_window()
    try:
        with qtbot.waitSignal(again.conversationOpened, timeout=30_000) as opened:
            again.open_conversation(conv_id)
        assert opened.args[0].restored
        m = send(again, "And after the restart?")
        assert m.evaluated_tokens <= 40 and not m.cache_note
        assert len(again.conversation.messages) == len(saved.messages) + 2  # none lost
    finally:
        again.close()


def test_the_prompt_pipeline_marks_message_starts_and_drops_whole_turns() -> None:
    """The pipeline alone, over a tokenizer of one token per character (BOS is 0): the
    marks fall on message starts, and a fit drops the oldest whole exchange."""
    from app.engine.context_map import ContextMap
    from app.engine.prompt.overflow import Overflow
    from app.engine.prompt.pipeline import PromptPipeline, PromptRequest, record_drops
    from app.engine.templates.builtin import template_for_architecture

    def tokenize(text: str, bos: bool) -> list[int]:
        return [0] * bos + [ord(c) for c in text]

    template = template_for_architecture("gemma3", lambda _t: True)
    cmap = ContextMap()
    pipeline = PromptPipeline(template, tokenize, cmap)
    chat = [SYSTEM]
    for i in range(6):
        chat += [ChatMessage("user", f"question {i} " * 4), ChatMessage("assistant", "an answer")]
    chat.append(ChatMessage("user", "the last question"))
    prompt = pipeline.build(chat)
    assert prompt.tokens == [0, *map(ord, prompt.text)] and prompt.n_mark == 0
    assert prompt.bounds and all(n == c + 1 for n, c in prompt.bounds)
    starts = {template.render(chat[:i], False) for i in range(1, len(chat) + 1)}
    assert {prompt.text[:c] for _n, c in prompt.bounds} <= starts

    params = SamplingParams(max_tokens=16, overflow="rolling")
    request = PromptRequest(chat, params, n_ctx=len(prompt.tokens) - 40)
    overflow = Overflow(
        render=template.render,
        tokenize=lambda t: tokenize(t, False),
        cmap=ContextMap(),
        mem=None,
        can_shift=False,
        refill=lambda _t: True,
        policy=params.overflow,
        messages=list(chat),
    )
    fitted = pipeline.fit(request, prompt, overflow)
    assert len(fitted.tokens) + request.budget <= request.n_ctx
    assert overflow.messages[0] == SYSTEM and overflow.messages[-1] == chat[-1]
    assert overflow.messages[1].role == "user" and overflow.dropped_count % 2 == 0
    metrics = MessageMetrics()
    record_drops(overflow, metrics)
    assert metrics.dropped_count == overflow.dropped_count > 0
    assert metrics.notes == [overflow.note()]
