"""One way to run a job off the GUI thread: ``run_in_background(fn, on_done, on_error)``
(Picard's ``run_task``, Anki's ``CollectionOp``).

``fn()`` runs on Qt's global thread pool; its result, or the exception it raised, comes
back to the GUI thread through a queued signal and goes to ``on_done`` or ``on_error``
there, never inside the call that started it. A job whose owner (by default the object
``on_done`` is a method of) was deleted meanwhile calls nothing. An exception nobody
takes is logged. Cancelling stays the job's own business: ``fn`` checks its own
``threading.Event``; the returned ``Job`` says when ``fn`` has returned (to wait at close).

``fn``, its closure and its result may be dropped on the worker thread, so they should
hold no ``QObject``: a Qt object must die on its own thread (docs/NOTES.md). ``on_done`` and
``on_error`` are only ever held and dropped on the GUI thread.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import shiboken6
from PySide6.QtCore import QCoreApplication, QObject, QRunnable, Qt, QThreadPool, Signal

log = logging.getLogger(__name__)

T = TypeVar("T")

# The jobs wait on disk, network and child processes more than they compute: a 2-core
# machine still runs a few at once, so a long indexing job does not hold up a test.
MIN_THREADS = 8


class Job:
    """A handle on one background run."""

    def __init__(self) -> None:
        self._ended = threading.Event()

    @property
    def running(self) -> bool:
        """``fn`` has not returned yet."""
        return not self._ended.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until ``fn`` has returned (any thread); False: still running at timeout."""
        return self._ended.wait(timeout)


@dataclass
class _Delivery:
    on_done: Callable[[Any], object] | None
    on_error: Callable[[Exception], object] | None
    owner: QObject | None


class _Inbox(QObject):
    """Lives on the GUI thread for good; every job's answer reaches it queued."""

    arrived = Signal(int, object, object)  # job id, result, exception or None

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._waiting: dict[int, _Delivery] = {}
        self._ids = itertools.count(1)
        self.arrived.connect(self._deliver, Qt.ConnectionType.QueuedConnection)

    def expect(self, delivery: _Delivery) -> int:
        with self._lock:
            ident = next(self._ids)
            self._waiting[ident] = delivery
        return ident

    def _deliver(self, ident: int, result: object, error: object) -> None:
        with self._lock:
            d = self._waiting.pop(ident)
        alive = d.owner is None or shiboken6.isValid(d.owner)
        if isinstance(error, Exception):
            if alive and d.on_error is not None:
                d.on_error(error)
            else:
                log.error(
                    "background job failed", exc_info=(type(error), error, error.__traceback__)
                )
        elif alive and d.on_done is not None:
            d.on_done(result)


_inbox: _Inbox | None = None


def _the_inbox() -> _Inbox:
    global _inbox
    if _inbox is None:
        app = QCoreApplication.instance()
        if app is None:
            raise RuntimeError("run_in_background needs a running QApplication")
        inbox = _Inbox()
        inbox.moveToThread(app.thread())
        _inbox = inbox
    return _inbox


class _Runner(QRunnable):
    def __init__(self, fn: Callable[[], object], ident: int, job: Job) -> None:
        super().__init__()
        self._fn: Callable[[], object] | None = fn
        self._ident, self._job = ident, job

    def run(self) -> None:  # Qt's name
        try:
            result, error = self._call()
            assert _inbox is not None
            _inbox.arrived.emit(self._ident, result, error)
        finally:
            self._job._ended.set()

    def _call(self) -> tuple[object, Exception | None]:
        fn, self._fn = self._fn, None  # its closure dies with this frame, on this thread
        assert fn is not None
        try:
            return fn(), None
        except Exception as exc:  # handed to on_error, or logged, on the GUI thread
            return None, exc


def run_in_background(
    fn: Callable[[], T],
    on_done: Callable[[T], object] | None = None,
    on_error: Callable[[Exception], object] | None = None,
    *,
    owner: QObject | None = None,
) -> Job:
    """Run ``fn()`` on the thread pool; ``on_done(result)`` or ``on_error(exc)`` later, on
    the GUI thread, unless ``owner`` (default: ``on_done``'s object, if a ``QObject``) was
    deleted meanwhile. Call from the GUI thread."""
    if owner is None:
        bound = getattr(on_done, "__self__", None)
        owner = bound if isinstance(bound, QObject) else None
    inbox = _the_inbox()
    ident = inbox.expect(_Delivery(on_done, on_error, owner))
    job = Job()
    pool = QThreadPool.globalInstance()
    if pool.maxThreadCount() < MIN_THREADS:
        pool.setMaxThreadCount(MIN_THREADS)
    pool.start(_Runner(fn, ident, job))
    return job
