"""Threads for the model manager: Hub queries and library scans on one, downloads on another."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QThread, Signal, Slot

from app.models.downloads import DownloadJob, DownloadQueue, SpeedMeter
from app.models.hub import HubClient
from app.models.library import Library
from app.util.errors import LamplightError
from ui.worker import register_thread

log = logging.getLogger(__name__)

PROGRESS_INTERVAL = 0.25  # seconds between progress signals per download


class HubWorker(QObject):
    """Answers searches, repo pages and library scans off the GUI thread.

    Signals:
        searchDone(int, object): request id and a list of ``ModelHit``.
        detailsDone(int, object): request id and ``RepoDetails``.
        libraryDone(object): a list of ``LibraryEntry``.
        failed(int, str): request id and a message.
    """

    searchDone = Signal(int, object)
    detailsDone = Signal(int, object)
    libraryDone = Signal(object)
    failed = Signal(int, str)

    def __init__(self, client: HubClient, library: Library) -> None:
        super().__init__()
        self._client = client
        self._library = library

    @Slot(int, str, str, int, int)
    def search(self, request: int, query: str, sort: str, start: int, count: int) -> None:
        try:
            self.searchDone.emit(request, self._client.page(query, sort, start, count))
        except LamplightError as exc:
            self.failed.emit(request, str(exc))

    @Slot(int, str)
    def details(self, request: int, repo_id: str) -> None:
        try:
            self.detailsDone.emit(request, self._client.details(repo_id))
        except LamplightError as exc:
            self.failed.emit(request, str(exc))

    @Slot(object)
    def scan(self, imported: list[Path]) -> None:
        self._library.imported = list(imported)
        try:
            entries = self._library.scan()
        except Exception:  # scan() lists what it can; this is the last line of defence
            log.exception("library scan failed")
            entries = []
        self.libraryDone.emit(entries)


class DownloadWorker(QObject):
    """Runs the download queue until it is closed.

    Signals:
        progress(object, float, object): job, bytes/s and seconds left (or None).
        jobEnded(object): a job that finished, failed, paused or was cancelled.
    """

    progress = Signal(object, float, object)
    jobEnded = Signal(object)

    def __init__(self, queue: DownloadQueue) -> None:
        super().__init__()
        self._queue = queue
        self._closing = False

    @Slot()
    def run(self) -> None:
        while not self._closing:
            job = self._queue.wait_for_job(0.5)
            if job is None:
                continue
            meter = SpeedMeter()
            last = [0.0]

            def on_progress(
                j: DownloadJob, meter: SpeedMeter = meter, last: list[float] = last
            ) -> None:
                now = time.monotonic()
                meter.add(j.done_bytes, now)
                if now - last[0] >= PROGRESS_INTERVAL or j.state != "running":
                    last[0] = now
                    self.progress.emit(j, meter.rate(), meter.eta(j.total_bytes - j.done_bytes))

            self._queue.run(job, on_progress)
            self.jobEnded.emit(job)

    def stop(self) -> None:
        """Any thread: end the loop after the running job pauses."""
        self._closing = True
        self._queue.close()


class HubServices(QObject):
    """Starts and joins the two threads; the manager window talks to it."""

    _searchRequested = Signal(int, str, str, int, int)
    _detailsRequested = Signal(int, str)
    _scanRequested = Signal(object)

    def __init__(self, client: HubClient, library: Library, queue: DownloadQueue) -> None:
        super().__init__()
        self.queue = queue
        self.hub_thread = QThread()
        self.hub_thread.setObjectName("lamplight-hub")
        self.download_thread = QThread()
        self.download_thread.setObjectName("lamplight-downloads")
        for t in (self.hub_thread, self.download_thread):
            register_thread(t)
        self.hub = HubWorker(client, library)
        self.hub.moveToThread(self.hub_thread)
        self.downloads = DownloadWorker(queue)
        self.downloads.moveToThread(self.download_thread)
        self._searchRequested.connect(self.hub.search)
        self._detailsRequested.connect(self.hub.details)
        self._scanRequested.connect(self.hub.scan)
        self.download_thread.started.connect(self.downloads.run)
        self._next = 0
        self.hub_thread.start()
        self.download_thread.start()

    def _id(self) -> int:
        self._next += 1
        return self._next

    def search(self, query: str, sort: str, start: int = 0, count: int = 30) -> int:
        request = self._id()
        self._searchRequested.emit(request, query, sort, start, count)
        return request

    def details(self, repo_id: str) -> int:
        request = self._id()
        self._detailsRequested.emit(request, repo_id)
        return request

    def scan(self, imported: list[Path]) -> None:
        self._scanRequested.emit(list(imported))

    def shutdown(self, timeout_ms: int = 10_000) -> None:
        """Pause downloads (their parts stay for next time) and join both threads.

        Pausing shuts the running download's socket, so a read blocked on a stalled
        server returns at once rather than after its 30 s timeout.
        """
        self.downloads.stop()
        for t in (self.download_thread, self.hub_thread):
            t.quit()
        for t in (self.download_thread, self.hub_thread):
            if not t.wait(timeout_ms):
                log.warning("thread %s did not stop in time", t.objectName())


def job_summary(job: DownloadJob, rate: float, eta: Any) -> str:
    """Speed and time left, for the downloads list."""
    if job.state != "running":
        return job.error or job.state
    parts = [f"{rate / 1e6:.1f} MB/s" if rate else "starting…"]
    if isinstance(eta, float):
        minutes, seconds = divmod(int(eta), 60)
        parts.append(f"{minutes}:{seconds:02d} left")
    return " · ".join(parts)
