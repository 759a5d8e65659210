"""The API request queue: one job at a time into the engine worker, FIFO among clients.

``ApiScheduler`` keeps API jobs in its own deque and submits the next only after
the running one's terminal event (it wraps ``job.emit``), so the worker's queue
holds at most one API job: a GUI request waits for at most one API reply, and GUI
and API tokens never interleave. A job stopped while it waits ends here
(``cancelled``) and never reaches the engine. Every method is thread-safe: the
server's event loop enqueues and abandons, the worker emits, the UI polls
``running()`` / ``queued()`` with a timer and calls ``stop_running()``.

A waiting job costs a slot in a deque and an open connection, so the queue is long
(``max_queue``, 32 by default) rather than refusing early: the ``openai`` client's two
retries of a 429 come within seconds, too soon for a reply to end. A refusal's
``Retry-After`` is how long recent replies took (``retry_after``); how long a job may
wait is bounded by the server (``ApiConfig.max_wait_s``).
"""

from __future__ import annotations

import logging
import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from app.api.gateway import ApiEvent, ApiFailure, ApiJob, EngineGateway
from app.engine.backend import Finished, Token
from app.engine.metrics import MessageMetrics
from app.util.errors import LamplightError

log = logging.getLogger(__name__)

RECENT = 16
RETRY_AFTER_S = (1, 30)  # the bounds of the Retry-After a refusal suggests


class QueueFull(LamplightError):
    """The queue (the running job included) holds ``max_queue`` jobs already."""


@dataclass(frozen=True)
class JobView:
    """A running or waiting job, for the UI and ``/lamplight/status``."""

    id: str
    kind: str
    client: str
    tokens: int
    started: float  # time.monotonic(): when it started running, or was queued


@dataclass(frozen=True)
class Outcome:
    """How a finished job ended."""

    id: str
    client: str
    finish: str  # "stop" | "length" | "tool_calls" | "cancelled" | "error"
    tokens: int
    prompt_tokens: int
    cached_tokens: int
    ended: float  # time.time()


_FINISH = {"eos": "stop", "stop_string": "stop", "max_tokens": "length", "context_full": "length"}


def outcome_finish(event: Finished | ApiFailure) -> str:
    if isinstance(event, ApiFailure):
        return "error"
    return _FINISH.get(event.metrics.stop_reason, event.metrics.stop_reason or "stop")


class _Entry:
    def __init__(self, job: ApiJob, emit: Callable[[ApiEvent], None]) -> None:
        self.job = job
        self.emit = emit  # the job's own emit, wrapped by ours
        self.tokens = 0
        self.started = time.monotonic()
        self.ended = False

    def view(self) -> JobView:
        j = self.job
        return JobView(j.id, j.kind, j.client, self.tokens, self.started)


def cancelled_event() -> Finished:
    return Finished("", MessageMetrics(stop_reason="cancelled"))


class ApiScheduler:
    """FIFO of API jobs, at most one submitted to ``gateway`` at a time."""

    def __init__(self, gateway: EngineGateway, max_queue: int = 32) -> None:
        self._gateway = gateway
        self.max_queue = max(1, max_queue)
        self._lock = threading.Lock()
        self._running: _Entry | None = None
        self._queue: deque[_Entry] = deque()
        self._recent: deque[Outcome] = deque(maxlen=RECENT)
        self._durations: deque[float] = deque(maxlen=RECENT)  # seconds recent jobs ran
        self._entries: dict[int, _Entry] = {}  # id(job) -> entry, until it ends

    def enqueue(self, job: ApiJob) -> int:
        """Queue ``job``; returns how many jobs are ahead of it (0: it runs now).

        Raises:
            QueueFull: ``max_queue`` jobs are running or waiting.
        """
        entry = _Entry(job, job.emit)
        with self._lock:
            size = len(self._queue) + (self._running is not None)
            if size >= self.max_queue:
                raise QueueFull(
                    f"The server is busy: {size} requests are running or waiting "
                    f"(the limit is {self.max_queue}). Try again in "
                    f"{self._retry_after()} s."
                )
            job.emit = lambda event: self._on_event(entry, event)
            self._entries[id(job)] = entry
            if self._running is None:
                self._running = entry
                position = 0
            else:
                self._queue.append(entry)
                position = len(self._queue)
        if position == 0:
            self._submit(entry)
        return position

    def running(self) -> JobView | None:
        with self._lock:
            return self._running.view() if self._running else None

    def queued(self) -> list[JobView]:
        with self._lock:
            return [e.view() for e in self._queue]

    def retry_after(self) -> int:
        """Seconds a refused client should wait: what a recent reply took (1 to 30)."""
        with self._lock:
            return self._retry_after()

    def _retry_after(self) -> int:
        if not self._durations:
            return 2
        low, high = RETRY_AFTER_S
        return max(low, min(high, math.ceil(statistics.median(self._durations))))

    def recent(self) -> list[Outcome]:
        """The last 16 outcomes, oldest first."""
        with self._lock:
            return list(self._recent)

    def stop_running(self) -> bool:
        """Stop the running job (the UI's Stop); False when none runs."""
        with self._lock:
            entry = self._running
        if entry is None:
            return False
        entry.job.halt("operator")
        return True

    def cancel_all(self) -> None:
        """End every job now (shutdown): the running one is stopped and ends here, its
        engine's own terminal event dropped when it comes."""
        with self._lock:
            waiting = list(self._queue)
            self._queue.clear()
            running = self._running
        for entry in waiting:
            entry.job.halt("shutdown")
            self._end_unsubmitted(entry)
        if running is not None:
            running.job.halt("shutdown")
            # Its client hears now, however long the engine takes to stop: the server
            # is going away, and a stream cut by it would end without a word.
            stopped = MessageMetrics(stop_reason="cancelled", generated_tokens=running.tokens)
            self._on_event(running, Finished("", stopped))

    def abandon(self, job: ApiJob) -> None:
        """The client went away: stop ``job``; a waiting one ends here."""
        job.halt("client")
        self.withdraw(job)

    def withdraw(self, job: ApiJob) -> bool:
        """End ``job`` here if it is still waiting (True); a running one is left alone."""
        with self._lock:
            entry = self._entries.get(id(job))
            if entry is None or entry is self._running or entry not in self._queue:
                return False
            self._queue.remove(entry)
        entry.job.halt("client")
        self._end_unsubmitted(entry)
        return True

    # -- internals ---------------------------------------------------------------------

    def _submit(self, entry: _Entry) -> None:
        """Hand ``entry`` to the gateway (it is ``_running``), outside the lock."""
        if entry.job.stop.is_set():
            self._on_event(entry, cancelled_event())
            return
        try:
            self._gateway.submit(entry.job)
        except Exception as exc:  # a gateway that cannot take it: the job fails, the queue moves
            log.error("API job could not be submitted", exc_info=exc)
            self._on_event(
                entry,
                ApiFailure(500, "server_error", "internal_error", f"Could not queue it: {exc}"),
            )

    def _end_unsubmitted(self, entry: _Entry) -> None:
        self._on_event(entry, cancelled_event())

    def _on_event(self, entry: _Entry, event: ApiEvent) -> None:
        """Every event of a job passes here (on the worker's thread, or ours)."""
        terminal = isinstance(event, Finished | ApiFailure)
        following: _Entry | None = None
        with self._lock:
            if entry.ended:
                return  # one terminal event per job; nothing after it
            if isinstance(event, Token):
                entry.tokens += 1
            elif terminal:
                assert isinstance(event, Finished | ApiFailure)
                entry.ended = True
                self._entries.pop(id(entry.job), None)
                self._recent.append(self._outcome(entry, event))
                if entry is self._running:
                    self._durations.append(time.monotonic() - entry.started)
                    self._running = following = self._queue.popleft() if self._queue else None
                    if following is not None:
                        following.started = time.monotonic()
        try:
            entry.emit(event)
        except Exception as exc:  # emit must not raise; if it does, the queue still moves
            log.error("API job's emit failed", exc_info=exc)
            entry.job.stop.set()
        if following is not None:
            self._submit(following)

    def _outcome(self, entry: _Entry, event: Finished | ApiFailure) -> Outcome:
        m = event.metrics if isinstance(event, Finished) else MessageMetrics()
        return Outcome(
            id=entry.job.id,
            client=entry.job.client,
            finish=outcome_finish(event),
            tokens=max(m.generated_tokens, entry.tokens),
            prompt_tokens=m.prompt_tokens,
            cached_tokens=m.cached_tokens,
            ended=time.time(),
        )
