"""``ReplyLine``: where API replies wait their turn on the host's queue.

llama.cpp's ``server_queue`` keeps tasks that cannot run yet in a deferred list and
moves the first of them back onto the queue when a slot frees up; this is that list
for API replies. At most one API reply is on the host's queue at a time (``hand``);
the others wait here, in order, and the next goes on when the one before it ends (its
terminal event, seen through its ``Relay``). A window reply so waits for at most one
API reply, and the window's tokens and an API client's never interleave. A reply
stopped while it waits ends here (cancelled) and never reaches the engine.

Every method is thread-safe: the API server's event loop joins and withdraws, the
engine thread ends replies, the window polls ``running`` / ``waiting`` and stops the
running one. The line keeps how long recent replies ran and how they ended.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from app.engine.backend import Finished
from app.engine.metrics import MessageMetrics
from app.host.jobs import ReplyFailed, ReplyJob, StopCause, Terminal
from app.util.errors import LamplightError

log = logging.getLogger(__name__)

RECENT = 16  # endings and durations kept


class LineFull(LamplightError):
    """``limit`` replies are running or waiting already (the running one included)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"{size} replies are running or waiting (the limit is {limit}).")
        self.size = size
        self.limit = limit


@dataclass(frozen=True)
class Place:
    """A running or waiting reply, as the line sees it now."""

    job: ReplyJob
    tokens: int
    started: float  # time.monotonic(): when it started running, or joined the line


@dataclass(frozen=True)
class Ended:
    """How a reply that joined the line ended."""

    job: ReplyJob
    event: Terminal
    tokens: int  # tokens its sink heard
    ended: float  # time.time()


def cancelled(tokens: int = 0) -> Finished:
    return Finished("", MessageMetrics(stop_reason="cancelled", generated_tokens=tokens))


class _Entry:
    def __init__(self, job: ReplyJob) -> None:
        self.job = job
        self.started = time.monotonic()

    def place(self) -> Place:
        return Place(self.job, self.job.relay.tokens, self.started)


class ReplyLine:
    """API replies in order, at most one of them handed to ``hand`` at a time."""

    def __init__(self, hand: Callable[[ReplyJob], None]) -> None:
        self._hand_on = hand  # queues a reply on the host's queue
        self._lock = threading.Lock()
        self._running: _Entry | None = None
        self._waiting: deque[_Entry] = deque()
        self._entries: dict[str, _Entry] = {}  # job id -> entry, until it ends
        self._recent: deque[Ended] = deque(maxlen=RECENT)
        self._durations: deque[float] = deque(maxlen=RECENT)  # seconds recent replies ran

    def join(self, job: ReplyJob, limit: int) -> int:
        """Queue ``job``; returns how many replies are ahead of it (0: it runs now).

        Raises:
            LineFull: ``limit`` replies are running or waiting.
        """
        entry = _Entry(job)
        with self._lock:
            size = len(self._waiting) + (self._running is not None)
            if size >= max(1, limit):
                raise LineFull(size, max(1, limit))
            job.relay.watch = lambda event: self._ending(entry, event)
            self._entries[job.id] = entry
            if self._running is None:
                self._running = entry
                position = 0
            else:
                self._waiting.append(entry)
                position = len(self._waiting)
        if position == 0:
            self._hand(entry)
        return position

    def running(self) -> Place | None:
        with self._lock:
            return self._running.place() if self._running else None

    def waiting(self) -> list[Place]:
        with self._lock:
            return [e.place() for e in self._waiting]

    def recent(self) -> list[Ended]:
        """The last 16 endings, oldest first."""
        with self._lock:
            return list(self._recent)

    def durations(self) -> list[float]:
        """How long the last 16 replies that ran took, in seconds."""
        with self._lock:
            return list(self._durations)

    def stop_running(self, why: StopCause) -> bool:
        """Stop the running reply (False when none runs)."""
        with self._lock:
            entry = self._running
        if entry is None:
            return False
        entry.job.halt(why)
        return True

    def withdraw(self, job_id: str, why: StopCause) -> bool:
        """End the reply ``job_id`` here if it is still waiting (True); a running one is
        left alone."""
        with self._lock:
            entry = self._entries.get(job_id)
            if entry is None or entry not in self._waiting:
                return False
            self._waiting.remove(entry)
        entry.job.halt(why)
        entry.job.relay.send(cancelled())
        return True

    def cancel_all(self, why: StopCause) -> None:
        """End every reply now: the waiting ones, and the running one, whose engine's own
        terminal event is dropped when it comes."""
        with self._lock:
            waiting = list(self._waiting)
            self._waiting.clear()
            running = self._running
        for entry in waiting:
            entry.job.halt(why)
            entry.job.relay.send(cancelled())
        if running is not None:
            running.job.halt(why)
            # Its client hears now, however long the engine takes to stop.
            running.job.relay.send(cancelled(running.job.relay.tokens))

    # -- internals ---------------------------------------------------------------------

    def _hand(self, entry: _Entry) -> None:
        """Put ``entry`` (the running one) on the host's queue, outside the lock."""
        job = entry.job
        if job.stop.is_set():  # stopped while it waited: never reaches the engine
            job.relay.send(cancelled())
            return
        try:
            self._hand_on(job)
        except Exception as exc:  # a queue that cannot take it: the reply fails, the line moves
            log.error("a reply could not be queued", exc_info=exc)
            job.relay.send(ReplyFailed(exc))

    def _ending(self, entry: _Entry, event: Terminal) -> Callable[[], None] | None:
        """``entry``'s terminal event, before its sink hears it: the line moves on after."""
        following: _Entry | None = None
        with self._lock:
            self._entries.pop(entry.job.id, None)
            if entry in self._waiting:
                self._waiting.remove(entry)
            self._recent.append(Ended(entry.job, event, entry.job.relay.tokens, time.time()))
            if entry is self._running:
                self._durations.append(time.monotonic() - entry.started)
                self._running = following = self._waiting.popleft() if self._waiting else None
                if following is not None:
                    following.started = time.monotonic()
        if following is None:
            return None
        nxt = following
        return lambda: self._hand(nxt)
