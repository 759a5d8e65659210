"""What ends a download: the errors, worded for a person to act on."""

from __future__ import annotations

import errno
from pathlib import Path

from app.util.errors import LamplightError
from app.util.sysinfo import size_text

_DISK_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


class DownloadError(LamplightError):
    """A download that cannot go on; the message says what to do."""


class DownloadCancelled(LamplightError):
    """The user cancelled or paused the download."""


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


def local_error(exc: OSError, path: Path, kept: int) -> DownloadError:
    """A message for a failure of the local disk (never retried like a network error)."""
    if exc.errno in _DISK_FULL:
        return DownloadError(
            f"Disk full while writing {path.name} in {path.parent}. The {size_text(kept)} "
            "downloaded so far are kept: free some space and resume."
        )
    return DownloadError(f"Could not write {path}: {exc.strerror or exc}.")
