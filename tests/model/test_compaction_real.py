"""Compaction you can undo, on the real engine (issue 45).

A chat that fills a 1,024-token context is compacted: the summary is written on a fork
of the cache, the compacted chat is read once, and the next ten turns each read only
their own new tokens. Undo brings back the exact cache from before the compaction (the
same tokens, the same next greedy reply) without reading anything again. A summary
stopped midway changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from app.chat import compaction
from app.chat.conversation import Conversation, Message
from app.chat.session import ChatSession
from app.chat.store import ConversationStore, undo_id
from app.config.setting_records import LoadConfig, SamplingParams
from app.engine.backend import Backend, Finished, Token
from app.engine.chat_message import ChatMessage
from app.engine.local.engine import Engine
from app.engine.metrics import MessageMetrics
from app.engine.tool_spec import NONE, ToolRequest
from app.host import compaction_steps
from app.host.core import gui_key
from app.host.host import EngineHost
from app.host.jobs import ReplyEvent, ReplyFailed, ReplyJob
from app.host.listener import QuietListener

CTX = 1024
GREEDY = SamplingParams.greedy(8)  # short replies: the chat grows by its (long) questions
TOPICS = ["tides", "berths", "lighthouses", "fishing boats", "harbour walls", "ferries"]


class View:
    def __init__(self) -> None:
        self.notices: list[str] = []

    def show_conversation(self, conv: Conversation, opened: bool, restoring: bool) -> None: ...
    def reply_begun(self, shown: Sequence[Message], added_user: bool) -> None: ...
    def reply_ended(self, text: str, metrics: MessageMetrics | None, error: str) -> None: ...
    def tool_calls_changed(self, message: Message) -> None: ...
    def open_failed(self, message: str) -> None: ...
    def notice(self, text: str) -> None:
        self.notices.append(text)

    def row_saved(self, conv_id: str) -> None: ...
    def row_removed(self, conv_id: str) -> None: ...


class SyncLink:
    """The session's engine link, each job run on the calling thread through the host
    (``run_here``), its terminal event handed to the session as the window does."""

    def __init__(self, host: EngineHost) -> None:
        self.host = host
        self.session: ChatSession | None = None
        self.n = 0
        self.jobs: list[ReplyJob] = []
        self.ended: dict[int, Finished] = {}
        self.stop_after: int | None = None  # tokens after which the next job is stopped
        self.settled: list[int] = []
        self.undone = False
        self.offer: ToolRequest | None = None  # tools described to every reply (none callable)
        self.settled_tools: list[ToolRequest | None] = []
        self._later: Callable[[], None] | None = None

    def generate(
        self,
        conv_id: str,
        messages: Sequence[ChatMessage],
        params: SamplingParams,
        tools: ToolRequest | None = None,
        prefix: str = "",
        compaction: str = "",
    ) -> int:
        self.n += 1
        request = self.n
        events: list[ReplyEvent] = []
        limit, self.stop_after = self.stop_after, None
        jobs: list[ReplyJob] = []

        def sink(event: ReplyEvent) -> None:
            events.append(event)
            if limit is not None and sum(isinstance(e, Token) for e in events) >= limit:
                jobs[0].stop.set()  # Stop pressed while it writes

        job = ReplyJob(
            f"gui-{request}",
            "gui",
            list(messages),
            params,
            sink,
            conv_id=conv_id,
            next_turn=bool(conv_id) and not compaction,
            compaction=compaction,
            tools=tools if tools is not None else self.offer,
        )
        jobs.append(job)
        self.jobs.append(job)
        self.host.run_here(job)
        self._later = partial(self._end, request, events[-1])
        return request

    def _end(self, request: int, end: ReplyEvent) -> None:
        """The terminal event reaches the session (after the id was returned, as the
        window's queued signals do)."""
        session = self.session
        assert session is not None
        if isinstance(end, ReplyFailed):
            session.on_failed(request, str(end.error))
            return
        assert isinstance(end, Finished)
        self.ended[request] = end
        if end.metrics.stop_reason == "cancelled":
            session.on_cancelled(request, end.text, end.metrics)
        else:
            session.on_finished(request, end.text, end.metrics)

    def deliver(self) -> None:
        later, self._later = self._later, None
        if later is not None:
            later()

    def stop(self) -> None: ...
    def reset(self) -> None:
        self.host._core.reset()

    def restore_snapshot(self, conv_id: str) -> None:
        self.host._core.restore_snapshot(conv_id)

    def drop_snapshot(self, conv_id: str) -> None:
        self.host._core.drop_snapshot(conv_id)

    def settle(
        self,
        conv_id: str,
        messages: list[ChatMessage],
        params: SamplingParams,
        tools: ToolRequest | None = None,
    ) -> None:
        self.settled_tools.append(tools)
        core = self.host._core
        self.settled.append(compaction_steps.settle(core, conv_id, messages, params, tools))

    def restore_undo(self, conv_id: str, summary_id: str) -> None:
        self.undone = compaction_steps.restore_undo(self.host._core, conv_id, summary_id)


@pytest.fixture(scope="module")
def small_engine(model_path: Path) -> Iterator[Engine]:
    from tests.conftest import TEST_LOAD

    engine = Engine()
    engine.load(model_path, LoadConfig(**{**TEST_LOAD.__dict__, "n_ctx": CTX}))
    yield engine
    engine.unload()


@pytest.fixture()
def rig(small_engine: Engine, tmp_path: Path) -> Iterator[tuple[ChatSession, SyncLink, View]]:
    small_engine.reset()
    yield session_on(small_engine, tmp_path)


def session_on(
    backend: Backend, tmp_path: Path, system: str = "You answer about the harbour."
) -> tuple[ChatSession, SyncLink, View]:
    """A chat session on ``backend`` through a host on ``tmp_path``, its jobs run in
    place (``SyncLink``)."""
    store = ConversationStore(tmp_path / "data")
    host = EngineHost(backend, tmp_path / "models", store, QuietListener())
    link, view = SyncLink(host), View()
    session = ChatSession(store, link, view, system_prompt=system)
    session.model = backend.model
    link.session = session
    return session, link, view


def say(session: ChatSession, link: SyncLink, text: str) -> Finished:
    assert session.send(text, GREEDY), text
    link.deliver()
    return link.ended[link.n]


def fill(session: ChatSession, link: SyncLink) -> None:
    """Turns until the chat holds more than 60% of the context (long questions, read
    fast; short replies)."""
    for i in range(40):
        topic = TOPICS[i % len(TOPICS)]
        facts = " ".join(f"Port {i}.{k} has {topic} and a {k}-metre berth." for k in range(4))
        say(session, link, f"{facts} Tell me one short fact about the {topic} of port {i}.")
        if session.conversation.n_tokens > CTX * 0.6:
            return
    raise AssertionError("the chat never filled the context")


def cache(link: SyncLink) -> list[int]:
    return list(link.host._core.engine.cached_tokens)  # type: ignore[attr-defined]


def test_a_full_chat_compacts_goes_on_and_undoes_without_reading(
    rig: tuple[ChatSession, SyncLink, View],
) -> None:
    session, link, _view = rig
    fill(session, link)
    conv = session.conversation
    before_ids = [m.id for m in conv.messages]
    before_cache = cache(link)
    found = compaction.plan(conv)
    assert found is not None and found.freed > 0
    assert session.compact(GREEDY) == ""
    summary_job = link.jobs[-1]
    link.deliver()
    summary_end = link.ended[link.n]
    # The summary read only its instruction: the chat was in the cache.
    instruction = summary_job.messages[-1].content
    asked = link.host._core.engine.count_tokens(instruction)
    assert summary_end.metrics.evaluated_tokens <= asked + 8, (summary_end.metrics, asked)
    assert summary_job.compaction and cache(link) != before_cache, (_view.notices, link.settled)
    store = session.store
    assert store.snapshot_path(undo_id(conv.id, summary_job.compaction)).exists()
    summary = conv.active_summary()
    assert summary is not None and summary.id == summary_job.compaction
    assert [m.summarised for m in conv.messages].count(True) == found.summarised
    assert link.settled and link.settled[0] > 0  # the one-time cost: summary + kept turns
    assert len(cache(link)) < len(before_cache)
    # Ten more turns, each reading only its own new tokens.
    for i in range(10):
        text = f"And the {TOPICS[i % len(TOPICS)]} of pier {i}?"
        done = say(session, link, text)
        new = link.host._core.engine.count_tokens(text)
        assert done.metrics.evaluated_tokens <= 1.1 * new + 8, (i, done.metrics, new)
        assert "dropped" not in " ".join(done.metrics.notes)
    # Undo: the chat and its cache as they were before the compaction.
    assert session.can_undo_compaction()
    assert session.undo_compaction()
    assert [m.id for m in conv.messages][: len(before_ids)] == before_ids
    assert link.undone and cache(link) == before_cache
    assert conv.active_summary() is None
    assert not store.snapshot_path(undo_id(conv.id, summary_job.compaction)).exists()


def test_the_next_reply_after_undo_is_the_one_before_compaction(
    rig: tuple[ChatSession, SyncLink, View], small_engine: Engine
) -> None:
    session, link, _view = rig
    fill(session, link)
    conv = session.conversation
    question = "Which port did we talk about first?"
    expected_cache = cache(link)
    # The reply the chat would give now, on a copy of its cache (put back after).
    fork = small_engine.export_state()
    events: list[Any] = []
    asked = [*conv.chat(), ChatMessage("user", question)]
    job = ReplyJob("fork", "gui", asked, GREEDY, events.append, next_turn=False)
    link.host.run_here(job)
    expected = events[-1]
    assert isinstance(expected, Finished)
    small_engine.import_state(fork)
    link.host._core.pool.set_live(gui_key(conv.id))
    assert session.compact(GREEDY) == ""
    link.deliver()
    assert session.undo_compaction()
    assert cache(link) == expected_cache
    after_undo = say(session, link, question)
    assert after_undo.metrics.evaluated_tokens <= 1.1 * small_engine.count_tokens(question) + 8
    assert after_undo.text == expected.text


def test_a_summary_stopped_midway_changes_nothing(
    rig: tuple[ChatSession, SyncLink, View],
) -> None:
    session, link, view = rig
    fill(session, link)
    conv = session.conversation
    ids, held = [m.id for m in conv.messages], cache(link)
    link.stop_after = 3
    assert session.compact(GREEDY) == ""
    link.deliver()
    assert view.notices[-1] == "Compaction stopped: nothing changed."
    assert [m.id for m in conv.messages] == ids and conv.active_summary() is None
    assert cache(link) == held and not session.busy
    assert not list(session.store.snapshots_dir.glob(f"{conv.id}u*"))


@pytest.mark.parametrize("arch", ["lfm2", "qwen35", "mamba2"])
def test_a_hybrid_chat_compacts_and_undoes_with_its_checkpoints(arch: str, tmp_path: Path) -> None:
    """On recurrent and hybrid models the fork is a state copy and the compacted chat
    ends on a checkpoint: the next turn reads only itself, Undo brings the very state
    back, checkpoints with it."""
    from tests.arch_models import arch_model_path
    from tests.model.test_hybrid_interleavings import PLAIN

    tiny = Engine()
    tiny.load(arch_model_path(arch), LoadConfig(n_ctx=1024, n_threads=1))
    tiny.set_template(PLAIN)
    try:
        session, link, _view = session_on(tiny, tmp_path, "Rules of the harbour.")
        for i in range(4):
            say(session, link, f"Fact {i} about the harbour, please.")
        before = cache(link)
        fork_checkpoints = tiny.export_state().checkpoints
        assert session.compact(GREEDY) == ""
        link.deliver()
        assert session.conversation.active_summary() is not None
        assert tiny.export_state().checkpoints  # the compacted chat ends on one
        held = len(cache(link))  # the compacted chat and the next turn's opening
        done = say(session, link, "And the tides?")
        assert done.metrics.cached_tokens == held  # nothing read again: only the new turn
        assert session.undo_compaction() and link.undone
        assert cache(link) == before
        assert tiny.export_state().checkpoints == fork_checkpoints
    finally:
        tiny.unload()


def test_a_chat_offered_tools_compacts_reading_only_the_instruction(
    rig: tuple[ChatSession, SyncLink, View],
) -> None:
    """The tools are described in the prompt (the cache holds them): the summary and
    the compacted chat are rendered with them, none callable, so the summary reads only
    its instruction and the turns after it only their own tokens."""
    from tests.tool_templates import TIME, WEATHER

    session, link, _view = rig
    link.offer = ToolRequest((WEATHER, TIME), NONE)
    session._compact._tools = lambda _conv_id: link.offer  # as ``ToolRounds.described``
    for i in range(4):
        say(session, link, f"Port {i} has a {i}-metre berth. Which port is that?")
    assert session.compact(GREEDY) == ""
    summary_job = link.jobs[-1]
    link.deliver()
    assert summary_job.tools == link.offer
    asked = link.host._core.engine.count_tokens(summary_job.messages[-1].content)
    assert link.ended[link.n].metrics.evaluated_tokens <= asked + 8
    assert link.settled_tools == [link.offer] and link.settled[0] > 0
    for i in range(3):
        text = f"And the ferries of pier {i}?"
        done = say(session, link, text)
        new = link.host._core.engine.count_tokens(text)
        assert done.metrics.evaluated_tokens <= 1.1 * new + 8, (i, done.metrics, new)
