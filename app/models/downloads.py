"""The download queue: jobs that survive restarts, run one at a time by a worker thread."""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from app.models.downloader import (
    Control,
    DownloadCancelled,
    DownloadError,
    FileFetcher,
    safe_destination,
)
from app.models.quant import GgufChoice, RepoFile
from app.util.atomic import atomic_write_text

log = logging.getLogger(__name__)

STATES = ("queued", "running", "paused", "done", "failed", "cancelled")


def repo_dir_name(repo_id: str) -> str:
    """``owner/name`` as one directory name (the library maps it back)."""
    return repo_id.replace("/", "__")


@dataclass
class DownloadJob:
    """One model (all parts of a split GGUF) to download."""

    repo_id: str
    name: str
    files: list[RepoFile]
    revision: str = "main"
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    state: str = "queued"
    done_bytes: int = 0
    error: str = ""
    result_path: str = ""

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


class SpeedMeter:
    """Bytes per second over the last few seconds, and the time left."""

    def __init__(self, window: float = 3.0) -> None:
        self.window = window
        self._samples: list[tuple[float, int]] = []

    def add(self, done: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self._samples.append((now, done))
        while len(self._samples) > 2 and now - self._samples[0][0] > self.window:
            self._samples.pop(0)

    def rate(self) -> float:
        if len(self._samples) < 2:
            return 0.0
        (t0, b0), (t1, b1) = self._samples[0], self._samples[-1]
        return (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0

    def eta(self, remaining: int) -> float | None:
        r = self.rate()
        return remaining / r if r > 0 else None


Progress = Callable[[DownloadJob], None]


class DownloadQueue:
    """Thread-safe list of jobs, saved to ``state_file`` on every change.

    One worker thread calls :meth:`run_next` in a loop; the GUI thread adds,
    pauses, resumes and cancels. A job that was running when the app stopped
    is queued again at start, and resumes from its ``.part`` files.
    """

    def __init__(self, models_dir: Path, state_file: Path, fetcher: FileFetcher) -> None:
        self.models_dir = models_dir
        self.state_file = state_file
        self.fetcher = fetcher
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._controls: dict[str, Control] = {}
        self._closed = False
        self.jobs: list[DownloadJob] = self._load()

    # -- GUI side --------------------------------------------------------------------

    def add(self, repo_id: str, choice: GgufChoice, revision: str = "main") -> DownloadJob:
        """Queue ``choice``; file names are checked before anything is fetched."""
        root = self.models_dir / repo_dir_name(repo_id)
        for f in choice.files:
            safe_destination(root, f.path)  # raises DownloadError for a hostile name
        job = DownloadJob(repo_id, choice.name, list(choice.files), revision)
        with self._wake:
            self.jobs.append(job)
            self._save()
            self._wake.notify_all()
        return job

    def pause(self, job_id: str) -> None:
        with self._wake:
            job = self._job(job_id)
            if job.state == "queued":
                job.state = "paused"
                self._save()
            elif job.state == "running":
                self._controls[job_id].pause.set()

    def resume(self, job_id: str) -> None:
        with self._wake:
            job = self._job(job_id)
            if job.state in ("paused", "failed"):
                job.state, job.error = "queued", ""
                self._save()
                self._wake.notify_all()

    def cancel(self, job_id: str) -> None:
        """Stop and delete the partial files (a finished model stays)."""
        with self._wake:
            job = self._job(job_id)
            if job.state == "running":
                self._controls[job_id].cancel.set()
                return
            if job.state in ("queued", "paused", "failed"):
                job.state = "cancelled"
                self._remove_parts(job)
                self._save()

    def close(self) -> None:
        """Pause the running job and wake the worker so it can return."""
        with self._wake:
            self._closed = True
            for c in self._controls.values():
                c.pause.set()
            self._wake.notify_all()

    # -- worker side -----------------------------------------------------------------

    def wait_for_job(self, timeout: float) -> DownloadJob | None:
        """The next queued job (now ``running``), or None after ``timeout`` or close()."""
        with self._wake:
            deadline = time.monotonic() + timeout
            while not self._closed:
                job = next((j for j in self.jobs if j.state == "queued"), None)
                if job is not None:
                    job.state = "running"
                    self._controls[job.id] = Control.new()
                    self._save()
                    return job
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._wake.wait(left)
            return None

    def run(self, job: DownloadJob, progress: Progress) -> None:
        """Fetch every file of ``job``; its final state says how it ended."""
        control = self._controls[job.id]
        root = self.models_dir / repo_dir_name(job.repo_id)
        finished = 0
        try:
            for f in job.files:
                dest = safe_destination(root, f.path)

                def on_bytes(done: int, _total: int, base: int = finished) -> None:
                    job.done_bytes = base + done
                    progress(job)

                self.fetcher.fetch(
                    job.repo_id, f.path, dest, f.size, f.sha256, control, on_bytes, job.revision
                )
                finished += f.size
                job.done_bytes = finished
            job.result_path = str(safe_destination(root, job.files[0].path))
            self._finish(job, "done")
        except DownloadCancelled:
            if control.cancel.is_set():
                self._remove_parts(job)
                self._finish(job, "cancelled")
            else:
                self._finish(job, "paused")
        except DownloadError as exc:
            self._finish(job, "failed", str(exc))
        except Exception as exc:  # the queue must outlive any one download
            log.exception("download %s failed", job.name)
            self._finish(job, "failed", f"{job.name}: {exc}")
        progress(job)

    def run_next(self, progress: Progress, timeout: float = 0.5) -> DownloadJob | None:
        job = self.wait_for_job(timeout)
        if job is not None:
            self.run(job, progress)
        return job

    # -- internals ---------------------------------------------------------------------

    def _finish(self, job: DownloadJob, state: str, error: str = "") -> None:
        with self._wake:
            job.state, job.error = state, error
            self._controls.pop(job.id, None)
            self._save()

    def _job(self, job_id: str) -> DownloadJob:
        for j in self.jobs:
            if j.id == job_id:
                return j
        raise KeyError(job_id)

    def _remove_parts(self, job: DownloadJob) -> None:
        root = self.models_dir / repo_dir_name(job.repo_id)
        for f in job.files:
            try:
                dest = safe_destination(root, f.path)
            except DownloadError:
                continue
            part = dest.with_name(dest.name + ".part")
            part.unlink(missing_ok=True)
        job.done_bytes = 0

    def _save(self) -> None:
        data = [
            {**asdict(j), "files": [asdict(f) for f in j.files]}
            for j in self.jobs
            if j.state != "cancelled"
        ]
        try:
            atomic_write_text(self.state_file, json.dumps({"version": 1, "jobs": data}))
        except OSError as exc:
            log.warning("download list not saved: %s", exc)

    def _load(self) -> list[DownloadJob]:
        try:
            data = json.loads(self.state_file.read_text(encoding="utf-8"))
            raw_jobs: list[Any] = data["jobs"]
        except (OSError, ValueError, KeyError, TypeError):
            return []
        jobs = []
        for raw in raw_jobs:
            try:
                files = [
                    RepoFile(str(f["path"]), int(f["size"]), f.get("sha256")) for f in raw["files"]
                ]
                job = DownloadJob(
                    str(raw["repo_id"]),
                    str(raw["name"]),
                    files,
                    str(raw.get("revision", "main")),
                    str(raw["id"]),
                    str(raw.get("state", "queued")),
                    int(raw.get("done_bytes", 0)),
                    str(raw.get("error", "")),
                    str(raw.get("result_path", "")),
                )
            except (KeyError, TypeError, ValueError):
                continue
            if job.state == "running":
                job.state = "queued"  # the app stopped mid-download: carry on from the .part
            if job.state in STATES:
                jobs.append(job)
        return jobs
