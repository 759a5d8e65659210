"""The ``<name>.part`` file a download grows, and a sha256 of exactly the bytes it holds."""

from __future__ import annotations

import hashlib
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.models.download_control import Control
from app.models.download_errors import DownloadCancelled, DownloadError, local_error

CHUNK = 1024 * 1024
PART_SUFFIX = ".part"


@dataclass
class PartState:
    """How many bytes ``<name>.part`` holds and a sha256 that has seen exactly them."""

    done: int = 0
    hasher: Any = field(default_factory=hashlib.sha256)

    def restart(self) -> None:
        """Back to byte 0 with a new hasher (``hashlib`` objects cannot be reset)."""
        self.done = 0
        self.hasher = hashlib.sha256()


def hash_part(part: Path, control: Control) -> PartState:
    """The state of what ``part`` holds, hashed once (after a restart); stops if asked to.

    Raises:
        DownloadCancelled: ``control`` asked to stop while hashing.
        DownloadError: the part cannot be read.
    """
    state = PartState()
    # After a restart: hash what is there once, then carry on from its end.
    try:
        with part.open("rb") as fh:
            while block := fh.read(CHUNK):
                if control.stopped():
                    raise DownloadCancelled("paused")
                state.hasher.update(block)
                state.done += len(block)
    except OSError as exc:
        raise local_error(exc, part, 0) from exc
    return state


def size_of(path: Path) -> int:
    """Bytes in the part file (0 if there is none); something else in its place is refused.

    A FIFO or a device where the part belongs would block the first read or write.
    """
    try:
        st = path.stat()
    except FileNotFoundError:
        return 0
    except OSError as exc:
        raise local_error(exc, path, 0) from exc
    if not stat.S_ISREG(st.st_mode):
        raise DownloadError(f"{path} is not a regular file; move it away and resume.")
    return st.st_size
