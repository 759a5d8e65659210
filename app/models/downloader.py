"""Resumable, verified downloads of Hub files into the models directory.

``huggingface_hub`` gives the URL, the auth headers and the error types; the
transfer is ours: HTTP Range requests into ``<name>.part``, which survives a
dropped connection, a pause, a crash, a full disk or a restart. The sha256 is
computed as bytes are written, over exactly the bytes the part holds (after a
restart, or whenever the part on disk and the hash disagree, the part is hashed
again), and only a file whose hash matches the Hub's LFS sha256 is renamed
into place. Paths come from ``app.models.names.destination``.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import logging
import os
import re
import shutil
import socket
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.util.errors import LamplightError
from app.util.sysinfo import size_text

log = logging.getLogger(__name__)

CHUNK = 1024 * 1024
SPACE_MARGIN = 64 * 1024 * 1024
PART_SUFFIX = ".part"
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)", re.IGNORECASE)
_DISK_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


class DownloadError(LamplightError):
    """A download that cannot go on; the message says what to do."""


class DownloadCancelled(LamplightError):
    """The user cancelled or paused the download."""


@dataclass
class Control:
    """Set from any thread to pause or cancel a running download.

    ``request_pause`` and ``request_cancel`` also shut down the sockets of the
    running transfer, so a read blocked on a stalled server returns at once
    instead of after the read timeout.
    """

    pause: threading.Event
    cancel: threading.Event
    _sockets: set[socket.socket] = field(default_factory=set, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def new(cls) -> Control:
        return cls(threading.Event(), threading.Event())

    def stopped(self) -> bool:
        return self.pause.is_set() or self.cancel.is_set()

    def request_pause(self) -> None:
        self.pause.set()
        self.interrupt()

    def request_cancel(self) -> None:
        self.cancel.set()
        self.interrupt()

    def interrupt(self) -> None:
        """Wake the downloading thread out of any blocking read (any thread)."""
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            _shutdown(sock)

    def attach(self, sock: socket.socket) -> None:
        """The download thread uses ``sock`` now; a stop already asked for closes it."""
        with self._lock:
            self._sockets.add(sock)
        if self.stopped():
            _shutdown(sock)

    def detach_all(self) -> None:
        with self._lock:
            self._sockets.clear()


def _shutdown(sock: socket.socket) -> None:
    # shutdown(), not close(): it wakes a recv() blocked in another thread on every OS,
    # and leaves the file descriptor to its owner (httpcore) to close.
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


ProgressFn = Callable[[int, int], None]
"""(bytes on disk, total bytes) for the file being fetched."""


@dataclass
class PartState:
    """How many bytes ``<name>.part`` holds and a sha256 that has seen exactly them."""

    done: int = 0
    hasher: Any = field(default_factory=hashlib.sha256)

    def restart(self) -> None:
        """Back to byte 0 with a new hasher (``hashlib`` objects cannot be reset)."""
        self.done = 0
        self.hasher = hashlib.sha256()


def explain_http_error(exc: BaseException, what: str) -> str:
    """A message a person can act on, for the library's HTTP errors."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
    )

    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(exc, GatedRepoError) or status in (401, 403):
        if status == 403:
            return (
                f"{what}: your Hugging Face token does not give access. Accept the model's "
                "terms on its Hub page with the same account, or use a token with read access."
            )
        return (
            f"{what} is gated or private: sign in with a Hugging Face token "
            "(run `hf auth login`, or set HF_TOKEN) after accepting its terms on the Hub."
        )
    if isinstance(exc, RepositoryNotFoundError | EntryNotFoundError) or status == 404:
        return f"{what} was not found on the Hub (renamed or deleted?)."
    if isinstance(exc, HfHubHTTPError):
        return f"{what}: the Hub answered {status or 'with an error'}."
    return f"{what}: {exc}"


class FileFetcher:
    """Downloads one file with resume, retries and verification. Thread-agnostic."""

    def __init__(
        self,
        endpoint: str | None = None,
        token: str | bool | None = None,
        read_timeout: float = 30.0,
        max_attempts: int = 8,
        free_space: Callable[[Path], int] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.endpoint = endpoint
        self.token = token
        self.read_timeout = read_timeout
        self.max_attempts = max_attempts
        self.free_space = free_space or (lambda p: shutil.disk_usage(p).free)
        self._sleep = sleep
        # Kept between calls: a paused download resumes without re-hashing its part.
        self._states: dict[Path, PartState] = {}

    def fetch(
        self,
        repo_id: str,
        path: str,
        dest: Path,
        size: int,
        sha256: str | None,
        control: Control,
        progress: ProgressFn | None = None,
        revision: str = "main",
    ) -> Path:
        """Fetch ``path`` of ``repo_id`` to ``dest`` (created only once verified).

        Raises:
            DownloadError: not found, no access, disk full, checksum mismatch, gave up.
                A full disk keeps the part: resuming after freeing space carries on.
            DownloadCancelled: ``control`` asked to pause or cancel (the part is kept
                on pause, deleted on cancel).
        """
        from huggingface_hub import hf_hub_url
        from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]

        if size < 0:
            raise DownloadError(f"{dest.name}: the Hub lists a negative size ({size}).")
        try:
            if dest.exists() and dest.stat().st_size == size:
                return dest
            dest.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _local_error(exc, dest, 0) from exc
        part = dest.with_name(dest.name + PART_SUFFIX)
        state = self._resume_state(part, size, control)
        need = size - state.done
        free = self.free_space(dest.parent)
        if need + SPACE_MARGIN > free:
            self._states[part] = state
            raise DownloadError(
                f"Not enough disk space for {dest.name}: it needs {size_text(need)} more and "
                f"{size_text(free)} is free in {dest.parent}."
            )
        url = hf_hub_url(repo_id, path, revision=revision, endpoint=self.endpoint)
        headers = build_hf_headers(token=self.token)
        attempt = 0
        while state.done < size:
            if control.cancel.is_set():
                self._discard(part)
                raise DownloadCancelled("cancelled")
            if control.pause.is_set():
                self._states[part] = state
                raise DownloadCancelled("paused")
            if _size_of(part) != state.done:  # changed behind our back: trust the disk
                state = self._resume_state(part, size, control, reuse=False)
            before = state.done
            try:
                self._stream(url, headers, part, state, size, control, progress)
            except DownloadError:
                if part.exists():
                    self._states[part] = state
                raise
            except Exception as exc:
                if control.stopped():
                    continue  # interrupted on purpose: the top of the loop says how
                if self._is_final(exc):
                    self._states[part] = state
                    raise DownloadError(explain_http_error(exc, f"{repo_id}/{path}")) from exc
                error: BaseException | None = exc
            else:
                error = None
                if state.done >= size:
                    break
            # A stream that ended early, or failed, is a try; one that moved forward
            # starts the count again.
            attempt = 0 if state.done > before else attempt + 1
            if attempt >= self.max_attempts:
                self._states[part] = state
                why = f" ({error})" if error else " (the server kept ending the file early)"
                raise DownloadError(
                    f"Gave up on {dest.name} after {attempt} tries{why}; "
                    "resume it later: what was downloaded is kept."
                ) from error
            if attempt:
                wait = min(0.5 * 2 ** (attempt - 1), 15.0)
                log.info("download %s: %s; retry %d in %.1fs", path, error, attempt, wait)
                self._wait(wait, control)
        self._states.pop(part, None)
        digest = state.hasher.hexdigest()
        if state.done != size:
            self._discard(part)
            raise DownloadError(f"{dest.name}: got {state.done:,} bytes, expected {size:,}.")
        if sha256 and digest != sha256.lower():
            self._discard(part)
            raise DownloadError(
                f"{dest.name} did not match the Hub's checksum (got {digest[:12]}…, expected "
                f"{sha256[:12]}…). The damaged download was deleted; try again."
            )
        try:
            os.replace(part, dest)
        except OSError as exc:
            raise _local_error(exc, dest, state.done) from exc
        return dest

    def _resume_state(
        self, part: Path, size: int, control: Control, reuse: bool = True
    ) -> PartState:
        """The bytes in ``part`` and a sha256 that has seen exactly them.

        A state kept from an earlier call is used only if the part still has its
        length; otherwise the part is hashed again (stopping early if asked to).
        """
        on_disk = _size_of(part)
        if on_disk > size:
            self._discard(part)
            on_disk = 0
        kept = self._states.pop(part, None)
        if reuse and kept is not None and kept.done == on_disk:
            return kept
        state = PartState()
        if on_disk:
            # After a restart: hash what is there once, then carry on from its end.
            try:
                with part.open("rb") as fh:
                    while block := fh.read(CHUNK):
                        if control.stopped():
                            raise DownloadCancelled("paused")
                        state.hasher.update(block)
                        state.done += len(block)
            except OSError as exc:
                raise _local_error(exc, part, 0) from exc
        return state

    def _stream(
        self,
        url: str,
        headers: dict[str, str],
        part: Path,
        state: PartState,
        size: int,
        control: Control,
        progress: ProgressFn | None,
    ) -> None:
        import httpx2
        from huggingface_hub import get_session, hf_raise_for_status

        # control.interrupt() cuts the sockets this request uses: those it opens (seen by
        # the trace below, redirects to the CDN included) and the one the response came
        # on. "Connection: close" keeps download connections out of the pool, so a later
        # request never waits on one of them without the trace seeing it.
        request_headers = {**headers, "Connection": "close"}
        if state.done:
            request_headers["Range"] = f"bytes={state.done}-"

        def trace(event: str, info: dict[str, Any]) -> None:
            stream: Any = info.get("return_value")
            if event.endswith(".complete") and hasattr(stream, "get_extra_info"):
                sock = stream.get_extra_info("socket")
                if isinstance(sock, socket.socket):
                    control.attach(sock)

        timeout = httpx2.Timeout(10.0, read=self.read_timeout)
        try:
            with get_session().stream(
                "GET",
                url,
                headers=request_headers,
                timeout=timeout,
                follow_redirects=True,
                extensions={"trace": trace},
            ) as response:
                stream = response.extensions.get("network_stream")
                sock = stream.get_extra_info("socket") if stream is not None else None
                if isinstance(sock, socket.socket):
                    control.attach(sock)
                if response.status_code == 416 and state.done:
                    if state.done == size:
                        return
                    # Our part is longer than the file the server has now: start over.
                    log.info("server has less than %d bytes of %s; restarting", state.done, url)
                    self._discard(part)
                    state.restart()
                    return
                hf_raise_for_status(response)
                if state.done and not self._continues(response, part, state.done, size):
                    # The server ignored the Range (or answered another one): start over
                    # with a new hasher rather than append a second copy.
                    log.info("server did not resume %s at %d; restarting", url, state.done)
                    state.restart()
                self._write_body(response.iter_bytes(), part, state, size, control, progress)
        finally:
            control.detach_all()

    def _continues(self, response: Any, part: Path, done: int, size: int) -> bool:
        """Whether ``response`` is the rest of the file from byte ``done``."""
        if response.status_code != 206:
            return False
        match = _CONTENT_RANGE.fullmatch(response.headers.get("Content-Range", "").strip())
        if match is None:
            return True  # 206 without a usable Content-Range: it answered our one range
        total = match[3]
        if total != "*" and int(total) != size:
            self._discard(part)
            raise DownloadError(
                f"The file on the Hub changed while downloading ({int(total):,} bytes, "
                f"expected {size:,}); start the download again."
            )
        return int(match[1]) == done

    def _write_body(
        self,
        blocks: Any,
        part: Path,
        state: PartState,
        size: int,
        control: Control,
        progress: ProgressFn | None,
    ) -> None:
        """Append ``blocks`` at ``state.done``, hashing exactly what the disk accepted."""
        try:
            # Unbuffered: each write() reports how much reached the file, so a short
            # write or a full disk leaves the part and the hash in step.
            fh = part.open("r+b" if state.done else "wb", buffering=0)
        except OSError as exc:
            raise _local_error(exc, part, state.done) from exc
        with fh:
            try:
                if state.done:
                    fh.truncate(state.done)
                    fh.seek(state.done)
            except OSError as exc:
                raise _local_error(exc, part, state.done) from exc
            # Network-sized pieces, not 1 MiB ones: a dropped connection then loses
            # nothing already received.
            too_long = False
            for block in blocks:
                if state.done + len(block) > size:
                    too_long = True
                    break
                self._write_all(fh, block, part, state)
                if progress:
                    progress(state.done, size)
                if control.stopped():
                    break
            try:
                os.fsync(fh.fileno())
            except OSError as exc:
                # What the kernel dropped is unknown: forget the hash, so that the next
                # try hashes what the disk really holds.
                state.restart()
                raise _local_error(exc, part, _size_of(part)) from exc
        if too_long:
            self._discard(part)
            raise DownloadError(
                f"The server sent more than the {size:,} bytes the Hub lists for "
                f"{part.name.removesuffix(PART_SUFFIX)}; it may have changed. "
                "Start the download again."
            )

    def _write_all(self, fh: io.RawIOBase, block: bytes, part: Path, state: PartState) -> None:
        view = memoryview(block)
        while view:
            try:
                n = self._write(fh, view)
            except OSError as exc:
                raise _local_error(exc, part, state.done) from exc
            if not n:
                raise _local_error(OSError(errno.ENOSPC, "no byte written"), part, state.done)
            state.hasher.update(view[:n])
            state.done += n
            view = view[n:]

    def _write(self, fh: io.RawIOBase, data: memoryview) -> int | None:
        """One write to the part; may write less than ``data`` (tests replace it)."""
        return fh.write(data)

    @staticmethod
    def _is_final(exc: BaseException) -> bool:
        """HTTP errors that retrying cannot fix (auth, not found, bad request)."""
        status = getattr(getattr(exc, "response", None), "status_code", None)
        return status is not None and 400 <= status < 500 and status not in (408, 429)

    def _wait(self, seconds: float, control: Control) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end and not control.stopped():
            self._sleep(min(0.1, end - time.monotonic()))

    def _discard(self, part: Path) -> None:
        self._states.pop(part, None)
        with contextlib.suppress(FileNotFoundError):
            part.unlink()


def _size_of(path: Path) -> int:
    """Bytes in the part file (0 if there is none); something else in its place is refused.

    A FIFO or a device where the part belongs would block the first read or write.
    """
    try:
        st = path.stat()
    except FileNotFoundError:
        return 0
    except OSError as exc:
        raise _local_error(exc, path, 0) from exc
    if not stat.S_ISREG(st.st_mode):
        raise DownloadError(f"{path} is not a regular file; move it away and resume.")
    return st.st_size


def _local_error(exc: OSError, path: Path, kept: int) -> DownloadError:
    """A message for a failure of the local disk (never retried like a network error)."""
    if exc.errno in _DISK_FULL:
        return DownloadError(
            f"Disk full while writing {path.name} in {path.parent}. The {size_text(kept)} "
            "downloaded so far are kept: free some space and resume."
        )
    return DownloadError(f"Could not write {path}: {exc.strerror or exc}.")
