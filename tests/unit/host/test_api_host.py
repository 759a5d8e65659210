"""The engine host without Qt: one queue, one job type, exactly one terminal event per
job whatever happens (a refusal, an engine error, a stop at any point, a sink that
raises), a prompt stop, and a close that runs what was queued and frees the model."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.api.gateway import ApiFailure, ApiJob, failure_for
from app.api.host_gateway import HostGateway
from app.config.setting_records import LoadConfig, SamplingParams
from app.engine.backend import Finished, ModelInfo, Token
from app.engine.chat_message import ChatMessage
from app.host.host import EngineHost
from app.host.jobs import (
    HostClosed,
    ModelGone,
    Origin,
    ReplyEvent,
    ReplyFailed,
    ReplyJob,
    ReplySink,
)
from app.host.listener import QuietListener
from app.util.errors import DecodeError
from tests.fakes.engine import FakeEngine, as_backend
from tests.hypothesis_budget import examples

WAIT_S = 10.0
ORIGINS: list[Origin] = ["gui", "api"]


class Listener(QuietListener):
    def __init__(self) -> None:
        self.loaded = threading.Event()
        self.started: list[str] = []
        self.ended: list[str] = []

    def model_loaded(self, info: ModelInfo) -> None:
        self.loaded.set()

    def job_started(self, job: ReplyJob) -> None:
        self.started.append(job.id)

    def job_ended(self, job: ReplyJob) -> None:
        self.ended.append(job.id)


@dataclass
class Sink:
    events: list[ReplyEvent] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    raises: bool = False

    def __call__(self, event: ReplyEvent) -> None:
        self.events.append(event)
        if isinstance(event, Finished | ReplyFailed):
            self.done.set()
        if self.raises:
            raise RuntimeError("a sink that raises")

    @property
    def terminals(self) -> list[ReplyEvent]:
        return [e for e in self.events if isinstance(e, Finished | ReplyFailed)]


@dataclass
class Hosted:
    host: EngineHost
    fake: FakeEngine
    listener: Listener
    thread: threading.Thread


@pytest.fixture()
def hosted(tmp_path: Path) -> Iterator[Hosted]:
    yield from _hosted(tmp_path)


def _hosted(tmp_path: Path) -> Iterator[Hosted]:
    fake = FakeEngine(reply=" ".join(f"w{i}" for i in range(12)), delay=0.001)
    listener = Listener()
    host = EngineHost(as_backend(fake), tmp_path / "models", None, listener)
    thread = host.start()
    host.load(str(tmp_path / "model.gguf"), LoadConfig(), threading.Event())
    assert listener.loaded.wait(WAIT_S)
    try:
        yield Hosted(host, fake, listener, thread)
    finally:
        host.close()
        thread.join(WAIT_S)
        assert not thread.is_alive()


def job(
    sink: ReplySink,
    n: int,
    origin: Origin = "gui",
    stop: threading.Event | None = None,
    tokens: int = 8,
    model_id: str = "",
) -> ReplyJob:
    return ReplyJob(
        id=f"job-{n}",
        origin=origin,
        messages=[ChatMessage("user", f"question {n}")],
        params=SamplingParams.greedy(tokens),
        sink=sink,
        stop=stop or threading.Event(),
        model_id=model_id,
    )


def test_every_job_ends_once_in_queue_order(hosted: Hosted) -> None:
    sinks = [Sink(raises=i == 1) for i in range(4)]
    for i, sink in enumerate(sinks):
        hosted.host.submit(job(sink, i, ORIGINS[i % 2]))
    assert hosted.host.drain(WAIT_S)
    for sink in sinks:
        assert len(sink.terminals) == 1 and sink.events[-1] is sink.terminals[0]
        assert isinstance(sink.events[-1], Finished)
    assert hosted.listener.started == hosted.listener.ended == [f"job-{i}" for i in range(4)]


def test_a_refused_job_fails_and_the_api_gets_its_status(hosted: Hosted) -> None:
    sink = Sink()
    hosted.host.submit(job(sink, 0, "api", model_id="another-model"))
    assert sink.done.wait(WAIT_S)
    (end,) = sink.events
    assert isinstance(end, ReplyFailed) and isinstance(end.error, ModelGone)
    seen: list[object] = []
    api = ApiJob(
        "chatcmpl-x",
        "chat",
        "another-model",
        [ChatMessage("user", "hi")],
        SamplingParams.greedy(4),
        emit=seen.append,
    )
    HostGateway(hosted.host).join(api, 32)
    assert hosted.host.drain(WAIT_S)
    (failure,) = seen
    assert isinstance(failure, ApiFailure) and (failure.status, failure.code) == (
        404,
        "model_not_found",
    )


def test_stop_is_prompt(hosted: Hosted) -> None:
    hosted.fake.delay = 0.05
    hosted.fake.reply = " ".join(["word"] * 400)
    sink = Sink()
    first = threading.Event()
    stop = threading.Event()

    def on_event(event: ReplyEvent) -> None:
        sink(event)
        if isinstance(event, Token):
            first.set()

    hosted.host.submit(job(Sink(), 0, stop=stop, tokens=400))
    hosted.host.submit(job(on_event, 1, stop=stop, tokens=400))
    stop.set()  # the first job ends at its next token; the second starts already stopped
    assert sink.done.wait(WAIT_S)
    t0 = time.monotonic()
    assert hosted.host.drain(WAIT_S) and time.monotonic() - t0 < 1.0
    (end,) = sink.terminals
    assert isinstance(end, Finished) and end.metrics.stop_reason == "cancelled"


def test_close_runs_what_was_queued_then_frees_the_model(tmp_path: Path) -> None:
    gen = _hosted(tmp_path)
    hosted = next(gen)
    sinks = [Sink() for _ in range(3)]
    for i, sink in enumerate(sinks):
        hosted.host.submit(job(sink, i))
    hosted.host.close()
    late = Sink()
    hosted.host.submit(job(late, 9))  # after close: never run, and told so at once
    hosted.thread.join(WAIT_S)
    assert all(len(s.terminals) == 1 for s in sinks)
    assert len(late.events) == 1 and len(late.terminals) == 1  # its one terminal event
    assert isinstance(late.events[0], ReplyFailed) and "shutting down" in late.events[0].message
    assert hosted.fake.model is None
    with pytest.raises(StopIteration):
        next(gen)


@settings(
    max_examples=examples(25),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    plan=st.lists(
        st.tuples(
            st.sampled_from(ORIGINS),
            st.integers(0, 6),  # stop after this many tokens (6: never)
            st.integers(-1, 5),  # the engine fails after this many words (-1: never)
            st.booleans(),  # the sink raises
        ),
        min_size=1,
        max_size=6,
    )
)
def test_exactly_one_terminal_event_whatever_happens(
    hosted: Hosted, plan: list[tuple[Origin, int, int, bool]]
) -> None:
    sinks: list[Sink] = []
    for n, (origin, stop_after, fail_after, raises) in enumerate(plan):
        stop = threading.Event()
        sink = Sink(raises=raises)

        def arm(fake: FakeEngine = hosted.fake, fail: int = fail_after) -> None:
            # An engine error, or any other exception (a bug)
            error = DecodeError("decode failed") if fail % 2 else RuntimeError("a bug")
            fake.fail_with = error if fail >= 0 else None
            fake.fail_after = max(fail, 0)

        def on_event(
            event: ReplyEvent, s: Sink = sink, e: threading.Event = stop, k: int = stop_after
        ) -> None:
            if isinstance(event, Token) and sum(isinstance(x, Token) for x in s.events) >= k:
                e.set()
            s(event)

        hosted.host.post(arm)
        hosted.host.submit(job(on_event, n, origin, stop, tokens=6))
        sinks.append(sink)
    assert hosted.host.drain(WAIT_S)
    hosted.fake.fail_with = None
    for sink in sinks:
        assert len(sink.terminals) == 1 and sink.events[-1] is sink.terminals[0], sink.events


def test_a_job_after_the_host_closed_is_a_503_to_retry() -> None:
    failure = failure_for(HostClosed())
    assert (failure.status, failure.code, failure.retry) == (503, "server_shutting_down", True)
