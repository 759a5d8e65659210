"""The API's requests on the host's line, in the API's terms: admission, status, Stop.

The requests wait on the engine host's own queue (``app.host.line.ReplyLine``: one
API reply on it at a time, the others waiting in order); this is what the server and
the window see of them. ``enqueue`` refuses a request when ``max_queue`` are running
or waiting (``QueueFull``: 429); ``running`` / ``queued`` / ``recent`` are the views
``/lamplight/status`` and the window show; ``abandon`` and ``withdraw`` end a request
whose client went away or waited too long; ``stop_running`` is the window's Stop.

A waiting request costs a place in the line and an open connection, so the line is
long (``max_queue``, 32 by default) rather than refusing early: the ``openai`` client's
two retries of a 429 come within seconds, too soon for a reply to end. A refusal's
``Retry-After`` is how long recent replies took (``retry_after``); how long a request
may wait is bounded by the server (``ApiConfig.max_wait_s``).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from app.api.gateway import ApiJob, EngineGateway
from app.engine.backend import Finished
from app.engine.metrics import MessageMetrics
from app.engine.templates.override import PLAIN
from app.host.jobs import ReplyFailed
from app.host.line import Ended, LineFull, Place
from app.util.errors import LamplightError

RETRY_AFTER_S = (1, 30)  # the bounds of the Retry-After a refusal suggests


class QueueFull(LamplightError):
    """The line (the running request included) holds ``max_queue`` requests already."""


@dataclass(frozen=True)
class JobView:
    """A running or waiting request, for the UI and ``/lamplight/status``."""

    id: str
    kind: str
    client: str
    tokens: int
    started: float  # time.monotonic(): when it started running, or was queued


@dataclass(frozen=True)
class Outcome:
    """How a finished request ended."""

    id: str
    client: str
    finish: str  # "stop" | "length" | "tool_calls" | "cancelled" | "error"
    tokens: int
    prompt_tokens: int
    cached_tokens: int
    ended: float  # time.time()


_FINISH = {"eos": "stop", "stop_string": "stop", "max_tokens": "length", "context_full": "length"}


def outcome_finish(event: Finished | ReplyFailed) -> str:
    if isinstance(event, ReplyFailed):
        return "error"
    return _FINISH.get(event.metrics.stop_reason, event.metrics.stop_reason or "stop")


def job_view(place: Place) -> JobView:
    job = place.job
    kind = "completion" if job.template == PLAIN else "chat"  # as ``reply_job`` sets it
    return JobView(job.id, kind, job.client, place.tokens, place.started)


def outcome(ended: Ended) -> Outcome:
    event = ended.event
    m = event.metrics if isinstance(event, Finished) else MessageMetrics()
    return Outcome(
        id=ended.job.id,
        client=ended.job.client,
        finish=outcome_finish(event),
        tokens=max(m.generated_tokens, ended.tokens),
        prompt_tokens=m.prompt_tokens,
        cached_tokens=m.cached_tokens,
        ended=ended.ended,
    )


class ApiRequests:
    """The API's requests on ``gateway``'s line; every method is thread-safe."""

    def __init__(self, gateway: EngineGateway, max_queue: int = 32) -> None:
        self._gateway = gateway
        self.max_queue = max(1, max_queue)

    def enqueue(self, job: ApiJob) -> int:
        """Queue ``job``; returns how many requests are ahead of it (0: it runs now).

        Raises:
            QueueFull: ``max_queue`` requests are running or waiting.
        """
        try:
            return self._gateway.join(job, self.max_queue)
        except LineFull as full:
            raise QueueFull(
                f"The server is busy: {full.size} requests are running or waiting "
                f"(the limit is {full.limit}). Try again in {self.retry_after()} s."
            ) from full

    def running(self) -> JobView | None:
        place = self._gateway.line.running()
        return job_view(place) if place is not None else None

    def queued(self) -> list[JobView]:
        return [job_view(p) for p in self._gateway.line.waiting()]

    def recent(self) -> list[Outcome]:
        """The last 16 outcomes, oldest first."""
        return [outcome(e) for e in self._gateway.line.recent()]

    def retry_after(self) -> int:
        """Seconds a refused client should wait: what a recent reply took (1 to 30)."""
        durations = self._gateway.line.durations()
        if not durations:
            return 2
        low, high = RETRY_AFTER_S
        return max(low, min(high, math.ceil(statistics.median(durations))))

    def stop_running(self) -> bool:
        """Stop the running request (the UI's Stop); False when none runs."""
        return self._gateway.line.stop_running("operator")

    def cancel_all(self) -> None:
        """End every request now (shutdown)."""
        self._gateway.line.cancel_all("shutdown")

    def abandon(self, job: ApiJob) -> None:
        """The client went away: stop ``job``; a waiting one ends here."""
        job.halt("client")
        self.withdraw(job)

    def withdraw(self, job: ApiJob) -> bool:
        """End ``job`` now if it is still waiting (True); a running one is left alone."""
        return self._gateway.line.withdraw(job.id, "client")
