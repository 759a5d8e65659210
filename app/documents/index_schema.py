"""The document index's SQLite file: its tables, and what is done when it is damaged.

The documents are the truth; the index is derived from them, so a missing, damaged,
foreign (another program's database) or older-schema file is set aside as
``documents.sqlite3.bad`` and a fresh one made: the library indexes the files again.
As in ``app.chat.search_index``, links are never followed: the file or one of its side
files as a link (or a directory, a pipe) is set aside, so nothing outside the data
folder is read or written through a planted link.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from pathlib import Path

from app.util.errors import DocumentError
from app.util.sqlite_files import check_sqlite_files, fts5_available, set_aside_sqlite, transaction

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
# What a damaged file can raise on the way: bytes that are not text, rows of the wrong type.
DAMAGE = (sqlite3.DatabaseError, UnicodeDecodeError, ValueError, TypeError)
_TABLES = frozenset({"meta", "documents", "chunks", "chunk_fts", "chunk_vocab"})
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS documents(path TEXT PRIMARY KEY, name TEXT NOT NULL,"
    " kind TEXT NOT NULL, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL,"
    " sha256 TEXT NOT NULL, pages INTEGER, n_chunks INTEGER NOT NULL,"
    " n_chars INTEGER NOT NULL, model TEXT NOT NULL, indexed_at REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS chunks(id INTEGER PRIMARY KEY, path TEXT NOT NULL,"
    " ord INTEGER NOT NULL, text TEXT NOT NULL, page INTEGER, line INTEGER NOT NULL,"
    " end_line INTEGER NOT NULL, vector BLOB)",
    "CREATE INDEX IF NOT EXISTS chunks_path ON chunks(path, ord)",
    # External content: the text is stored once, in ``chunks``; rowid = chunks.id.
    "CREATE VIRTUAL TABLE IF NOT EXISTS chunk_fts USING fts5(text, content='chunks',"
    " content_rowid='id', tokenize='unicode61 remove_diacritics 2')",
    # How many chunks hold each term: the query leaves out the very common ones.
    "CREATE VIRTUAL TABLE IF NOT EXISTS chunk_vocab USING fts5vocab(chunk_fts, 'row')",
)
NO_FTS5 = (
    "This Python's SQLite has no full-text search (FTS5), so documents cannot be indexed. "
    "Use a Python build whose SQLite includes FTS5."
)


class IndexFile:
    """Opens (and when needed sets aside and remakes) the index file. Not thread-safe:
    the ``DocumentIndex`` calls it under its lock."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.notes: list[str] = []
        self._db: sqlite3.Connection | None = None

    def open(self) -> sqlite3.Connection:
        """The connection, made on first use.

        Raises:
            DocumentError: no FTS5, or a fresh index cannot be made either.
        """
        if self._db is not None:
            return self._db
        if not fts5_available():
            raise DocumentError(NO_FTS5)
        for attempt in range(2):
            try:
                self._check_files()
                self._db = _connect(self.path)
                return self._db
            except DAMAGE as exc:
                self.close()
                if attempt:
                    log.warning("document index %s: %s", self.path, exc)
                    raise DocumentError(
                        f"The document index {self.path} cannot be used ({exc}). "
                        "Check that the data folder is writable, then try again."
                    ) from exc
                self.set_aside(str(exc))
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._db is not None:
            with contextlib.suppress(sqlite3.Error):
                self._db.close()
        self._db = None

    def _check_files(self) -> None:
        """The index and its side files are regular files or absent (see the module doc).

        Raises:
            sqlite3.DatabaseError: one of them is something else.
        """
        check_sqlite_files(self.path)

    def set_aside(self, why: str) -> None:
        """Move the index (and its side files) out of the way, with a note; a regular
        journal of a damaged file is no use and is deleted."""
        self.close()
        note = f"The document index was damaged ({why}); the documents will be indexed again."
        failed = set_aside_sqlite(self.path)
        if failed:
            note = f"The document index is damaged and {failed}."
        log.warning("%s", note)
        self.notes.append(note)


def _connect(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, timeout=2.0, isolation_level=None, check_same_thread=False)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        tables = {
            str(r[0]) for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        version = meta(db, "schema") if "meta" in tables else None
        own = {t for t in tables if not t.startswith(("chunk_fts_", "sqlite_"))}
        if version is None and own - _TABLES:
            raise sqlite3.DatabaseError("it is not a Lamplight document index")
        if version not in (None, str(SCHEMA_VERSION)):
            raise sqlite3.DatabaseError(f"schema {version!r}, expected {SCHEMA_VERSION}")
        with transaction(db):
            for statement in _SCHEMA:
                db.execute(statement)
            db.execute("INSERT OR REPLACE INTO meta VALUES('schema', ?)", (str(SCHEMA_VERSION),))
        if db.execute("PRAGMA quick_check").fetchone() != ("ok",):
            raise sqlite3.DatabaseError("quick_check failed")
        # Once per run: the full-text index agrees with the chunks it indexes.
        db.execute("INSERT INTO chunk_fts(chunk_fts) VALUES('integrity-check')")
    except BaseException:
        db.close()
        raise
    return db


def meta(db: sqlite3.Connection, key: str) -> str | None:
    row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return None if row is None else str(row[0])
