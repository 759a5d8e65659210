"""Whose cache a request reuses when the model is on a server (issue 40 item 11).

The window's chat and each API key are parties (``KvPool``); on a llama-server a
request never reuses, nor is shown as cached, another party's tokens: ``reset`` erases
the slot, a request that would discard most of the slot reuses none of it (the server's
RAM prompt cache would restore whichever saved prompt matches best), the cached count
is capped at this client's own tokens, and a party's stash has its own slot file. An
OpenAI-compatible server's cache is out of reach: its cached count is shown only for
the party's own last request. The window's chat still resumes from its saved file.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pytestqt.qtbot import QtBot

from app.api.host_gateway import HostGateway
from app.config.setting_records import LoadConfig, SamplingParams
from app.engine.backend import Backend, Finished, ModelInfo
from app.engine.chat_message import ChatMessage
from app.engine.context_map import common_prefix
from app.engine.metrics import MessageMetrics
from app.host.kv_pool import GUI, STASH
from app.remote.connection import Connection
from app.remote.llama_server.backend import LlamaServerBackend
from app.remote.llama_server.slot import Slot
from app.remote.openai.backend import OpenAIBackend
from app.remote.openai.reply import OwnPrefix
from app.remote.server_link import ServerLink
from app.util.errors import LamplightError
from tests.hypothesis_budget import examples
from tests.model.test_worker_api import SYSTEM, WAIT_MS, Recorder, make_job, run
from tests.server_fixture import RunningServer
from ui.engine.worker import EngineClient

GREEDY = SamplingParams.greedy(6)
CHAT = [ChatMessage("user", SYSTEM * 2 + "Which light is the oldest?")]


def user(text: str) -> ChatMessage:
    return ChatMessage("user", text)


def assistant(text: str) -> ChatMessage:
    return ChatMessage("assistant", text)


# -- llama-server's choice of a saved prompt, modelled on its source -------------------


def server_restores(
    slot: Sequence[int], prompt: Sequence[int], saved: Sequence[Sequence[int]]
) -> bool:
    """Whether llama-server (the vendored build, default ``--slot-prompt-similarity``
    0.1) restores one of the ``saved`` prompts of its RAM cache into the slot a request
    for ``prompt`` names: ``get_available_slot`` (server-context.cpp) decides to update
    the cache, ``server_prompt_cache::load`` (server-task.cpp) takes a better prompt."""
    if not slot:
        return False  # f_keep is 0/0: no update
    lcp = common_prefix(slot, prompt)
    f_sim = lcp / len(prompt)
    if (f_sim if f_sim > 0.1 else 0.0) * len(prompt) / len(slot) >= 0.5:
        return False
    keep_best, sim_best = lcp / len(slot), f_sim
    for entry in saved:
        n = common_prefix(entry, prompt)
        better = keep_best < n / len(entry) and sim_best < n / len(prompt)
        if n / len(entry) >= 0.25 and better:
            return True
    return False


def slot_holding(tokens: list[int]) -> Slot:
    """The slot of a backend that believes it holds ``tokens``."""
    slot = Slot(ServerLink(Connection("c", "c", "llama-server", "http://127.0.0.1:9")))
    slot.map.tokens = list(tokens)
    return slot


TOKENS = st.lists(st.integers(0, 2), min_size=1, max_size=12)


@settings(max_examples=examples(300), deadline=None)
@given(TOKENS, TOKENS, st.lists(TOKENS, max_size=3))
def test_a_request_that_reuses_the_slot_is_never_given_a_saved_prompt(
    held: list[int], prompt: list[int], saved: list[list[int]]
) -> None:
    """Whenever a request goes with ``cache_prompt``, the server keeps the slot as it is
    (the slot holds all the client tracks but the last sampled token, or all of it)."""
    own = slot_holding(held).reuses(prompt)
    assert own in (0, common_prefix(held, prompt))
    if own:
        assert not server_restores(held, prompt, saved)
        assert not server_restores(held[:-1], prompt, saved)


def test_what_a_request_reuses() -> None:
    chat = list(range(100))
    assert slot_holding(chat).reuses([*chat, 7, 7]) == 100  # a follow-up
    assert slot_holding(chat).reuses(chat[:40]) == 40  # the same request again
    assert slot_holding(chat).reuses([*chat[:40], 5]) == 0  # most of the slot discarded
    assert slot_holding(chat[:10]).reuses([*chat[:10], *[5] * 30]) == 0  # mostly new
    assert slot_holding([]).reuses(chat) == 0


@settings(max_examples=examples(200), deadline=None)
@given(
    st.one_of(st.integers(-5, 2**40), st.text(max_size=3), st.none()),
    st.one_of(st.integers(-5, 2**40), st.none()),
    st.integers(0, 5000),
)
def test_the_cached_count_is_never_more_than_the_clients_own(
    cache_n: Any, prompt_n: Any, own: int
) -> None:
    slot = slot_holding([])
    metrics = MessageMetrics()
    slot.timings({"timings": {"cache_n": cache_n, "prompt_n": prompt_n}}, metrics, True, own)
    assert 0 <= metrics.cached_tokens <= own
    assert metrics.evaluated_tokens >= 0
    sane = isinstance(cache_n, int) and 0 <= cache_n < 2**31
    if sane and prompt_n is not None and 0 <= prompt_n < 2**31:
        # Nothing lost: what is not shown as cached is counted as evaluated.
        assert metrics.cached_tokens + metrics.evaluated_tokens == cache_n + prompt_n


MESSAGES = st.lists(
    st.builds(ChatMessage, st.sampled_from(["user", "assistant"]), st.sampled_from("ab")),
    max_size=4,
)


@settings(max_examples=examples(200), deadline=None)
@given(MESSAGES, st.sampled_from("ab"), MESSAGES, st.integers(0, 10**6))
def test_an_openai_servers_count_is_shown_only_for_the_clients_own_request(
    asked: list[ChatMessage], reply: str, messages: list[ChatMessage], count: int
) -> None:
    own = OwnPrefix()
    assert own.cached(messages, count) == 0  # nothing of its own yet (after a reset)
    own.request, own.reply, own.prompt_tokens, own.generated = (
        tuple(asked),
        assistant(reply),
        30,
        5,
    )
    shown = own.cached(messages, count)
    assert 0 <= shown <= min(count, 35)
    if messages[: len(asked)] != asked:
        assert shown == 0  # another conversation: the server's count says nothing here


# -- a real llama-server, the window and API clients through the engine thread ----------


def connect(qtbot: QtBot, client: EngineClient, backend: Backend) -> ModelInfo:
    gateway = HostGateway(client.host)
    client.connect_remote(backend)
    qtbot.waitUntil(lambda: gateway.model() is not None, timeout=WAIT_MS)
    info = gateway.model()
    assert info is not None
    return info


@pytest.fixture()
def client(qtbot: QtBot, tmp_path: Path) -> Iterator[EngineClient]:
    client = EngineClient(tmp_path / "models")
    try:
        yield client
    finally:
        assert client.shutdown()


def window_turn(
    qtbot: QtBot, client: EngineClient, rec: Recorder, conv: str, chat: list[ChatMessage]
) -> tuple[str, MessageMetrics]:
    request = client.generate(conv, chat, GREEDY)
    qtbot.waitUntil(lambda: request in rec.ended, timeout=WAIT_MS)
    text, metrics = rec.ended[request]
    assert isinstance(text, str) and isinstance(metrics, MessageMetrics), text
    return text, metrics


def api_turn(
    qtbot: QtBot, client: EngineClient, info: ModelInfo, key: str, chat: list[ChatMessage]
) -> Finished:
    job, sink = make_job(info, "", messages=chat, key=key)
    run(qtbot, client, job, sink)
    return sink.finished()


def server_cached(server: RunningServer) -> int:
    """The slot's ``n_prompt_tokens_cache``: what the server itself reused last."""
    slots = server.get("/slots")
    assert isinstance(slots, list)
    return int(slots[0]["n_prompt_tokens_cache"])


def llama_backend(server: RunningServer) -> LlamaServerBackend:
    return LlamaServerBackend(Connection("owner", "test server", "llama-server", server.url))


def test_an_api_client_never_reuses_the_windows_slot(
    qtbot: QtBot, client: EngineClient, llama_server: RunningServer
) -> None:
    """A client that sends the window's chat word for word finds nothing cached, on the
    server's own count too; its follow-up reuses its own; another key sees nothing of
    it; the window's next turn comes back from its stash file and reads only its words."""
    info = connect(qtbot, client, llama_backend(llama_server))
    rec = Recorder(client)
    reply, g1 = window_turn(qtbot, client, rec, "c1", CHAT)
    guess = [*CHAT, assistant(reply), user("Why?")]

    a1 = api_turn(qtbot, client, info, "key-a", guess)
    m1 = a1.metrics
    assert m1.cached_tokens == 0 and m1.evaluated_tokens == m1.prompt_tokens
    assert server_cached(llama_server) == 0
    more = [*guess, assistant(a1.text), user("And then?")]
    m2 = api_turn(qtbot, client, info, "key-a", more).metrics
    assert m2.cached_tokens >= m1.prompt_tokens and m2.evaluated_tokens <= 16
    mb = api_turn(qtbot, client, info, "key-b", more).metrics
    assert mb.cached_tokens == 0 and server_cached(llama_server) == 0

    _, g2 = window_turn(qtbot, client, rec, "c1", guess)
    client.drain()
    assert g2.cached_tokens >= g1.prompt_tokens + g1.generated_tokens - 1, g2
    assert g2.evaluated_tokens <= 16, g2


def test_the_servers_ram_cache_never_serves_another_partys_chat(
    qtbot: QtBot, client: EngineClient, llama_server: RunningServer
) -> None:
    """llama-server keeps prompts it set aside in RAM (``--cache-ram``, on by default) and
    restores the best match for a request that discards most of its slot: the window's
    chat set aside when the window moved to another one is never what an API client's
    guess gets, whatever the client held in the slot before."""
    info = connect(qtbot, client, llama_backend(llama_server))
    rec = Recorder(client)
    reply, _ = window_turn(qtbot, client, rec, "c1", CHAT)
    window_turn(qtbot, client, rec, "c2", [user("Tell me about bread.")])  # c1 set aside
    api_turn(qtbot, client, info, "key-a", [user("Hi")])
    guess = api_turn(qtbot, client, info, "key-a", [*CHAT, assistant(reply), user("Why?")])
    assert guess.metrics.cached_tokens == 0
    assert guess.metrics.evaluated_tokens == guess.metrics.prompt_tokens
    assert server_cached(llama_server) == 0


def test_a_stash_saved_over_is_refused(llama_server: RunningServer) -> None:
    """A party's stashes share its file: an older one's reference is refused even when
    the later save holds as many tokens, and each party's file is its own."""
    backend = llama_backend(llama_server)
    backend.load("", LoadConfig())
    try:
        params = SamplingParams.greedy(4)
        list(backend.generate([user("Say A.")], params))
        older = backend.export_state(STASH + GUI)
        list(backend.generate([user("Say B.")], params))
        later = backend.export_state(STASH + GUI)
        assert len(later.tokens) == len(older.tokens)  # the count alone cannot tell
        other = backend.export_state(STASH + "api:other")
        with pytest.raises(LamplightError, match="saved over"):
            backend.import_state(older)
        backend.import_state(other)
        backend.import_state(later)
        assert backend._slot.map.tokens == later.tokens
    finally:
        backend.unload()


def test_an_openai_servers_cache_count_stays_with_its_party(
    qtbot: QtBot, client: EngineClient, llama_server: RunningServer
) -> None:
    """Through an OpenAI-compatible API the server's prefix cache is shared and out of
    reach: the count it reports is shown for a party's own follow-up, never for a
    request that repeats another party's chat."""
    backend = OpenAIBackend(Connection("owner-oai", "test /v1", "openai", llama_server.url))
    info = connect(qtbot, client, backend)
    rec = Recorder(client)
    reply, _ = window_turn(qtbot, client, rec, "c1", CHAT)
    guess = [*CHAT, assistant(reply), user("Why?")]
    a1 = api_turn(qtbot, client, info, "key-a", guess)
    m1 = a1.metrics
    assert m1.cached_tokens == 0 and m1.evaluated_tokens == m1.prompt_tokens
    more = [*guess, assistant(a1.text), user("And then?")]
    m2 = api_turn(qtbot, client, info, "key-a", more).metrics
    assert 0 < m2.cached_tokens <= a1.metrics.prompt_tokens + a1.metrics.generated_tokens
