"""The API's requests on the host's line (``ApiRequests`` over ``ReplyLine``): FIFO, one
job at a time onto the host's queue, one terminal event per job (fast)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import SimpleNamespace

import pytest

import app.host.line as line_module
from app.api.gateway import ApiEvent, ApiFailure, ApiJob
from app.api.host_gateway import reply_job
from app.api.requests import ApiRequests, QueueFull
from app.config.setting_records import SamplingParams
from app.engine.backend import Finished, ModelInfo, Token
from app.engine.chat_message import ChatMessage
from app.engine.metrics import MessageMetrics
from app.host.jobs import ReplyFailed, ReplyJob
from app.host.line import ReplyLine
from app.util.errors import LamplightError
from tests.fakes.gateway import FakeGateway


class ManualGateway:
    """A line whose hand-overs are recorded; the test sends each job's events itself
    (``send``: through the job's relay, as the engine thread does)."""

    def __init__(self) -> None:
        self.handed: list[ReplyJob] = []
        self.replies: dict[str, ReplyJob] = {}
        self.refuse = False
        self.line = ReplyLine(self.hand)

    @property
    def submitted(self) -> list[str]:
        """The ids of the jobs handed to the host's queue, in order."""
        return [j.id for j in self.handed]

    def model(self) -> ModelInfo | None:
        return None

    def loading(self) -> bool:
        return False

    def join(self, job: ApiJob, limit: int) -> int:
        reply = self.replies[job.id] = reply_job(job)
        return self.line.join(reply, limit)

    def hand(self, job: ReplyJob) -> None:
        if self.refuse:
            raise RuntimeError("worker gone")
        self.handed.append(job)

    def send(self, job: ApiJob, event: ApiEvent | ReplyFailed) -> None:
        assert not isinstance(event, ApiFailure)
        self.replies[job.id].relay.send(event)


BOOM = ReplyFailed(LamplightError("boom"))  # reaches the client as a 500 engine_error


def make_job(n: int, seen: list[tuple[str, ApiEvent]] | None = None) -> ApiJob:
    job = ApiJob(
        id=f"chatcmpl-{n}",
        kind="chat",
        model_id="m",
        messages=[ChatMessage("user", "hi")],
        params=SamplingParams.greedy(4),
        client=f"client-{n}",
    )
    if seen is not None:
        job.emit = lambda event: seen.append((job.id, event))
    return job


def done(stop_reason: str = "eos", tokens: int = 2) -> Finished:
    return Finished(
        "ab",
        MessageMetrics(
            prompt_tokens=9, cached_tokens=4, generated_tokens=tokens, stop_reason=stop_reason
        ),
    )


def test_fifo_one_job_outstanding_and_positions() -> None:
    gw = ManualGateway()
    s = ApiRequests(gw, max_queue=8)
    seen: list[tuple[str, ApiEvent]] = []
    jobs = [make_job(i, seen) for i in range(4)]
    assert [s.enqueue(j) for j in jobs] == [0, 1, 2, 3]
    assert gw.submitted == [jobs[0].id]
    running = s.running()
    assert running is not None and (running.id, running.client, running.tokens) == (
        "chatcmpl-0",
        "client-0",
        0,
    )
    assert [v.id for v in s.queued()] == ["chatcmpl-1", "chatcmpl-2", "chatcmpl-3"]
    for i, job in enumerate(jobs):
        assert gw.submitted == [
            j.id for j in jobs[: i + 1]
        ]  # the next only after the terminal event
        gw.send(job, Token("a"))
        gw.send(job, Token("b"))
        view = s.running()
        assert view is not None and view.tokens == 2
        gw.send(job, done())
    assert s.running() is None and s.queued() == []
    assert [e for _, e in seen if isinstance(e, Finished)] == [done()] * 4
    outcomes = s.recent()
    assert [o.id for o in outcomes] == [j.id for j in jobs]
    assert {(o.finish, o.tokens, o.prompt_tokens, o.cached_tokens) for o in outcomes} == {
        ("stop", 2, 9, 4)
    }


def test_queue_full_counts_the_running_job() -> None:
    gw = ManualGateway()
    s = ApiRequests(gw, max_queue=2)
    a, b, c = make_job(1), make_job(2), make_job(3)
    assert (s.enqueue(a), s.enqueue(b)) == (0, 1)
    with pytest.raises(QueueFull, match="limit is 2"):
        s.enqueue(c)
    assert c.id not in gw.submitted
    gw.send(a, done())
    assert s.enqueue(c) == 1


def test_a_job_cancelled_while_queued_never_reaches_the_gateway() -> None:
    gw = ManualGateway()
    s = ApiRequests(gw)
    seen: list[tuple[str, ApiEvent]] = []
    a, b, c, d = (make_job(i, seen) for i in range(4))
    for j in (a, b, c, d):
        s.enqueue(j)
    s.abandon(b)  # the client went away while waiting
    assert b.stop.is_set() and seen == [
        (b.id, Finished("", MessageMetrics(stop_reason="cancelled")))
    ]
    c.stop.set()  # stopped without abandon: skipped when its turn comes
    gw.send(a, done())
    assert gw.submitted == [a.id, d.id]
    assert [(i, type(e).__name__) for i, e in seen] == [
        (b.id, "Finished"),
        (a.id, "Finished"),
        (c.id, "Finished"),
    ]
    assert [o.finish for o in s.recent()] == ["cancelled", "stop", "cancelled"]
    s.abandon(d)  # the running one: stopped; it ends with the worker's terminal event
    assert d.stop.is_set() and s.running() is not None
    gw.send(d, done("cancelled"))
    assert s.recent()[-1].finish == "cancelled" and s.running() is None
    s.abandon(make_job(9))  # unknown: harmless


def test_one_terminal_event_per_job() -> None:
    gw = ManualGateway()
    s = ApiRequests(gw)
    seen: list[tuple[str, ApiEvent]] = []
    a, b = make_job(1, seen), make_job(2, seen)
    s.enqueue(a)
    s.enqueue(b)
    gw.send(a, Token("x"))
    gw.send(a, BOOM)
    gw.send(a, done())  # a second terminal: dropped
    gw.send(a, Token("late"))  # after the end: dropped
    assert [e for i, e in seen if i == a.id] == [
        Token("x"),
        ApiFailure(500, "server_error", "engine_error", "boom"),
    ]
    assert gw.submitted == [a.id, b.id]  # the failure moved the queue on, once
    assert s.recent()[0].finish == "error" and s.recent()[0].tokens == 1


def test_stop_running_and_cancel_all() -> None:
    gw = ManualGateway()
    s = ApiRequests(gw)
    assert s.stop_running() is False
    seen: list[tuple[str, ApiEvent]] = []
    a, b, c = (make_job(i, seen) for i in range(3))
    for j in (a, b, c):
        s.enqueue(j)
    assert s.stop_running() is True and a.stop.is_set() and not b.stop.is_set()
    s.cancel_all()
    assert all(j.stop.is_set() for j in (a, b, c))
    # Who stopped each: the server tells a client whose reply was cut short why.
    assert [j.stopped_by for j in (a, b, c)] == ["operator", "shutdown", "shutdown"]
    # All end at once, the running one too (its engine may take a while to stop).
    assert [i for i, _ in seen] == [b.id, c.id, a.id] and s.queued() == []
    assert s.running() is None
    gw.send(a, done("cancelled"))  # the engine's own end, later: dropped
    assert gw.submitted == [a.id] and len(seen) == 3
    assert [o.finish for o in s.recent()] == ["cancelled", "cancelled", "cancelled"]


def test_withdraw_ends_only_a_waiting_job() -> None:
    gw = ManualGateway()
    s = ApiRequests(gw)
    seen: list[tuple[str, ApiEvent]] = []
    a, b = make_job(1, seen), make_job(2, seen)
    s.enqueue(a)
    s.enqueue(b)
    assert s.withdraw(a) is False and not a.stop.is_set()  # running: left alone
    assert s.withdraw(b) is True and b.stopped_by == "client" and s.queued() == []
    assert s.withdraw(b) is False
    assert gw.submitted == [a.id] and [i for i, _ in seen] == [b.id]


def test_retry_after_follows_how_long_replies_take(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    fake_time = SimpleNamespace(monotonic=lambda: clock[0], time=time.time)
    monkeypatch.setattr(line_module, "time", fake_time)
    gw = ManualGateway()
    s = ApiRequests(gw, max_queue=1)
    assert s.retry_after() == 2  # nothing ran yet
    for seconds in (6.2, 7.5, 9.0):
        job = make_job(int(seconds))
        s.enqueue(job)
        clock[0] += seconds
        gw.send(job, done())
    assert s.retry_after() == 8  # the median, rounded up
    s.enqueue(make_job(99))
    with pytest.raises(QueueFull, match="Try again in 8 s"):
        s.enqueue(make_job(100))
    for _ in range(3):
        clock[0] += 500
        gw.handed[-1].relay.send(done())
        s.enqueue(make_job(101))
    assert s.retry_after() == 30  # at most 30 s


def test_length_and_recent_keeps_sixteen() -> None:
    gw = ManualGateway()
    s = ApiRequests(gw)
    for i in range(20):
        job = make_job(i)
        s.enqueue(job)
        gw.send(job, done("max_tokens" if i % 2 else "context_full"))
    recent = s.recent()
    assert len(recent) == 16 and recent[0].id == "chatcmpl-4"
    assert {o.finish for o in recent} == {"length"}


def test_a_gateway_that_refuses_fails_the_job_and_the_queue_moves() -> None:
    gw = ManualGateway()
    gw.refuse = True
    s = ApiRequests(gw)
    seen: list[tuple[str, ApiEvent]] = []
    assert s.enqueue(make_job(1, seen)) == 0
    [(_, event)] = seen
    assert isinstance(event, ApiFailure) and event.status == 500
    assert s.running() is None


class CheckingGateway(FakeGateway):
    """A FakeGateway that fails the test if two jobs are ever outstanding at once."""

    def __init__(self) -> None:
        super().__init__(tokens=["a", "b"], delay=0.0005)  # slow enough to fill the queue
        self.outstanding = 0
        self.max_outstanding = 0
        self.lock = threading.Lock()

    def submit(self, job: ReplyJob) -> None:
        inner = job.relay.watch  # the line's: it moves on after the terminal event

        def watch(event: Finished | ReplyFailed) -> Callable[[], None] | None:
            with self.lock:
                self.outstanding -= 1
            return inner(event) if inner is not None else None

        job.relay.watch = watch
        with self.lock:
            self.outstanding += 1
            self.max_outstanding = max(self.max_outstanding, self.outstanding)
        super().submit(job)


def test_eight_threads_hammering() -> None:
    gw = CheckingGateway()
    s = ApiRequests(gw, max_queue=4)
    terminals: dict[str, int] = {}
    tokens: dict[str, int] = {}
    lock = threading.Lock()
    full = 0
    per_thread = 30

    def client(t: int) -> None:
        nonlocal full
        for i in range(per_thread):
            job = make_job(t * 1000 + i)

            def emit(event: ApiEvent, job: ApiJob = job) -> None:
                with lock:
                    if isinstance(event, Token):
                        tokens[job.id] = tokens.get(job.id, 0) + 1
                    else:
                        terminals[job.id] = terminals.get(job.id, 0) + 1

            job.emit = emit
            while True:
                try:
                    s.enqueue(job)
                    break
                except QueueFull:
                    with lock:
                        full += 1
                    time.sleep(0.001)
            if i % 5 == 0:
                s.abandon(job)
            if i % 7 == 0:
                s.stop_running()

    threads = [threading.Thread(target=client, args=(t,)) for t in range(8)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        deadline = time.monotonic() + 10
        while len(terminals) < 8 * per_thread and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        gw.close()
    assert len(terminals) == 8 * per_thread and set(terminals.values()) == {1}
    assert gw.max_outstanding == 1
    assert s.running() is None and s.queued() == []
    # Jobs reached the worker in the order they were submitted, each at most once.
    assert gw.started == gw.submitted and len({id(j) for j in gw.submitted}) == len(gw.submitted)
    assert full > 0  # the queue limit was reached and enforced
