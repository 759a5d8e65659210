"""The remote backends against hostile or broken servers (issue 26).

A fake server (``tests/misbehaving_server.py``) streams forever, sends huge
events, trickles, falls silent, sends damaged JSON or SSE, lies about gzip,
answers ``/health`` as another server would, or fills ``/props`` with the wrong
types. Invariant for both backends: every reply ends with exactly one terminal
outcome (a ``Finished``, a cancelled ``Finished``, or one of our errors) within
its time bound; the text kept is under the byte cap; no other exception type
escapes. Small ``Limits`` keep each case under two seconds. One test checks a
real llama-server: normal replies are unaffected, and two chats' slot files
both resume without re-reading.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.chat.conversation import Conversation, Message
from app.chat.store import ConversationStore
from app.config.setting_records import LoadConfig, SamplingParams
from app.engine.backend import (
    MAX_REPLY_BYTES,
    SERVER_ERROR,
    SIZE_LIMIT,
    TIME_LIMIT,
    Backend,
    EngineEvent,
    Finished,
    KvState,
    PrefillProgress,
    Token,
    reply_byte_cap,
)
from app.engine.chat_message import ChatMessage
from app.remote.connection import Connection
from app.remote.http import TOKEN_SLACK, Limits, ServerUnreachable
from app.remote.llama_server.backend import LlamaServerBackend
from app.remote.llama_server.slot import SLOT_FILES
from app.remote.openai.backend import OpenAIBackend
from app.remote.openai.wire import ReplyStream
from app.util.errors import DecodeError, LamplightError, ModelLoadError, ServerOverflowError
from tests.e2e.test_remote_openai import STOP_REASONS
from tests.hypothesis_budget import examples
from tests.misbehaving_server import HEALTH, N_CTX, PROPS, STREAMS, MisbehavingServer
from tests.server_fixture import RunningServer

KINDS = ("llama-server", "openai")
SMALL = Limits(call_s=2.0, silence_s=0.4, start_s=0.6, per_token_s=0.02, ready_s=0.6)
HI = [ChatMessage("user", "hi")]
BIG_CALLS = replace(SMALL, call_s=60.0)  # megabytes each way on a loaded machine


def make(kind: str, url: str, limits: Limits = SMALL) -> Backend:
    conn = Connection("hostile", "hostile server", kind, url)
    if kind == "llama-server":
        return LlamaServerBackend(conn, limits=limits)
    return OpenAIBackend(conn, limits=limits)


@contextlib.contextmanager
def connected(kind: str, server: MisbehavingServer, limits: Limits = SMALL) -> Iterator[Backend]:
    backend = make(kind, server.url, limits)
    backend.load("", LoadConfig())
    try:
        yield backend
    finally:
        backend.unload()


def reply(
    backend: Backend, max_tokens: int = 8, stop: threading.Event | None = None
) -> tuple[list[EngineEvent], Finished]:
    """All events of one reply; checks the invariant of a reply that finished."""
    events = list(backend.generate(HI, SamplingParams(max_tokens=max_tokens), stop))
    finished = [e for e in events if isinstance(e, Finished)]
    assert len(finished) == 1 and events[-1] is finished[0], events[-3:]
    assert all(isinstance(e, Token | PrefillProgress) for e in events[:-1])
    done = finished[0]
    assert done.text == "".join(e.text for e in events if isinstance(e, Token))
    assert len(done.text.encode()) <= reply_byte_cap(max_tokens)
    assert done.metrics.stop_reason in STOP_REASONS
    return events, done


# -- 1, 2: size -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_huge_reply_is_cut_at_the_byte_cap_and_can_be_saved(kind: str, tmp_path: Path) -> None:
    """64 "tokens" of 900 KB each (58 MB) asked for as 64 tokens: cut, kept, saved."""
    with MisbehavingServer() as server, connected(kind, server) as backend:
        server.plan.stream, server.plan.tokens, server.plan.piece_bytes = "huge", 64, 900_000
        t0 = time.monotonic()
        _, done = reply(backend, max_tokens=64)
        assert time.monotonic() - t0 < 5
    assert done.metrics.stop_reason == SIZE_LIMIT
    assert len(done.text.encode()) == reply_byte_cap(64)
    assert any("more text than a reply of this length may hold" in n for n in done.metrics.notes)
    assert any("the text so far is kept" in n for n in done.metrics.notes)
    store = ConversationStore(tmp_path)
    conv = Conversation(messages=[Message("user", "hi"), Message("assistant", done.text)])
    store.save(conv)
    assert store.load(conv.id).messages[-1].content == done.text


def test_the_byte_cap_has_a_floor_and_a_ceiling() -> None:
    assert reply_byte_cap(1) == 64 << 10
    assert reply_byte_cap(10**9) == MAX_REPLY_BYTES
    stream = ReplyStream(max_bytes=10)
    assert stream.feed({"choices": [{"delta": {"content": "ééééééé"}}]}) == "ééééé"
    assert stream.full and stream.size == 10
    assert stream.feed({"choices": [{"delta": {"content": "x"}}]}) == ""


def test_reply_text_is_collected_in_linear_time() -> None:
    """One copy of the text per delta made 4 MB of 200-byte deltas take seconds."""
    stream = ReplyStream()
    event = {"choices": [{"delta": {"content": "x" * 200}}]}
    t0 = time.perf_counter()
    for _ in range(10_000):
        stream.feed(event)
    assert time.perf_counter() - t0 < 0.5
    assert stream.size == 2_000_000 and len(stream.text) == 2_000_000


# -- 3: a server that does not stop -----------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_server_that_ignores_the_token_limit_is_cut(kind: str) -> None:
    with MisbehavingServer() as server, connected(kind, server) as backend:
        server.plan.stream = "endless"
        t0 = time.monotonic()
        _, done = reply(backend, max_tokens=8)
        assert time.monotonic() - t0 < 2
    assert done.metrics.stop_reason == "max_tokens"
    assert done.metrics.generated_tokens <= 8 + TOKEN_SLACK + 1
    assert any("more than the 8 tokens asked for" in n for n in done.metrics.notes)


@pytest.mark.parametrize("kind", KINDS)
def test_a_slow_endless_server_is_cut_at_the_reply_deadline(kind: str) -> None:
    limits = Limits(call_s=2.0, silence_s=1.0, start_s=0.5, per_token_s=0.001)
    with MisbehavingServer() as server, connected(kind, server, limits) as backend:
        server.plan.stream, server.plan.delay = "slow", 0.05
        t0 = time.monotonic()
        _, done = reply(backend, max_tokens=500)  # the deadline: 0.5 + 0.5 s
        assert 0.9 < time.monotonic() - t0 < 2.0
    assert done.metrics.stop_reason == TIME_LIMIT and done.text
    assert any("still sending after 1 s" in n for n in done.metrics.notes)


@pytest.mark.parametrize("kind", KINDS)
def test_a_server_that_falls_silent_is_cut(kind: str) -> None:
    with MisbehavingServer() as server, connected(kind, server) as backend:
        server.plan.stream = "silent_after_tokens"
        t0 = time.monotonic()
        _, done = reply(backend)
        assert time.monotonic() - t0 < 1.5
        assert done.metrics.stop_reason == TIME_LIMIT and done.text == "hi " * 5
        assert any("sent nothing for 0 s" in n for n in done.metrics.notes)
        # Silent before any text: nothing to keep, so the reply fails, with a reason.
        for silent in ("silent_headers", "silent_before_headers", "trickle"):
            server.plan.stream = silent
            t0 = time.monotonic()
            with pytest.raises(ServerUnreachable, match="sent nothing"):
                list(backend.generate(HI, SamplingParams(max_tokens=8)))
            assert time.monotonic() - t0 < 1.5


# -- 4: /health that is not llama-server's -----------------------------------------------


@pytest.mark.parametrize("health", ["no_ok", "empty", "html"])
def test_a_health_that_is_not_llama_servers_fails_at_once(health: str) -> None:
    with MisbehavingServer() as server:
        server.plan.health = health
        backend = make("llama-server", server.url, Limits())  # the real 600 s wait
        t0 = time.monotonic()
        with pytest.raises(ModelLoadError, match="answers /health but not as llama-server"):
            backend.load("", LoadConfig(), lambda _: time.monotonic() - t0 < 5)
        assert time.monotonic() - t0 < 2


def test_a_server_loading_for_ever_is_given_up_on() -> None:
    with MisbehavingServer() as server:
        server.plan.health = "loading"
        backend = make("llama-server", server.url)
        t0 = time.monotonic()
        with pytest.raises(ModelLoadError, match="still loading its model after 1 s"):
            backend.load("", LoadConfig())
        assert time.monotonic() - t0 < 2


# -- 5: only our errors ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "part", "value"),
    [
        ("llama-server", "props", "gzip_lie"),
        ("llama-server", "health", "gzip_lie"),
        ("llama-server", "props", "odd_settings"),
        ("llama-server", "props", "odd_fields"),
        ("llama-server", "props", "missing"),
        ("llama-server", "props", "deep"),
        ("openai", "models", "gzip_lie"),
    ],
)
def test_a_damaged_answer_at_connect_is_a_load_error(kind: str, part: str, value: str) -> None:
    with MisbehavingServer() as server:
        setattr(server.plan, part, value)
        server.plan.props_value = [{"n_ctx": 4096}]
        with pytest.raises(ModelLoadError, match="Could not connect to hostile server"):
            make(kind, server.url).load("", LoadConfig())


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("stream", "message"),
    [
        ("gzip_lie", "cannot be decoded"),
        ("wrong_type", "not an event stream"),
        ("status_500", "answered 500"),
        ("redirect", "a redirect to /login"),
        ("bad_sse", "damaged event stream"),
    ],
)
def test_a_damaged_stream_is_our_error(kind: str, stream: str, message: str) -> None:
    with MisbehavingServer() as server, connected(kind, server) as backend:
        server.plan.stream = stream
        with pytest.raises(DecodeError, match=message):
            list(backend.generate(HI, SamplingParams(max_tokens=8)))


@pytest.mark.parametrize("kind", KINDS)
def test_an_error_after_text_keeps_the_text(kind: str) -> None:
    with MisbehavingServer() as server, connected(kind, server) as backend:
        for stream, words in (("error_event", "out of memory"), ("malformed_json", "JSON")):
            server.plan.stream = stream
            _, done = reply(backend)
            assert done.text == "hi " * 5 and done.metrics.stop_reason == SERVER_ERROR
            assert any(words in n and "text so far is kept" in n for n in done.metrics.notes)


def test_a_token_list_too_long_to_send_is_a_context_overflow() -> None:
    """llama-server's token list for a 25 MB message is over the 16 MB an answer may be
    (it took a real one 30 s to tokenize): said as the context being too small, as any
    prompt that does not fit, not as "more than 16 MB for one answer"; the next reply is
    as before. (A bound before tokenizing needs the vocabulary, which the server keeps.)"""
    with MisbehavingServer() as server, connected("llama-server", server, BIG_CALLS) as backend:
        long = [ChatMessage("user", "x" * 3_500_000)]  # "120, " a token: 17.5 MB
        with pytest.raises(ServerOverflowError) as refused:
            list(backend.generate(long, SamplingParams(max_tokens=8)))
        message = str(refused.value)
        assert f"needs more than {N_CTX} tokens but the context holds {N_CTX}" in message
        assert "start the server with a larger context" in message
        reply(backend)


def test_a_changed_props_at_restore_is_refused_with_a_reason() -> None:
    with MisbehavingServer() as server, connected("llama-server", server) as backend:
        reply(backend)
        kv = backend.export_state("chat")
        server.plan.props, server.plan.props_value = "odd_settings", "n_ctx"
        with pytest.raises(LamplightError, match="context size changed"):
            backend.import_state(kv)
        with pytest.raises(LamplightError, match="not a llama-server slot snapshot"):
            backend.import_state(KvState(b"[" * 5000, [1, 2], "ab", []))
        bad_name = b'{"format": "lamplight-llama-server-slot", "file": "../x", "n_saved": 1}'
        with pytest.raises(LamplightError, match="not a llama-server slot snapshot"):
            backend.import_state(KvState(bad_name, [1, 2], "ab", []))


# -- 6: stop --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("silent", ["silent_headers", "silent_before_headers", "trickle"])
def test_stop_on_a_silent_server_is_prompt(kind: str, silent: str) -> None:
    """The default limits (600 s of silence allowed): only the stop ends these."""
    with MisbehavingServer() as server, connected(kind, server, Limits()) as backend:
        server.plan.stream = silent
        stop = threading.Event()
        stopped_at: list[float] = []

        def press_stop() -> None:
            stopped_at.append(time.monotonic())
            stop.set()

        timer = threading.Timer(0.3, press_stop)
        timer.start()
        try:
            _, done = reply(backend, stop=stop)
            ended = time.monotonic()
        finally:
            timer.cancel()
            timer.join()
    assert done.metrics.stop_reason == "cancelled"
    assert ended - stopped_at[0] < 1.0


# -- 7: slot files ----------------------------------------------------------------------------


def test_slot_files_are_a_bounded_ring() -> None:
    with MisbehavingServer() as server, connected("llama-server", server) as backend:
        reply(backend)
        names = [json_ref(backend.export_state(f"chat-{i}"))["file"] for i in range(SLOT_FILES * 3)]
        assert len(set(names)) == SLOT_FILES
        assert len(server.plan.slot_files) == SLOT_FILES
        # A conversation keeps its file while it is among the most recently saved.
        recent = names[-SLOT_FILES:]
        again = [
            json_ref(backend.export_state(f"chat-{i}"))["file"]
            for i in range(SLOT_FILES * 2, SLOT_FILES * 3)
        ]
        assert again == recent
        # A restored file goes on being the conversation's own.
        kv = backend.export_state("chat-40")
        backend.import_state(kv)
        assert json_ref(backend.export_state("chat-40"))["file"] == json_ref(kv)["file"]
        # The RAM pool's stashes (key "") share a file of their own.
        pool = json_ref(backend.export_state(""))["file"]
        assert pool.endswith("-pool.bin") and pool not in names


def json_ref(kv: KvState) -> dict[str, Any]:
    import json

    ref = json.loads(bytes(kv.state))
    assert isinstance(ref, dict)
    return ref


# -- 8: the invariant, with Hypothesis choosing how the server misbehaves -------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)
PLANS = st.fixed_dictionaries(
    {
        "stream": st.sampled_from(STREAMS),
        "health": st.sampled_from(HEALTH),
        "props": st.sampled_from(PROPS),
        "models": st.sampled_from(["ok", "ok", "gzip_lie"]),
        "tokens": st.integers(0, 30),
        "piece": st.text(min_size=1, max_size=6),
        "piece_bytes": st.sampled_from([1_000, 100_000, 900_000]),
        "delay": st.sampled_from([0.01, 0.05]),
        "props_value": JSON_VALUES,
    }
)


def test_every_reply_ends_once_in_time_with_only_our_errors() -> None:
    """Any misbehaviour, either backend, a stop at any time or none: load ends in time
    with a model or a ``ModelLoadError``; a reply ends in time with one ``Finished``
    (its text under the cap, equal to its tokens) or one of our errors."""
    limits = SMALL
    with MisbehavingServer() as server:

        @settings(
            max_examples=examples(40),
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        )
        @given(
            kind=st.sampled_from(KINDS),
            plan=PLANS,
            max_tokens=st.integers(1, 40),
            stop_after=st.none() | st.floats(0.0, 0.6),
        )
        def check(
            kind: str, plan: dict[str, Any], max_tokens: int, stop_after: float | None
        ) -> None:
            for name, value in plan.items():
                setattr(server.plan, name, value)
            backend = make(kind, server.url, limits)
            t0 = time.monotonic()
            try:
                backend.load("", LoadConfig())
            except ModelLoadError:
                assert time.monotonic() - t0 < limits.ready_s + 2 * limits.call_s + 1
                return
            try:
                server.plan.health, server.plan.props = "ok", "ok"  # later calls may differ
                check_reply(backend, max_tokens, stop_after, limits)
            finally:
                backend.unload()

        check()


def check_reply(
    backend: Backend, max_tokens: int, stop_after: float | None, limits: Limits
) -> None:
    stop = threading.Event()
    stopped_at: list[float] = []

    def press_stop() -> None:
        stopped_at.append(time.monotonic())
        stop.set()

    timer = threading.Timer(stop_after or 0.0, press_stop)
    if stop_after is not None:
        timer.start()
    t0 = time.monotonic()
    events: list[EngineEvent] = []
    error: LamplightError | None = None
    try:
        for event in backend.generate(HI, SamplingParams(max_tokens=max_tokens), stop):
            events.append(event)
    except LamplightError as exc:  # any other type fails the test
        error = exc
    finally:
        ended = time.monotonic()
        timer.cancel()
        if stop_after is not None:
            timer.join()
    bound = limits.start_s + limits.per_token_s * max_tokens + limits.silence_s + 1.0
    assert ended - t0 < bound, (ended - t0, events[-2:], error)
    if stopped_at and stopped_at[0] < ended:
        assert ended - stopped_at[0] < 1.0
    finished = [e for e in events if isinstance(e, Finished)]
    if error is not None:
        assert not finished and str(error)
        return
    assert len(finished) == 1 and events[-1] is finished[0]
    done = finished[0]
    assert done.text == "".join(e.text for e in events if isinstance(e, Token))
    assert len(done.text.encode()) <= reply_byte_cap(max_tokens)
    assert done.metrics.stop_reason in STOP_REASONS
    assert done.metrics.generated_tokens <= max_tokens + TOKEN_SLACK + 1


# -- a real llama-server: normal replies are unaffected --------------------------------------
def test_real_server_replies_and_two_chats_resume(llama_server: RunningServer) -> None:
    """Plain replies from a real llama-server end as before (no limit notes), and with the
    ring of slot files two saved chats both resume without re-reading."""
    for kind in KINDS:
        backend = make(kind, llama_server.url, Limits())
        backend.load("", LoadConfig())
        try:
            params = SamplingParams(temperature=0.0, seed=1, max_tokens=6)
            events = list(backend.generate(HI, params))
            done = events[-1]
            assert isinstance(done, Finished) and done.text.strip()
            assert done.metrics.stop_reason in ("eos", "max_tokens")
            assert not any("incomplete" in n for n in done.metrics.notes)
            assert done.text == "".join(e.text for e in events if isinstance(e, Token))
        finally:
            backend.unload()
    backend = make("llama-server", llama_server.url, Limits())
    backend.load("", LoadConfig())
    try:
        chats: dict[str, tuple[list[ChatMessage], KvState]] = {}
        for key, ask in (("a", "Name a colour."), ("b", "Name a fruit, please, just one.")):
            backend.reset()
            messages = [ChatMessage("user", ask)]
            first = list(backend.generate(messages, SamplingParams.greedy(6)))[-1]
            assert isinstance(first, Finished)
            messages.append(ChatMessage("assistant", first.text))
            chats[key] = (messages, backend.export_state(key))
        assert json_ref(chats["a"][1])["file"] != json_ref(chats["b"][1])["file"]
        for key in ("a", "b"):
            messages, kv = chats[key]
            backend.reset()
            backend.import_state(kv)
            more = [*messages, ChatMessage("user", "Another.")]
            end = list(backend.generate(more, SamplingParams.greedy(2)))[-1]
            assert isinstance(end, Finished)
            assert end.metrics.cached_tokens >= len(kv.tokens) - 2, key
    finally:
        backend.unload()


def test_real_server_refuses_a_25_mb_message_as_too_long(llama_server: RunningServer) -> None:
    """llama-server tokenizes 25 MB (20-30 s here) into a token list over 16 MB: the refusal
    says the context is too small; the next reply is as before."""
    backend = make("llama-server", llama_server.url, Limits(call_s=180.0))
    backend.load("", LoadConfig())
    try:
        with pytest.raises(ServerOverflowError, match="needs more than 2048 tokens"):
            list(backend.generate([ChatMessage("user", "word " * 5_000_000)], SamplingParams()))
        done = list(backend.generate(HI, SamplingParams.greedy(4)))[-1]
        assert isinstance(done, Finished) and done.metrics.generated_tokens == 4
    finally:
        backend.unload()
