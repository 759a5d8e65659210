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
# RFC 9110 "bytes first-last/complete": at most 19 digits, so int() never meets a huge number.
_CONTENT_RANGE = re.compile(r"bytes[ \t]+(\d{1,19})-(\d{1,19})/(\d{1,19}|\*)", re.IGNORECASE)
_UNSATISFIED = re.compile(r"bytes[ \t]+\*/(\d{1,19})", re.IGNORECASE)
_DISK_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


class DownloadError(LamplightError):
    """A download that cannot go on; the message says what to do."""


class DownloadCancelled(LamplightError):
    """The user cancelled or paused the download."""


class WrongRange(Exception):
    """The server answered bytes that cannot be placed in the part; tried again."""


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
        max_tries: int = 1000,
        free_space: Callable[[Path], int] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.endpoint = endpoint
        self.token = token
        self.read_timeout = read_timeout
        self.max_attempts = max_attempts  # failed tries in a row
        self.max_tries = max_tries  # tries in all, per call: progress cannot reset it
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
        state = self._retrying(
            url, headers, part, state, size, control, progress, f"{repo_id}/{path}"
        )
        self._states.pop(part, None)
        self._verify(part, dest, state, size, sha256)
        try:
            os.replace(part, dest)
        except OSError as exc:
            raise _local_error(exc, dest, state.done) from exc
        return dest

    def _retrying(
        self,
        url: str,
        headers: dict[str, str],
        part: Path,
        state: PartState,
        size: int,
        control: Control,
        progress: ProgressFn | None,
        what: str,
    ) -> PartState:
        """Stream ``url`` into ``part`` until it holds ``size`` bytes, trying again after
        errors that may pass (with a growing wait); the state it ends with.

        Raises:
            DownloadError, DownloadCancelled: as ``fetch`` (the state is kept for a resume).
        """
        tries = failures = 0
        # Only bytes past the furthest point reached are progress: a try that fetched
        # again what the part already had (a server that answers from an earlier byte,
        # a restart) must not keep a hopeless download going.
        best = state.done
        ask_range = True
        while state.done < size:
            if control.cancel.is_set():
                self._discard(part)
                raise DownloadCancelled("cancelled")
            if control.pause.is_set():
                self._states[part] = state
                raise DownloadCancelled("paused")
            if _size_of(part) != state.done:  # changed behind our back: trust the disk
                state = self._resume_state(part, size, control, reuse=False)
            tries += 1
            error: BaseException | None = None
            try:
                self._stream(url, headers, part, state, size, control, progress, ask_range)
            except DownloadError:
                if part.exists():
                    self._states[part] = state
                raise
            except Exception as exc:
                if control.stopped():
                    continue  # interrupted on purpose: the top of the loop says how
                if self._is_final(exc):
                    self._states[part] = state
                    raise DownloadError(explain_http_error(exc, what)) from exc
                error = exc
                if isinstance(exc, WrongRange):
                    # This server cannot be trusted with ranges: from now on ask for the
                    # whole file and skip what the part already holds.
                    ask_range = False
            if state.done >= size:
                break
            if state.done > best:
                best, failures = state.done, 0
            else:
                failures += 1
            if failures >= self.max_attempts or tries >= self.max_tries:
                self._states[part] = state
                why = f" ({error})" if error else " (the server kept ending the file early)"
                raise DownloadError(
                    f"Gave up on {part.name.removesuffix(PART_SUFFIX)} after {tries} tries{why}; "
                    "resume it later: what was downloaded is kept."
                ) from error
            if failures:
                wait = min(0.5 * 2 ** (failures - 1), 15.0)
                log.info("download %s: %s; retry %d in %.1fs", what, error, failures, wait)
                self._wait(wait, control)
        return state

    def _verify(
        self, part: Path, dest: Path, state: PartState, size: int, sha256: str | None
    ) -> None:
        """The part is whole and matches the Hub's checksum; else it is deleted.

        Raises:
            DownloadError: it is not.
        """
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
        ask_range: bool = True,
    ) -> None:
        """One request: append what the answer adds to the part.

        Raises:
            WrongRange: the answer cannot be placed in the file (another range than
                asked, a missing or malformed ``Content-Range``, a refused range).
            DownloadError: the file on the server is not the one expected.
        """
        import httpx2
        from huggingface_hub import get_session, hf_raise_for_status

        # control.interrupt() cuts the sockets this request uses: those it opens (seen by
        # the trace below, redirects to the CDN included) and the one the response came
        # on. "Connection: close" keeps download connections out of the pool, so a later
        # request never waits on one of them without the trace seeing it.
        request_headers = {**headers, "Connection": "close"}
        asked = state.done if ask_range else 0
        if asked:
            request_headers["Range"] = f"bytes={asked}-"

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
                if response.status_code == 416 and asked:
                    # "bytes */N": a file of another size than the Hub lists, or a server
                    # that cannot serve ranges (the next try asks for the whole file).
                    self._check_total(_unsatisfied_total(response), size, part)
                    raise WrongRange(f"the server refused the byte range from {asked:,} on (416)")
                hf_raise_for_status(response)
                start, end = self._placed(response, asked, size, part)
                if start > state.done:
                    wanted = f"bytes from {asked:,} on" if asked else "the whole file"
                    raise WrongRange(
                        f"the server sent bytes {start:,}-{end - 1:,} when asked for {wanted}: "
                        "it does not serve byte ranges correctly"
                    )
                # An answer from an earlier byte (a proxy or CDN that aligns ranges, or a
                # 200 with the whole file): skip what the part already holds.
                skip = state.done - start
                self._write_body(
                    response.iter_bytes(), part, state, size, control, progress, skip, end
                )
        finally:
            control.detach_all()

    def _placed(self, response: Any, asked: int, size: int, part: Path) -> tuple[int, int]:
        """Where the body of ``response`` lies in the file: ``(start, end_exclusive)``.

        Raises:
            WrongRange: a status other than 200/206, or a 206 whose ``Content-Range`` is
                missing, malformed or impossible.
            DownloadError: the ``Content-Range`` speaks of a file of another size.
        """
        status = response.status_code
        if status == 200:
            return 0, size
        if status != 206:
            raise WrongRange(f"the server answered {status} to a request for a byte range")
        text = str(response.headers.get("Content-Range", ""))
        match = _CONTENT_RANGE.fullmatch(text.strip())
        if match is None:
            shown = ascii(text[:60]) if text else "none"
            raise WrongRange(
                f"the server answered a byte range without a usable Content-Range ({shown})"
            )
        first, last = int(match[1]), int(match[2])
        total = None if match[3] == "*" else int(match[3])
        if first > last or last >= (size if total is None else total):
            raise WrongRange(f"the server answered an impossible byte range ({text[:60]!a})")
        self._check_total(total, size, part)
        return first, last + 1

    def _check_total(self, total: int | None, size: int, part: Path) -> None:
        if total is not None and total != size:
            self._discard(part)
            raise DownloadError(
                f"The file on the Hub changed while downloading ({total:,} bytes, "
                f"expected {size:,}); start the download again."
            )

    def _write_body(
        self,
        blocks: Any,
        part: Path,
        state: PartState,
        size: int,
        control: Control,
        progress: ProgressFn | None,
        skip: int = 0,
        end: int | None = None,
    ) -> None:
        """Append ``blocks`` at ``state.done``, hashing exactly what the disk accepted.

        The first ``skip`` bytes are dropped (the part holds them already); nothing is
        written past byte ``end`` (the end of the range the server declared).
        """
        end = size if end is None else min(end, size)
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
                if control.stopped():
                    break
                if skip:
                    if len(block) <= skip:
                        skip -= len(block)
                        continue
                    block, skip = block[skip:], 0
                if state.done + len(block) > end:
                    if end == size:
                        too_long = True
                        break
                    # More than the range it declared: keep the range, drop the rest.
                    self._write_all(fh, block[: end - state.done], part, state)
                    break
                self._write_all(fh, block, part, state)
                if progress:
                    progress(state.done, size)
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
        # Counted in steps, not against the clock: a test's no-op sleep returns at once.
        left = seconds
        while left > 0 and not control.stopped():
            step = min(0.1, left)
            self._sleep(step)
            left -= step

    def _discard(self, part: Path) -> None:
        self._states.pop(part, None)
        with contextlib.suppress(FileNotFoundError):
            part.unlink()


def _unsatisfied_total(response: Any) -> int | None:
    """The file size a 416 answer states (``Content-Range: bytes */N``), if it states one."""
    match = _UNSATISFIED.fullmatch(str(response.headers.get("Content-Range", "")).strip())
    return int(match[1]) if match else None


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
