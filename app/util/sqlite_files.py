"""A derived SQLite file in the data folder (an index): checked before SQLite opens it,
moved out of the way when it is damaged, with SQLite's side files, and written in
whole transactions."""

from __future__ import annotations

import contextlib
import functools
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

from app.util.datafiles import kind_of, os_reason, set_aside

SIDE_FILES = ("-wal", "-shm", "-journal")  # SQLite's own, next to the database file


@functools.cache
def fts5_available() -> bool:
    """Whether this Python's SQLite has FTS5 (asked once, of an in-memory database)."""
    try:
        with contextlib.closing(sqlite3.connect(":memory:")) as db:
            db.execute("CREATE VIRTUAL TABLE probe USING fts5(text)")
    except sqlite3.Error:
        return False
    return True


def check_sqlite_files(path: Path) -> None:
    """The database and its side files are regular files or absent: SQLite would follow
    a link out of the data folder, and fail on a directory or a pipe every time.

    Raises:
        sqlite3.DatabaseError: one of them is something else (the caller sets it aside).
    """
    for suffix in ("", *SIDE_FILES):
        part = path.with_name(path.name + suffix)
        try:
            mode = part.lstat().st_mode
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise sqlite3.DatabaseError(f"{part.name}: {os_reason(exc)}") from exc
        if not stat.S_ISREG(mode):
            what = "a link" if stat.S_ISLNK(mode) else kind_of(mode)
            raise sqlite3.DatabaseError(f"{part.name} is {what}, not a file")


def set_aside_sqlite(path: Path) -> str:
    """Move a damaged database (and its side files) out of the way; "" when done, else
    why a part could not be moved ("NAME cannot be moved (reason)").

    The database and anything that is not a regular file are renamed to ``.bad`` (a
    link is renamed, never followed); a regular journal of a damaged file is no use and
    is deleted.
    """
    failed = ""
    for suffix in ("", *SIDE_FILES):
        part = path.with_name(path.name + suffix)
        try:
            mode = part.lstat().st_mode
            if suffix and stat.S_ISREG(mode):
                part.unlink()
            else:
                set_aside(part)
        except FileNotFoundError:
            continue
        except OSError as exc:
            failed = f"{part.name} cannot be moved ({os_reason(exc)})"
    return failed


@contextlib.contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[None]:
    """One write transaction (taken at once, so readers never block it halfway); rolled
    back when the block raises."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
