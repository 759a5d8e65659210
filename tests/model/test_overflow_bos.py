"""No context overflow drops BOS: after every kind of drop the cache is a fresh read's tokens.

Three paths drop messages from the KV cache: before a prompt (shifting what stays),
the same when the cache cannot shift (the kept tail is read again), and while a reply
is generated. Each runs under both policies, with and without a system prompt (this
model's template folds the system prompt into the first user turn, so there is no
boundary after it and the kept text is read again from its last mark). After the drop
the cache must hold exactly the tokens a fresh read of the kept messages gives, BOS
first, at positions 0 to n - 1, and no mark twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.config.setting_records import LoadConfig
from app.engine.backend import KvState
from app.engine.chat_message import ChatMessage
from app.engine.context_map import ContextMap
from app.engine.local.engine import Engine
from app.engine.local.kv_sequence import HEAD_LOST_NOTE
from app.engine.metrics import MessageMetrics
from tests.model.test_context_overflow import ask, params
from tests.near_tie import reply_nll, same_up_to_near_tie

N_CTX = 256  # the least the loader accepts
SYSTEM = ChatMessage("system", "You answer in one short line.")
SHIFT_NLL = 1.0  # as in test_context_overflow: a shifted cache remembers a little of the dropped
STORY = ChatMessage("user", "Tell me a long story about the sea.")  # replies run past 150 tokens


@pytest.fixture(scope="module")
def small(model_path: Path) -> Iterator[Engine]:
    engine = Engine()
    engine.load(model_path, LoadConfig(n_ctx=N_CTX, n_threads=1))
    yield engine
    engine.unload()


def chat(exchanges: int, system: bool, last: ChatMessage | None = None) -> list[ChatMessage]:
    """``exchanges`` questions with fixed answers, then one more question (or ``last``)."""
    out = [SYSTEM] if system else []
    for i in range(exchanges):
        out.append(ChatMessage("user", f"Question {i}: name one thing about the number {i}."))
        out.append(ChatMessage("assistant", f"The number {i} is a number."))
    out.append(last or ChatMessage("user", f"Question {exchanges}: and the number {exchanges}?"))
    return out


def fitting(engine: Engine, system: bool, room: int, last: ChatMessage | None = None) -> int:
    """The most exchanges whose chat leaves ``room`` tokens free."""
    n = 0
    while len(engine.prompt_tokens(chat(n + 1, system, last))) + room <= N_CTX:
        n += 1
    return n


_STATES: dict[tuple[bool, bool], tuple[int, KvState]] = {}


def filled(engine: Engine, system: bool, reply: bool) -> int:
    """Put a chat that (nearly) fills the context in the cache, as the last prompt left it;
    returns its number of exchanges. With ``reply`` the chat ends with ``STORY`` and leaves
    just the room of a 64-token reply; else one more exchange overflows it."""
    key = (system, reply)
    if key not in _STATES:
        engine.reset()
        last = STORY if reply else None
        n = fitting(engine, system, N_CTX // 4 if reply else 2, last)
        ask(engine, chat(n, system, last), params("stop", 1))
        engine._kv.rewind(len(engine.prompt_tokens(chat(n, system, last))))  # the prompt alone
        _STATES[key] = n, engine.export_state()
    n, state = _STATES[key]
    engine.import_state(state)
    return n


def kept(messages: list[ChatMessage], m: MessageMetrics) -> list[ChatMessage]:
    return [*messages[: m.dropped_from], *messages[m.dropped_from + m.dropped_count :]]


def assert_fresh_read(engine: Engine, messages: list[ChatMessage]) -> None:
    """The cache starts with the kept messages' fresh tokenization, BOS first, at positions
    0 to n - 1, and holds no mark twice."""
    import llama_cpp

    cache = engine.cached_tokens
    fresh = engine.prompt_tokens(messages)
    assert cache[0] == engine.llama.token_bos()
    assert cache[: len(fresh)] == fresh
    mem = engine.native.memory
    pos = llama_cpp.llama_memory_seq_pos_min(mem, 0), llama_cpp.llama_memory_seq_pos_max(mem, 0)
    assert pos == (0, len(cache) - 1)
    marks = engine._kv.map.marks
    assert marks == sorted(set(marks)), marks


CASES = [
    pytest.param(path, policy, system, id=f"{path}-{policy}-{'system' if system else 'none'}")
    for path in ("before_prompt", "reread", "during_reply")
    for policy in ("rolling", "truncate_middle")
    for system in (False, True)
]


@pytest.mark.parametrize(("path", "policy", "system"), CASES)
def test_a_drop_keeps_bos_and_leaves_a_fresh_reads_tokens(
    small: Engine, monkeypatch: pytest.MonkeyPatch, path: str, policy: str, system: bool
) -> None:
    """After the drop, the cache holds a fresh read's tokens. Where the bug was (rolling,
    nothing protected: the first drop starts at token 0), the next reply is also compared
    with a fresh read's: the same up to near-ties where the kept text was read again, about
    as likely where it was shifted (see test_context_overflow's shift test)."""
    if path == "reread":
        monkeypatch.setattr(small._loaded, "can_shift", False)
    if path == "during_reply":
        n = filled(small, system, reply=True)
        messages = chat(n, system, STORY)
        room = N_CTX - len(small.cached_tokens)
        _, m = ask(small, messages, params(policy, room + 8))  # a budget of a quarter fits
        assert m.cached_tokens == m.prompt_tokens - 1, m  # no drop before the reply
        assert m.dropped_count and m.generated_tokens > room, m  # it went on past the limit
        assert_fresh_read(small, kept(messages, m))
        return
    messages = chat(filled(small, system, reply=False) + 1, system)
    p = params(policy, 8)
    _, m = ask(small, messages, p)
    assert m.dropped_count, m
    left = kept(messages, m)
    assert_fresh_read(small, left)
    if policy != "rolling" or system:
        return
    shifted = small.cached_tokens
    small.reset()
    ask(small, left, p)
    fresh = small.cached_tokens
    assert fresh[: m.prompt_tokens] == shifted[: m.prompt_tokens]
    if path == "reread":  # a fresh read but for the batch shapes
        same_up_to_near_tie(small, shifted, fresh, m.prompt_tokens, p)
    else:
        shifted_nll = reply_nll(small, shifted, m.prompt_tokens, p)
        fresh_nll = reply_nll(small, fresh, m.prompt_tokens, p)
        assert shifted_nll <= fresh_nll + SHIFT_NLL, (shifted_nll, fresh_nll)


def test_a_drop_keeps_each_mark_once() -> None:
    cmap = ContextMap(list(range(10)), "abcdefghij", [(0, 0), (1, 0), (4, 3), (7, 6), (10, 10)])
    cmap.drop(1, 4, 0, 3)
    assert cmap.marks == [(0, 0), (1, 0), (4, 3), (7, 7)]
    assert cmap.tokens == [0, 4, 5, 6, 7, 8, 9] and cmap.text == "defghij"


def test_a_cache_that_lost_bos_is_read_again(small: Engine) -> None:
    """A cache without BOS (a snapshot saved by a version that dropped it) is not continued."""
    import threading

    small.reset()
    messages = [ChatMessage("user", "Hello there.")]
    assert small.template is not None
    text = small.template.render(messages, True)
    for _event in small._kv.prefill(small.tokenize(text)[1:], threading.Event()):
        pass
    small._kv.map.mark(text)
    _, m = ask(small, messages, params("rolling", 2))
    assert m.cache_note == HEAD_LOST_NOTE and m.cached_tokens == 0
    assert small.cached_tokens[0] == small.llama.token_bos()
