"""The embedding model's own thread: jobs in a priority queue, results as futures.

One long-lived daemon thread owns the :class:`~app.engine.local.embedder.Embedder` (a llama.cpp
context is used by one thread at a time) and loads it on the first job. Urgent jobs (a
query, an API call) run before queued ordinary ones (indexing batches), and jobs of one
priority run in the order they came. A load that fails fails that job's future with
:class:`~app.util.errors.EmbedderError`; the next job tries to load again.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from app.engine.local.embedder import Embedder
from app.util.errors import EmbedderError, LamplightError

log = logging.getLogger(__name__)

T = TypeVar("T")
JOIN_TIMEOUT_S = 10.0  # close() waits this long for a running job (one decode: < 1 s)


@dataclass(order=True)
class _Job:
    priority: int  # 0 urgent, 1 queued
    seq: int
    fn: Callable[[Embedder], Any] | None = field(compare=False)  # None: stop the thread
    future: Future[Any] = field(compare=False)


class EmbedWorker:
    """Runs functions of the embedder on its own thread (see the module docstring)."""

    def __init__(
        self,
        locate: Callable[[], Path],
        n_threads: int = 1,
        *,
        extra_bufts: Callable[[], bool | None] | None = None,
    ) -> None:
        self._locate = locate
        self._n_threads = n_threads
        self._extra_bufts = extra_bufts
        self._heap: list[_Job] = []
        self._count = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._embedder: Embedder | None = None
        self._stale = False  # another model was chosen: load it before the next job
        self._thread = threading.Thread(target=self._run, name="embed-worker", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[Embedder], T], urgent: bool = False) -> Future[T]:
        """Run ``fn(embedder)`` on the worker thread; urgent jobs go before queued ones."""
        future: Future[T] = Future()
        with self._cond:
            if self._closed:
                future.set_exception(EmbedderError("The embedding model has been closed."))
                return future
            heapq.heappush(self._heap, _Job(0 if urgent else 1, next(self._count), fn, future))
            self._cond.notify()
        return future

    def embed(
        self, texts: Sequence[str], urgent: bool = False, stop: threading.Event | None = None
    ) -> Future[np.ndarray]:
        """The vectors of ``texts`` (see :meth:`Embedder.embed`), as a future."""
        items = list(texts)
        return self.submit(lambda e: e.embed(items, stop), urgent=urgent)

    def info(self) -> Future[tuple[str, int]]:
        """(model name, dimension), loading the model if needed."""
        return self.submit(lambda e: (e.name, e.dim), urgent=True)

    def reload(self) -> None:
        """Use the model ``locate`` names from the next job on (another was chosen); the
        one loaded now is freed on the worker thread, which owns it."""
        with self._cond:
            self._stale = True

    def close(self) -> None:
        """Cancel the queued jobs, stop the thread (bounded wait) and free the model;
        idempotent."""
        with self._cond:
            if not self._closed:
                self._closed = True
                for job in self._heap:
                    job.future.cancel()
                self._heap = [_Job(-1, -1, None, Future())]
                self._cond.notify()
        if self._thread is not threading.current_thread():
            self._thread.join(JOIN_TIMEOUT_S)
            if self._thread.is_alive():
                log.warning("the embedding thread did not stop within %.0f s", JOIN_TIMEOUT_S)

    def _next(self) -> _Job:
        with self._cond:
            while not self._heap:
                self._cond.wait()
            return heapq.heappop(self._heap)

    def _run(self) -> None:
        try:
            while True:
                job = self._next()
                if job.fn is None:
                    return
                if not job.future.set_running_or_notify_cancel():
                    continue
                try:
                    result = job.fn(self._loaded())
                except BaseException as exc:  # the caller sees it on the future
                    job.future.set_exception(exc)
                else:
                    job.future.set_result(result)
        finally:
            embedder, self._embedder = self._embedder, None
            if embedder is not None:
                embedder.close()

    def _loaded(self) -> Embedder:
        with self._cond:
            stale, self._stale = self._stale, False
        if stale and self._embedder is not None:
            self._embedder.close()
            self._embedder = None
        if self._embedder is None:
            try:
                bufts = self._extra_bufts() if self._extra_bufts else None
                self._embedder = Embedder.load(self._locate(), self._n_threads, extra_bufts=bufts)
            except EmbedderError:
                raise
            except LamplightError as exc:
                raise EmbedderError(str(exc)) from exc
            except Exception as exc:  # a locate() that failed in an unforeseen way
                log.exception("loading the embedding model failed")
                raise EmbedderError(f"The embedding model could not be loaded: {exc}") from exc
        return self._embedder
