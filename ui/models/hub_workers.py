"""Threads for the model manager: Hub queries and library scans on one, downloads on another.

These two stay long-lived ``QThread``s with their own signals rather than
``ui.common.background.run_in_background`` jobs: each serves its requests one at a time,
in order (Hub queries and scans share one client; downloads run from a persistent queue,
pausable and resumable, and report progress many times each), and both are joined at
quit (``HubServices.shutdown``).

Also the "Download and use" of recommended models (``RecommendedInstalls``), which the
model manager's Recommended tab and the first-run welcome card share, and the install of
recommended embedding models into ``<data>/embedders``."""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QThread, Signal, Slot

from app.gguf.embedder import read_embedder_info
from app.models.default_embedder import embedders_dir
from app.models.downloads import DownloadJob, DownloadQueue, SpeedMeter
from app.models.embedders import choose_embedder, chosen_name
from app.models.hub import HubClient, RepoDetails
from app.models.library import Library, LibraryEntry
from app.models.names import destination
from app.models.recommended import Recommended
from app.util.errors import LamplightError
from ui.engine.worker import register_thread

log = logging.getLogger(__name__)

PROGRESS_INTERVAL = 0.25  # seconds between progress signals per download
EMBEDDERS = "embedders"  # the download queue's name for <data>/embedders


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
    """Starts and joins the two threads; the manager window talks to it.

    ``data_dir`` (default: the folder of the queue's state file) holds ``embedders/``,
    which the queue learns as the download folder ``"embedders"``.
    """

    _searchRequested = Signal(int, str, str, int, int)
    _detailsRequested = Signal(int, str)
    _scanRequested = Signal(object)

    def __init__(
        self,
        client: HubClient,
        library: Library,
        queue: DownloadQueue,
        data_dir: Path | None = None,
    ) -> None:
        super().__init__()
        self.queue = queue
        self.data_dir = queue.state_file.parent if data_dir is None else data_dir
        if EMBEDDERS not in queue.folders:
            queue.add_folder(EMBEDDERS, embedders_dir(self.data_dir))
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
        self.installs = RecommendedInstalls(self)
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


ACTIVE = ("queued", "running", "paused", "failed")  # job states "Download and use" can resume


class RecommendedInstalls(QObject):
    """Download and use for curated models, on the GUI thread.

    A start looks the repo up on the Hub (for the file's exact size and sha256 and the
    commit to pin), queues the download on the shared queue (resumable, verified),
    and, once it is done, asks for the model to be loaded. A model already on disk
    (downloaded before, or in the Hugging Face cache) is used at once.

    An embedding model (``entry.is_embedder``) goes to ``<data>/embedders`` instead; once
    there it is checked as an embedder and chosen for documents, never loaded to chat.

    Signals:
        status(str, str, float): entry id, what is happening, fraction done (-1: unknown).
        ready(str): a chat model file to load now.
        failed(str, str): entry id and why it cannot be downloaded (or used).
        embedderChosen(str): an embedding model file now chosen for documents ("": the
            built-in one); whoever holds an embedder loaded should load this one instead.
    """

    status = Signal(str, str, float)
    ready = Signal(str)
    failed = Signal(str, str)
    embedderChosen = Signal(str)

    def __init__(self, services: HubServices) -> None:
        super().__init__(services)
        self._services = services
        self._lookups: dict[int, Recommended] = {}
        self._jobs: dict[str, Recommended] = {}
        self._known: dict[tuple[str, str], Path] = {}
        hub, downloads = services.hub, services.downloads
        # Bound methods of this GUI-thread object: queued calls from the worker threads.
        hub.detailsDone.connect(self._on_details)
        hub.failed.connect(self._on_failed)
        hub.libraryDone.connect(self._on_library)
        downloads.progress.connect(self._on_progress)
        downloads.jobEnded.connect(self._on_job_ended)

    def local_path(self, entry: Recommended) -> Path | None:
        """Where ``entry`` already is on disk, or None."""
        if entry.is_embedder:
            mine = embedders_dir(self._services.data_dir) / entry.file_name
            return mine if mine.is_file() else None
        try:
            path = destination(self._services.queue.models_dir, entry.repo, entry.file)
        except LamplightError:
            path = None
        if path is not None and path.is_file():
            return path
        known = self._known.get((entry.repo.lower(), entry.file_name))
        return known if known is not None and known.is_file() else None

    def in_use(self, entry: Recommended) -> bool:
        """Whether ``entry`` is the embedding model documents are indexed with."""
        chosen = self.chosen_embedder_file()
        return entry.is_embedder and chosen is not None and chosen.name == entry.file_name

    def chosen_embedder_file(self) -> Path | None:
        """The chosen embedding model in ``<data>/embedders``, or None: the built-in one.
        (Only the choice and that the file is there; it is checked when it is loaded.)"""
        name = chosen_name(self._services.data_dir)
        path = None if name is None else embedders_dir(self._services.data_dir) / name
        return path if path is not None and path.is_file() else None

    def use_builtin_embedder(self) -> None:
        """Index documents with the built-in model again.

        Raises:
            OSError: the choice could not be removed.
        """
        choose_embedder(self._services.data_dir, None)
        self.embedderChosen.emit("")

    def state(self, entry_id: str) -> str:
        """``idle``, ``looking`` (asking the Hub), ``downloading`` or ``paused``."""
        if any(e.id == entry_id for e in self._lookups.values()):
            return "looking"
        for job_id, entry in self._jobs.items():
            if entry.id == entry_id:
                job = self._job(job_id)
                return "paused" if job is not None and job.state == "paused" else "downloading"
        return "idle"

    def busy(self, entry_id: str) -> bool:
        """Whether ``entry_id`` is being looked up or downloaded (a paused one included)."""
        return self.state(entry_id) != "idle"

    def start(self, entry: Recommended) -> None:
        """Download ``entry`` (or find it on disk), then ask to load it. A paused or failed
        download of the same file carries on from where it stopped."""
        path = self.local_path(entry)
        if path is not None and entry.is_embedder:
            self._use_embedder(entry, path, downloaded=False)
            return
        if path is not None:
            self.status.emit(entry.id, "On disk", 1.0)
            self.ready.emit(str(path))
            return
        if self.state(entry.id) in ("looking", "downloading"):
            return
        job = self._queued_job(entry)
        if job is not None:
            self._jobs[job.id] = entry
            if job.state in ("paused", "failed"):
                self._services.queue.resume(job.id)
            self.status.emit(entry.id, "Resuming the download…", self._fraction(job))
            return
        request = self._services.details(entry.repo)
        self._lookups[request] = entry
        self.status.emit(entry.id, "Looking it up on the Hub…", -1.0)

    def cancel(self, entry_id: str) -> None:
        """Stop looking up or downloading ``entry_id`` (a partial download is deleted)."""
        for request, entry in list(self._lookups.items()):
            if entry.id == entry_id:
                del self._lookups[request]
        for job_id, entry in list(self._jobs.items()):
            if entry.id != entry_id:
                continue
            with contextlib.suppress(KeyError):  # gone from the queue already
                self._services.queue.cancel(job_id)
            job = self._job(job_id)
            if job is None or job.state != "running":  # a running one reports its end
                del self._jobs[job_id]
        self.status.emit(entry_id, "Cancelled", -1.0)

    def _job(self, job_id: str) -> DownloadJob | None:
        return next((j for j in self._services.queue.jobs if j.id == job_id), None)

    def _queued_job(self, entry: Recommended) -> DownloadJob | None:
        folder = _folder(entry)
        for job in self._services.queue.jobs:
            first = job.files[0].path if job.files else ""
            same = job.repo_id == entry.repo and first == entry.file and job.folder == folder
            if same and job.state in ACTIVE:
                return job
        return None

    def _use_embedder(self, entry: Recommended, path: Path, downloaded: bool) -> None:
        """Check ``path`` as an embedding model and choose it for documents; a download
        that fails the check is deleted (a file that was there already is left alone)."""
        try:
            read_embedder_info(path)
            choose_embedder(self._services.data_dir, path)
        except LamplightError as exc:
            if downloaded:
                with contextlib.suppress(OSError):
                    path.unlink()
            gone = " The downloaded file was deleted." if downloaded else ""
            self.failed.emit(entry.id, f"{entry.name} cannot be used for documents: {exc}{gone}")
            return
        except OSError as exc:  # the choice could not be written: the file itself is fine
            self.failed.emit(entry.id, f"{entry.name} could not be chosen for documents: {exc}.")
            return
        self.status.emit(entry.id, f"Installed — documents will be indexed with {entry.name}", 1.0)
        self.embedderChosen.emit(str(path))

    @staticmethod
    def _fraction(job: DownloadJob) -> float:
        return job.done_bytes / job.total_bytes if job.total_bytes else -1.0

    def _on_details(self, request: int, details: RepoDetails) -> None:
        entry = self._lookups.pop(request, None)
        if entry is None:
            return
        choice = next(
            (c for c in details.choices if c.kind == "model" and c.first_file == entry.file),
            None,
        )
        if choice is None:
            self.failed.emit(
                entry.id,
                f"{entry.repo} no longer has {entry.file} on the Hub. Search for "
                f"{entry.name} in Discover to pick another file.",
            )
            return
        try:
            job = self._services.queue.add(entry.repo, choice, details.sha, _folder(entry))
        except LamplightError as exc:
            self.failed.emit(entry.id, str(exc))
            return
        self._jobs[job.id] = entry
        projector = None if entry.is_embedder else details.projector_for(choice)
        if projector is not None:  # beside the model, so pairing finds it
            try:
                self._services.queue.add(entry.repo, projector, details.sha)
            except LamplightError as exc:
                log.warning("vision projector of %s not queued: %s", entry.repo, exc)
        self.status.emit(entry.id, "Waiting to download…", 0.0)

    def _on_failed(self, request: int, message: str) -> None:
        entry = self._lookups.pop(request, None)
        if entry is not None:
            self.failed.emit(entry.id, message)

    def _on_library(self, entries: list[LibraryEntry]) -> None:
        self._known = {
            (e.repo_id.lower(), e.path.name): e.path
            for e in entries
            if e.repo_id and e.valid and not e.is_adapter
        }

    def _on_progress(self, job: DownloadJob, rate: float, eta: object) -> None:
        entry = self._jobs.get(job.id)
        if entry is not None and job.state == "running":
            self.status.emit(entry.id, job_summary(job, rate, eta), self._fraction(job))

    def _on_job_ended(self, job: DownloadJob) -> None:
        entry = self._jobs.get(job.id)
        if entry is None:
            return
        if job.state == "paused":
            self.status.emit(entry.id, "Paused", self._fraction(job))
            return
        del self._jobs[job.id]
        if job.state == "done" and entry.is_embedder:
            self._use_embedder(entry, Path(job.result_path), downloaded=True)
        elif job.state == "done":
            self.status.emit(entry.id, "Downloaded", 1.0)
            self.ready.emit(job.result_path)
        elif job.state == "failed":
            self.failed.emit(entry.id, job.error or "The download failed.")
        else:
            self.status.emit(entry.id, "Cancelled", -1.0)


def _folder(entry: Recommended) -> str:
    """The download queue folder ``entry`` goes to ("": the models folder)."""
    return EMBEDDERS if entry.is_embedder else ""


def job_summary(job: DownloadJob, rate: float, eta: Any) -> str:
    """Speed and time left, for the downloads list."""
    if job.state != "running":
        return job.error or job.state
    parts = [f"{rate / 1e6:.1f} MB/s" if rate else "starting…"]
    if isinstance(eta, float):
        minutes, seconds = divmod(int(eta), 60)
        parts.append(f"{minutes}:{seconds:02d} left")
    return " · ".join(parts)
