"""The download queue: jobs that survive restarts, run one at a time by a worker thread."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import unicodedata
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from app.models.download_control import Control
from app.models.download_errors import DownloadCancelled, DownloadError
from app.models.downloader import FileFetcher
from app.models.names import (
    UnsafeNameError,
    check_file_name,
    check_path_length,
    check_repo_id,
    destination,
)
from app.models.part_file import PART_SUFFIX
from app.models.quant import GgufChoice, RepoFile
from app.util.atomic import atomic_write_text
from app.util.datafiles import DataFileError, read_json, set_aside

__all__ = ["DownloadJob", "DownloadQueue", "SpeedMeter", "target_key"]

log = logging.getLogger(__name__)

STATES = ("queued", "running", "paused", "done", "failed", "cancelled")
# Jobs that own their files' ``.part``: the one writer of those targets.
ACTIVE = ("queued", "running", "paused", "failed")
MAX_STATE_BYTES = 16 * 1024 * 1024  # downloads.json: far more than any real queue
MAX_JOBS = 10_000
MAX_FILES_PER_JOB = 10_000
_SHA256 = frozenset("0123456789abcdef")
# A named destination folder ("embedders"); the name, never a path, is what is saved.
_FOLDER_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")


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
    folder: str = ""  # "": the models folder (owner__name/file); else a named folder (flat)

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

    def __init__(
        self,
        models_dir: Path,
        state_file: Path,
        fetcher: FileFetcher,
        folders: Mapping[str, Path] | None = None,
    ) -> None:
        """``folders``: other destinations a job may name (``{"embedders": <data>/embedders}``);
        more can be added with :meth:`add_folder`. A saved job naming a folder not known is
        kept, and fails with a message when it runs."""
        self.models_dir = models_dir
        self.state_file = state_file
        self.fetcher = fetcher
        self._lock = threading.Lock()
        self.folders: dict[str, Path] = {}
        for name, path in (folders or {}).items():
            self.add_folder(name, path)
        self._wake = threading.Condition(self._lock)
        self._controls: dict[str, Control] = {}
        self._closed = False
        self.notes: list[str] = []  # what was wrong with the saved list, for the user
        self.jobs: list[DownloadJob] = self._load()

    # -- GUI side --------------------------------------------------------------------

    def add_folder(self, name: str, path: Path) -> None:
        """Let jobs download into ``path`` by naming it ``name`` (a short lowercase word)."""
        if not _FOLDER_NAME.fullmatch(name):
            raise ValueError(f"not a download folder name: {name!r}")
        with self._lock:
            self.folders[name] = path

    def add(
        self, repo_id: str, choice: GgufChoice, revision: str = "main", folder: str = ""
    ) -> DownloadJob:
        """Queue ``choice``; the repo id and file names are checked before anything is fetched.

        ``folder``: "" for the models folder (``owner__name/file``), else the name of a
        folder given to the queue, where the files go side by side (``folder/file``).

        One writer per file: a request for exactly the files of a job in the list (the
        repo id in any case, the same revision) is that job, resumed if it was paused or
        had failed; any other request for a file a job in the list writes is refused.

        Raises:
            UnsafeNameError: (a ``DownloadError``) a hostile or unusable name.
            DownloadError: a file of ``choice`` is being downloaded by another job.
        """
        if not choice.files:
            raise DownloadError(f"{choice.name}: nothing to download.")
        if folder and folder not in self.folders:
            raise DownloadError(f"{choice.name}: there is no download folder named {folder!r}.")
        keys = [target_key(self._destination(folder, repo_id, f.path)) for f in choice.files]
        if len(set(keys)) != len(keys):
            raise DownloadError(f"{choice.name}: the Hub lists one of its files twice.")
        with self._wake:
            for other in self.jobs:
                if other.state not in ACTIVE:
                    continue
                theirs = self._target_keys(other)
                shared = [f.path for f, k in zip(choice.files, keys, strict=True) if k in theirs]
                if not shared:
                    continue
                if list(theirs) == keys and other.revision == revision and other.folder == folder:
                    if other.state in ("paused", "failed"):
                        other.state, other.error = "queued", ""
                        self._save()
                        self._wake.notify_all()
                    return other
                raise DownloadError(
                    f"{shared[0]} is already being downloaded ({other.repo_id} · {other.name}, "
                    f"{other.state}); cancel that download first, or wait for it to finish."
                )
            job = DownloadJob(repo_id, choice.name, list(choice.files), revision, folder=folder)
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
                self._controls[job_id].request_pause()

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
                self._controls[job_id].request_cancel()
                return
            if job.state in ("queued", "paused", "failed"):
                job.state = "cancelled"
                self._remove_parts(job)
                self._save()

    def close(self) -> None:
        """Pause the running job and wake the worker so it can return.

        A read blocked on a stalled server is cut at once (its socket is shut down),
        so the worker returns in well under a second whatever the read timeout.
        """
        with self._wake:
            self._closed = True
            controls = list(self._controls.values())
            self._wake.notify_all()
        for c in controls:
            c.request_pause()

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
        finished = 0
        try:
            for f in job.files:
                dest = self._destination(job.folder, job.repo_id, f.path)

                def on_bytes(done: int, _total: int, base: int = finished) -> None:
                    job.done_bytes = base + done
                    progress(job)

                self.fetcher.fetch(
                    job.repo_id, f.path, dest, f.size, f.sha256, control, on_bytes, job.revision
                )
                finished += f.size
                job.done_bytes = finished
            job.result_path = str(self._destination(job.folder, job.repo_id, job.files[0].path))
            self._finish(job, "done")
        except DownloadCancelled:
            if control.cancel.is_set():
                with self._wake:
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
        """Delete ``job``'s partial files; never one that another job in the list writes.

        Called with the lock held.
        """
        taken = {
            k
            for j in self.jobs
            if j.id != job.id and j.state in ACTIVE
            for k in self._target_keys(j)
        }
        for f in job.files:
            try:
                dest = self._destination(job.folder, job.repo_id, f.path)
                if target_key(dest) in taken:
                    log.warning("not removing %s: another download writes it", dest.name)
                    continue
                dest.with_name(dest.name + PART_SUFFIX).unlink(missing_ok=True)
            except DownloadError:
                continue  # a refused name: nothing was ever written for it
            except OSError as exc:
                log.warning("partial file of %s not removed: %s", f.path, exc)
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
        """The saved jobs; a damaged list is set aside as ``.bad``, a damaged job dropped."""
        try:
            data = read_json(self.state_file, MAX_STATE_BYTES)
            raw_jobs = data.get("jobs") if isinstance(data, dict) else None
            if not isinstance(raw_jobs, list):
                raise DataFileError("has no list of jobs")
        except FileNotFoundError:
            return []
        except DataFileError as exc:
            if exc.damaged:
                try:
                    aside: object = set_aside(self.state_file)
                except OSError as err:
                    aside = f"nowhere ({err})"
                log.warning("download list %s %s; set aside as %s", self.state_file, exc, aside)
            else:
                log.warning("download list %s %s", self.state_file, exc)
            return []
        jobs = []
        taken: set[str] = set()
        for item in raw_jobs[:MAX_JOBS]:
            job = _job_from_json(item)
            if job is None:
                log.warning("dropped a damaged download entry from %s", self.state_file)
                continue
            if job.state == "running":
                job.state = "queued"  # the app stopped mid-download: carry on from the .part
            if job.state in ACTIVE:
                keys = self._target_keys(job)
                if taken & keys.keys():
                    # An older list could hold two entries for one file: one writer only.
                    self._note(
                        f"The download {job.repo_id} · {job.name} was a second entry for the "
                        "same file as another download in the list; it was left out."
                    )
                    continue
                taken |= keys.keys()
            jobs.append(job)
        return jobs

    def _target_keys(self, job: DownloadJob) -> dict[str, str]:
        """``target_key`` of each file of ``job`` (to its repo path); refused names left out."""
        keys = {}
        for f in job.files:
            try:
                keys[target_key(self._destination(job.folder, job.repo_id, f.path))] = f.path
            except DownloadError:
                continue  # never written: a refused name or a path out of the folder
        return keys

    def _destination(self, folder: str, repo_id: str, relative: str) -> Path:
        """Where a file of a job goes: ``destination`` in the models folder, or flat in a
        named folder (resolved, inside it, its ``.part`` within the path length limit).

        Raises:
            DownloadError: an unknown folder name, or a refused file name.
        """
        if not folder:
            return destination(self.models_dir, repo_id, relative)
        base = self.folders.get(folder)
        if base is None:
            raise DownloadError(
                f"This download is for a folder this version of Lamplight does not know "
                f"({folder!r}); cancel it and download the model again."
            )
        check_repo_id(repo_id)
        name = check_file_name(relative).name
        root = base.resolve()
        target = (root / name).resolve()
        if target.parent != root:
            raise UnsafeNameError(
                f"Refusing the file name {name!r}: it would be written outside {root}."
            )
        check_path_length(target, repr(name), "data folder")
        return target

    def _note(self, text: str) -> None:
        log.warning("%s", text)
        self.notes.append(text)


def target_key(path: Path) -> str:
    """What makes two download paths one file: the resolved path (``destination`` resolves
    it) with case and Unicode normalisation ignored, as on macOS and Windows (and as the
    Hub treats repo ids), so ``ACME/Model`` and ``acme/model`` are one target everywhere."""
    return unicodedata.normalize("NFC", unicodedata.normalize("NFC", str(path)).casefold())


def _job_from_json(raw: Any) -> DownloadJob | None:
    """One saved job, or None if any field has the wrong type, range or a hostile name."""
    if not isinstance(raw, dict):
        return None
    files_raw = raw.get("files")
    if not isinstance(files_raw, list) or not 0 < len(files_raw) <= MAX_FILES_PER_JOB:
        return None
    files = []
    for f in files_raw:
        if not isinstance(f, dict):
            return None
        path, size, sha = f.get("path"), f.get("size"), f.get("sha256")
        if not isinstance(path, str) or not isinstance(size, int) or not _count(size):
            return None
        if sha is not None and not (isinstance(sha, str) and _is_sha256(sha)):
            return None
        files.append(RepoFile(path, size, sha))
    defaults = (("revision", "main"), ("error", ""), ("result_path", ""), ("folder", ""))
    text = {k: raw.get(k, d) for k, d in defaults}
    repo_id, name, job_id, state = (raw.get(k) for k in ("repo_id", "name", "id", "state"))
    done = raw.get("done_bytes", 0)
    strings = (repo_id, name, job_id, state, *text.values())
    if not all(isinstance(v, str) for v in strings) or not isinstance(done, int):
        return None
    assert isinstance(repo_id, str) and isinstance(name, str) and isinstance(job_id, str)
    assert isinstance(state, str)
    if state not in STATES or not _count(done) or not job_id or len(job_id) > 64:
        return None
    if text["folder"] and not _FOLDER_NAME.fullmatch(text["folder"]):
        return None
    try:
        check_repo_id(repo_id)
        for f in files:
            check_file_name(f.path)
    except DownloadError:
        return None
    return DownloadJob(
        repo_id,
        name[:500],
        files,
        text["revision"][:200],
        job_id,
        state,
        done,
        text["error"][:2000],
        text["result_path"][:4096],
        text["folder"],
    )


def _is_sha256(text: str) -> bool:
    return len(text) == 64 and set(text) <= _SHA256


def _count(value: Any) -> bool:
    """A byte count: an int (not a bool), 0 .. 2**63 - 1."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63
