"""Resumable, verified downloads of Hub files into the models directory.

``huggingface_hub`` gives the URL, the auth headers and the error types; the
transfer is ours: HTTP Range requests into ``<name>.part``, which survives a
dropped connection, a pause, a crash or a restart. The sha256 is computed as
bytes arrive (after a restart, the part on disk is hashed once), and only a
file whose hash matches the Hub's LFS sha256 is renamed into place.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from app.util.errors import LamplightError
from app.util.sysinfo import size_text

log = logging.getLogger(__name__)

CHUNK = 1024 * 1024
SPACE_MARGIN = 64 * 1024 * 1024
PART_SUFFIX = ".part"


class DownloadError(LamplightError):
    """A download that cannot go on; the message says what to do."""


class DownloadCancelled(LamplightError):
    """The user cancelled or paused the download."""


@dataclass
class Control:
    """Set from any thread to pause or cancel a running download."""

    pause: threading.Event
    cancel: threading.Event

    @classmethod
    def new(cls) -> Control:
        return cls(threading.Event(), threading.Event())

    def stopped(self) -> bool:
        return self.pause.is_set() or self.cancel.is_set()


ProgressFn = Callable[[int, int], None]
"""(bytes on disk, total bytes) for the file being fetched."""


def safe_destination(root: Path, relative: str) -> Path:
    """``root / relative``, refusing names that could write anywhere else.

    Raises:
        DownloadError: an absolute path, a ``..`` part, a drive or a backslash.
    """
    if not relative or "\\" in relative or "\0" in relative or ":" in relative:
        raise DownloadError(f"Refusing the file name {relative!r} from the Hub.")
    pure = PurePosixPath(relative)
    if pure.is_absolute() or any(part in ("..", ".", "") for part in pure.parts):
        raise DownloadError(f"Refusing the file name {relative!r} from the Hub.")
    target = (root / Path(*pure.parts)).resolve()
    if not target.is_relative_to(root.resolve()):
        raise DownloadError(f"Refusing the file name {relative!r} from the Hub.")
    return target


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
        self._hashers: dict[Path, tuple[int, Any]] = {}

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
            DownloadError: not found, no access, no space, checksum mismatch, gave up.
            DownloadCancelled: ``control`` asked to pause or cancel (the part is kept
                on pause, deleted on cancel).
        """
        from huggingface_hub import hf_hub_url
        from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]

        if dest.exists() and dest.stat().st_size == size:
            return dest
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = dest.with_name(dest.name + PART_SUFFIX)
        done, hasher = self._resume_state(part, size)
        need = size - done
        free = self.free_space(dest.parent)
        if need + SPACE_MARGIN > free:
            raise DownloadError(
                f"Not enough disk space for {dest.name}: it needs {size_text(need)} more and "
                f"{size_text(free)} is free in {dest.parent}."
            )
        url = hf_hub_url(repo_id, path, revision=revision, endpoint=self.endpoint)
        headers = build_hf_headers(token=self.token)
        attempt = 0
        while done < size:
            if control.cancel.is_set():
                self._discard(part)
                raise DownloadCancelled("cancelled")
            if control.pause.is_set():
                self._hashers[part] = (done, hasher)
                raise DownloadCancelled("paused")
            try:
                done = self._stream(url, headers, part, done, size, hasher, control, progress)
                attempt = 0 if done < size else attempt
            except DownloadError:
                raise
            except Exception as exc:
                if self._is_final(exc):
                    raise DownloadError(explain_http_error(exc, f"{repo_id}/{path}")) from exc
                attempt += 1
                if attempt >= self.max_attempts:
                    self._hashers[part] = (done, hasher)
                    raise DownloadError(
                        f"Gave up on {dest.name} after {attempt} tries ({exc}); "
                        "resume it later: what was downloaded is kept."
                    ) from exc
                wait = min(0.5 * 2 ** (attempt - 1), 15.0)
                log.info("download %s: %s; retry %d in %.1fs", path, exc, attempt, wait)
                self._wait(wait, control)
                done = part.stat().st_size if part.exists() else 0
        self._hashers.pop(part, None)
        digest = hasher.hexdigest()
        if sha256 and digest != sha256.lower():
            self._discard(part)
            raise DownloadError(
                f"{dest.name} did not match the Hub's checksum (got {digest[:12]}…, expected "
                f"{sha256[:12]}…). The damaged download was deleted; try again."
            )
        if done != size:
            self._discard(part)
            raise DownloadError(f"{dest.name}: got {done:,} bytes, expected {size:,}.")
        os.replace(part, dest)
        return dest

    def _resume_state(self, part: Path, size: int) -> tuple[int, Any]:
        """Bytes already in ``part`` and a sha256 that has seen exactly them."""
        on_disk = part.stat().st_size if part.exists() else 0
        if on_disk > size:
            self._discard(part)
            on_disk = 0
        kept = self._hashers.get(part)
        if kept is not None and kept[0] == on_disk:
            return kept
        hasher = hashlib.sha256()
        if on_disk:
            # After a restart: hash what is there once, then carry on from its end.
            with part.open("rb") as fh:
                while block := fh.read(CHUNK):
                    hasher.update(block)
        return on_disk, hasher

    def _stream(
        self,
        url: str,
        headers: dict[str, str],
        part: Path,
        done: int,
        size: int,
        hasher: Any,
        control: Control,
        progress: ProgressFn | None,
    ) -> int:
        import httpx2
        from huggingface_hub import get_session, hf_raise_for_status

        request_headers = dict(headers)
        if done:
            request_headers["Range"] = f"bytes={done}-"
        timeout = httpx2.Timeout(10.0, read=self.read_timeout)
        with get_session().stream(
            "GET", url, headers=request_headers, timeout=timeout, follow_redirects=True
        ) as response:
            if response.status_code == 416 and done == size:
                return done
            hf_raise_for_status(response)
            if done and response.status_code != 206:
                # The server ignored the Range: start over rather than append a second copy.
                log.info("server ignored Range for %s; restarting", url)
                done = 0
                hasher.__init__()
                part.unlink(missing_ok=True)
            mode = "ab" if done else "wb"
            with part.open(mode) as fh:
                # Network-sized pieces, not 1 MiB ones: a dropped connection then loses
                # nothing already received.
                for block in response.iter_bytes():
                    fh.write(block)
                    hasher.update(block)
                    done += len(block)
                    if progress:
                        progress(done, size)
                    if control.stopped():
                        break
                    if done > size:
                        raise DownloadError(f"The server sent more than {size:,} bytes.")
                fh.flush()
                os.fsync(fh.fileno())
        return done

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
        self._hashers.pop(part, None)
        with contextlib.suppress(FileNotFoundError):
            part.unlink()
