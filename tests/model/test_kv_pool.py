"""KvPool on the real engine: clients taking turns evaluate only their own new tokens."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.config.setting_records import SamplingParams
from app.engine.backend import Backend, Capabilities, Finished, KvState
from app.engine.chat_message import ChatMessage
from app.engine.local.engine import Engine
from app.engine.templates.override import AUTO, PLAIN
from app.host.kv_pool import GUI, LOCAL_API, KvPool, is_prefix
from tests.hypothesis_budget import examples

GREEDY = SamplingParams.greedy(8)
# Long enough (> MIN_TOKENS) to be worth pooling, short enough to keep the test fast.
TOPIC_A = (
    "Here are my notes on lighthouses, their keepers and the lamps they trimmed each "
    "night along the rocky northern coast, with the dates each light was first lit and "
    "the ships that were saved by them during the great winter storms. The keepers "
    "wrote in their logs every evening. "
)
TOPIC_B = (
    "A short history of bread: the first flat loaves baked on hot stones, the rise of "
    "leavened dough in Egypt, the guild bakers of medieval towns and the steam-driven "
    "bakeries that fed the growing cities of the nineteenth century. Rye and barley "
    "breads came first in the north. "
)


def user(text: str) -> ChatMessage:
    return ChatMessage("user", text)


@pytest.fixture()
def eng(one_engine: Engine) -> Iterator[Engine]:
    one_engine.reset()
    one_engine.set_template(AUTO)
    yield one_engine
    one_engine.set_template(AUTO)
    one_engine.reset()


def turn(
    engine: Backend,
    pool: KvPool,
    key: str | None,
    messages: Sequence[ChatMessage],
    party: str = LOCAL_API,
) -> Finished:
    """One request as the worker runs it: prepare, generate, finish."""
    pool.prepare(key, messages, party)
    ended = [e for e in engine.generate(messages, GREEDY) if isinstance(e, Finished)]
    assert len(ended) == 1
    pool.finish(key, messages, ChatMessage("assistant", ended[0].text), party)
    return ended[0]


def follow_up(first: Sequence[ChatMessage], reply: Finished) -> list[ChatMessage]:
    return [*first, ChatMessage("assistant", reply.text), user("And then what happened?")]


def assert_only_new(reply: Finished, before: Finished) -> None:
    """``reply`` (a follow-up) reused the whole earlier turn and read only its new text."""
    m = reply.metrics
    assert m.cache_note == ""
    assert m.cached_tokens >= before.metrics.prompt_tokens + before.metrics.generated_tokens
    assert m.evaluated_tokens <= 24, m  # "<end_of_turn> ... And then what happened? ..."
    assert m.evaluated_tokens == m.prompt_tokens - m.cached_tokens


def test_a_b_then_a_follow_up_reads_only_its_new_tokens(eng: Engine) -> None:
    pool = KvPool(eng)
    a = [user(TOPIC_A + "Tell me about them.")]
    b = [user(TOPIC_B + "Tell me more.")]
    ra = turn(eng, pool, None, a)
    assert ra.metrics.prompt_tokens > 64
    rb = turn(eng, pool, None, b)
    assert rb.metrics.cached_tokens <= 8  # B shares only the template's opening with A
    assert pool.stats.stashed == 1 and len(pool.entries) == 1

    a2 = follow_up(a, ra)
    ra2 = turn(eng, pool, None, a2)
    assert pool.stats.restored == 1
    assert_only_new(ra2, ra)
    # B's cache went to the pool in turn: B's follow-up is cheap as well.
    rb2 = turn(eng, pool, None, follow_up(b, rb))
    assert_only_new(rb2, rb)
    assert pool.stats.restored == 2


def test_a_plain_follow_up_keeps_the_live_cache(eng: Engine) -> None:
    pool = KvPool(eng)
    a = [user(TOPIC_A + "Tell me about them.")]
    ra = turn(eng, pool, None, a)
    assert pool.prepare(None, follow_up(a, ra)) == "live"
    ra2 = turn(eng, pool, None, follow_up(a, ra))
    assert_only_new(ra2, ra)
    assert pool.stats.stashed == 0 and pool.stats.restored == 0  # no export, no import


def test_a_gui_conversation_comes_back_after_an_api_request(eng: Engine) -> None:
    pool = KvPool(eng)
    gui = [user(TOPIC_A + "What do you think?")]
    rg = turn(eng, pool, "gui:c1", gui, GUI)
    turn(eng, pool, None, [user(TOPIC_B + "Summarise it.")])
    rg2 = turn(eng, pool, "gui:c1", follow_up(gui, rg), GUI)
    assert pool.stats.restored == 1
    assert_only_new(rg2, rg)


def test_no_party_reuses_another_partys_cache(eng: Engine) -> None:
    """An API client that repeats the window's chat, or another key's, finds nothing
    cached (neither ``cached_tokens`` nor the time tells it the guess was right); each
    party's own conversations still come back whole."""
    pool = KvPool(eng)
    gui = [user(TOPIC_A + "What do you think?")]
    rg = turn(eng, pool, "gui:c1", gui, GUI)
    guess = follow_up(gui, rg)  # the window's conversation, word for word
    ra = turn(eng, pool, None, guess, "api:a")
    assert ra.metrics.cached_tokens == 0
    a2 = follow_up(guess, ra)
    ra2 = turn(eng, pool, None, a2, "api:a")  # its own follow-up: the live cache
    assert_only_new(ra2, ra)
    rb = turn(eng, pool, None, a2, "api:b")  # key B repeats key A's
    assert rb.metrics.cached_tokens == 0
    assert turn(eng, pool, None, a2, LOCAL_API).metrics.cached_tokens == 0  # no key: its own
    assert_only_new(turn(eng, pool, None, follow_up(a2, ra2), "api:a"), ra2)  # restored
    # The window's chat comes back from its own entry, not from the API's copy of it.
    rg2 = turn(eng, pool, "gui:c1", guess, GUI)
    assert_only_new(rg2, rg)
    assert pool.stats.restored == 2


def test_with_the_pool_off_no_party_reuses_another_partys_cache(eng: Engine) -> None:
    pool = KvPool(eng, pool_mb=0)
    gui = [user(TOPIC_A + "What do you think?")]
    rg = turn(eng, pool, "gui:c1", gui, GUI)
    ra = turn(eng, pool, None, follow_up(gui, rg), LOCAL_API)
    assert ra.metrics.cached_tokens == 0
    assert_only_new(turn(eng, pool, None, follow_up(follow_up(gui, rg), ra)), ra)


def test_a_template_or_lora_change_is_not_restored(
    eng: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = KvPool(eng)
    a = [user(TOPIC_A + "Tell me about them.")]
    ra = turn(eng, pool, None, a)
    turn(eng, pool, None, [user(TOPIC_B + "Tell me more.")])
    assert len(pool.entries) == 1
    # Another template renders other text: A's cache is no use to it.
    eng.set_template(PLAIN)
    assert pool.prepare(None, follow_up(a, ra)) == "none"
    eng.set_template(AUTO)
    # Another LoRA stack: the cached keys and values were computed without it.
    sig = [{"path": "/x/adapter.gguf", "scale": 1.0}]
    monkeypatch.setattr(eng, "lora_signature", lambda: sig)
    assert pool.prepare(None, follow_up(a, ra)) == "none"
    assert pool.stats.restored == 0
    monkeypatch.undo()
    assert pool.prepare(None, follow_up(a, ra)) == "restored"


def test_the_pool_keeps_to_its_budget_and_entry_count(eng: Engine) -> None:
    pool = KvPool(eng, max_entries=2)
    chats = [[user(f"Client {i}: " + (TOPIC_A if i % 2 else TOPIC_B))] for i in range(4)]
    for chat in chats:
        turn(eng, pool, None, chat)
    assert pool.stats.stashed == 3 and pool.stats.evicted == 1
    assert [e.owner.messages[0] for e in pool.entries if e.owner.messages] == [
        chats[1][0],
        chats[2][0],
    ]
    size = pool.entries[0].size
    # A budget that holds one entry keeps the newest only.
    small = KvPool(eng, pool_mb=1)
    small.budget = size + size // 2
    for chat in chats:
        turn(eng, small, None, chat)
    assert len(small.entries) == 1 and small.bytes_used <= small.budget
    assert small.entries[0].owner.messages == (
        chats[2][0],
        cast(Any, small.entries[0].owner.messages)[1],
    )


def test_the_same_request_again_keeps_the_live_cache(eng: Engine) -> None:
    pool = KvPool(eng)
    a = [user(TOPIC_A + "Tell me about them.")]
    ra = turn(eng, pool, None, a)
    assert pool.prepare(None, a) == "live"  # a retry: the live cache rewinds its reply
    again = turn(eng, pool, None, a)
    assert again.text == ra.text and again.metrics.evaluated_tokens <= 2
    assert pool.stats.stashed == 0


def test_a_newer_cache_of_a_conversation_replaces_its_entry(eng: Engine) -> None:
    pool = KvPool(eng)
    a = [user(TOPIC_A + "Tell me about them.")]
    b = [user(TOPIC_B + "Tell me more.")]
    for chat in (a, b, a, b):  # each asks afresh (no follow-up): nothing to restore
        turn(eng, pool, None, chat)
    assert pool.stats.stashed == 3 and pool.stats.restored == 0
    firsts = [e.owner.messages[0] for e in pool.entries if e.owner.messages]
    assert firsts == [b[0], a[0]]  # A's first entry gave way to its newer copy


class _NoSnapshots:
    """The engine, saying it keeps no snapshots (as a server backend may)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.capabilities = replace(engine.capabilities, snapshots=False)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


def test_without_snapshots_the_pool_does_nothing(eng: Engine) -> None:
    backend = cast(Backend, _NoSnapshots(eng))
    assert isinstance(backend.capabilities, Capabilities)
    pool = KvPool(backend)
    turn(backend, pool, None, [user(TOPIC_A)])
    turn(backend, pool, None, [user(TOPIC_B)])
    assert pool.prepare(None, [user(TOPIC_A)]) == "off"
    assert pool.entries == [] and pool.stats.stashed == 0 and pool.live is None


def test_is_prefix_compares_replies_trimmed() -> None:
    a = [user("hi"), ChatMessage("assistant", " hello \n")]
    assert is_prefix(a, [user("hi"), ChatMessage("assistant", "hello"), user("x")])
    assert not is_prefix(a, [user("hi ")])
    assert not is_prefix(a, [user("hi"), ChatMessage("user", "hello")])


def test_export_and_import_time_of_a_long_conversation(eng: Engine) -> None:
    """~1,500 tokens: what a stash and a restore cost (printed for the notes)."""
    text = (TOPIC_A + TOPIC_B) * 13
    msgs = [user(text)]
    ra = turn(eng, KvPool(eng), None, msgs)
    n = ra.metrics.prompt_tokens + ra.metrics.generated_tokens
    assert 1200 <= n <= 1900, n
    t0 = time.perf_counter()
    kv = eng.export_state()
    t1 = time.perf_counter()
    eng.import_state(kv)
    t2 = time.perf_counter()
    print(
        f"\nKV state of {len(kv.tokens)} tokens: {len(kv.state) / 2**20:.1f} MiB, "
        f"export {(t1 - t0) * 1000:.0f} ms, import {(t2 - t1) * 1000:.0f} ms"
    )
    assert len(eng.cached_tokens) == len(kv.tokens)
    assert (t1 - t0) + (t2 - t1) < 2.0


class _TokenBackend:
    """A backend whose cache is a list of message tuples (one token a message), enough
    to check the pool's choices without llama.cpp."""

    def __init__(self) -> None:
        self.model = cast(Any, type("Info", (), {"template": "chat (auto)"})())
        self.capabilities = Capabilities(snapshots=True)
        self.held: tuple[ChatMessage, ...] = ()  # what the cache encodes
        self.sig: list[dict[str, Any]] = []
        self.by_state: dict[int, tuple[ChatMessage, ...]] = {}

    def cache_config(self) -> dict[str, Any]:
        return {"n_ctx": 4096, "lora": self.sig}

    def lora_signature(self) -> list[dict[str, Any]]:
        return self.sig

    def export_state(self, key: str = "") -> KvState:
        return KvState(b"x" * 100 * len(self.held), list(range(len(self.held))), "", [])

    def import_state(self, kv: KvState) -> None:
        self.held = self.by_state[id(kv)]

    def reset(self) -> None:
        self.held = ()


# Fuzzed clients: two API keys, the keyless client, and the window.
PARTIES = ("api:a", "api:b", LOCAL_API, GUI)


@settings(max_examples=examples(200), deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.sampled_from(["ask", "follow", "again", "lora"])),
        max_size=30,
    )
)
def test_the_pool_only_restores_what_the_request_extends(
    steps: list[tuple[int, str]],
) -> None:
    """Whatever the clients do, a request starts from its own party's cache or an empty
    one, and an entry of its own that it extends is never passed over."""
    backend = _TokenBackend()
    made_by: dict[tuple[ChatMessage, ...], str] = {}  # each cache: the party that made it
    keys: dict[int, str | None] = {}  # each client's conversation key (the window's)
    pool = KvPool(cast(Backend, backend), max_entries=3, min_tokens=2)
    pool.budget = 100 * 12  # 12 messages' worth
    chats: dict[int, list[ChatMessage]] = {}
    real_export = backend.export_state

    def export(key: str = "") -> KvState:
        kv = real_export(key)
        backend.by_state[id(kv)] = backend.held
        return kv

    backend.export_state = export  # type: ignore[method-assign]
    for n, (client, op) in enumerate(steps):
        if op == "lora":
            backend.sig = [{"scale": float(n)}]
            pool.forget_live()
            continue
        party = PARTIES[client]
        chat = chats.get(client, [])
        if op == "follow" and chat:
            chat = [*chat, user(f"more {n}")]
        elif op != "again" or not chat:
            chat = [user(f"client {client} asks {n}"), user("x")]
            keys[client] = f"gui:{n}" if party == GUI else None  # a new conversation
        key = keys.get(client)
        before = backend.held
        usable = any(
            e.owner.messages is not None
            and is_prefix(e.owner.messages, chat)
            and e.config == backend.cache_config()
            and e.owner.party == party
            for e in pool.entries
        )
        done = pool.prepare(key, chat, party)
        if usable:  # an entry this request extends is never passed over
            assert done in ("live", "restored")
        held = backend.held
        assert not held or made_by[held] == party  # never another party's tokens
        if done == "restored":
            assert is_prefix(held, chat)  # only a full prefix is restored
        elif done == "live":
            assert held == before
            assert is_prefix(held, chat) or is_prefix(held[:-1], chat)
        else:  # left for the engine's prefix match, if the party's own
            assert done == "none" and held in (before, ())
        assert len(pool.entries) <= pool.max_entries and pool.bytes_used <= pool.budget
        reply = f"reply {n}"
        backend.held = (*chat, ChatMessage("assistant", reply))  # what generate leaves
        made_by[backend.held] = party
        pool.finish(key, chat, ChatMessage("assistant", reply), party)
        chats[client] = [*chat, ChatMessage("assistant", reply)]
