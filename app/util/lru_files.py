"""Folders of files kept least-recently-used first (the API's prompt cache, stored
responses): a file's modification time is its last use (``os.utime`` on a read)."""

from __future__ import annotations

import contextlib
from pathlib import Path


def files_by_use(folder: Path, pattern: str) -> list[tuple[float, int, Path]]:
    """``(mtime, size, path)`` of the files matching ``pattern``, least recently used
    first (none when the folder is missing; a file gone meanwhile is left out)."""
    found = []
    if folder.is_dir():
        for path in folder.glob(pattern):
            with contextlib.suppress(OSError):
                stat = path.stat()
                found.append((stat.st_mtime, stat.st_size, path))
    return sorted(found)


def trim(
    folder: Path, pattern: str, kept: Path, max_bytes: int, max_files: int | None = None
) -> None:
    """Drop the least recently used files until those left fit ``max_bytes`` (and
    ``max_files``); ``kept`` (the one just written) stays, whatever its size."""
    files = files_by_use(folder, pattern)
    total, count = sum(size for _, size, _ in files), len(files)
    for _, size, path in files:
        if total <= max_bytes and (max_files is None or count <= max_files):
            break
        if path != kept:
            path.unlink(missing_ok=True)
            total -= size
            count -= 1
