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
import io
import logging
import os
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.models.byte_ranges import WrongRange, body_range, unsatisfied_total
from app.models.download_control import Control
from app.models.download_errors import (
    DownloadCancelled,
    DownloadError,
    explain_http_error,
    local_error,
)
from app.models.part_file import PART_SUFFIX, PartState, hash_part, size_of
from app.util.sysinfo import size_text

log = logging.getLogger(__name__)

SPACE_MARGIN = 64 * 1024 * 1024


ProgressFn = Callable[[int, int], None]
"""(bytes on disk, total bytes) for the file being fetched."""


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
            raise local_error(exc, dest, 0) from exc
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
            raise local_error(exc, dest, state.done) from exc
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
            if size_of(part) != state.done:  # changed behind our back: trust the disk
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
        on_disk = size_of(part)
        if on_disk > size:
            self._discard(part)
            on_disk = 0
        kept = self._states.pop(part, None)
        if reuse and kept is not None and kept.done == on_disk:
            return kept
        return hash_part(part, control) if on_disk else PartState()

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
                    self._check_total(unsatisfied_total(response), size, part)
                    raise WrongRange(f"the server refused the byte range from {asked:,} on (416)")
                hf_raise_for_status(response)
                start, end, total = body_range(response, size)
                self._check_total(total, size, part)
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
            raise local_error(exc, part, state.done) from exc
        with fh:
            try:
                if state.done:
                    fh.truncate(state.done)
                    fh.seek(state.done)
            except OSError as exc:
                raise local_error(exc, part, state.done) from exc
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
                raise local_error(exc, part, size_of(part)) from exc
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
                raise local_error(exc, part, state.done) from exc
            if not n:
                raise local_error(OSError(errno.ENOSPC, "no byte written"), part, state.done)
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
