"""Full-text search over every saved conversation's messages (SQLite FTS5).

The transcripts are the truth; the index is derived from them and kept in
``<data>/search.sqlite3``. Each conversation is indexed in one transaction
together with the (size, mtime) stamp of the transcript it was read from, so
a crash between writing a transcript and indexing it leaves a stale stamp that
the next ``sync`` notices and repairs. A missing, damaged or foreign index
file is set aside and rebuilt from the transcripts; nothing the user wrote
lives only here. "No FTS5 in this SQLite" is asked of SQLite itself, once, so a
damaged full-text table is never taken for it. Links are never followed: the
index file or its journal as a link (or a directory, a pipe) is set aside, and a
transcript that is a link is not indexed, so nothing outside the data folder is
read or written through a planted link.

Why SQLite and not a search library: FTS5 ships with Python's standard
library, ranks with BM25, makes snippets, and its transactions give the
all-or-nothing update per conversation that the promise above needs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sqlite3
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from app.chat.conversation import Conversation, Message, is_valid_id
from app.util.sqlite_files import check_sqlite_files, fts5_available, set_aside_sqlite
from app.util.sqlite_files import transaction as _transaction

log = logging.getLogger(__name__)

SCHEMA_VERSION = 2  # 2: a reply's thinking is indexed too (the ``thinking`` column)
OLDER_SCHEMAS = ("1",)  # an earlier Lamplight's index: emptied and filled again, quietly
INDEXED_CHARS = 200_000  # of one message; the rest of a pasted log is not searched
QUERY_CHARS = 200  # of what the user typed
QUERY_TERMS = 8
RESULTS = 50
SNIPPET_TOKENS = 10
# Snippet marks: private-use characters the UI turns into emphasis after escaping.
HIT_START, HIT_END = "\ue000", "\ue001"
_TERM = re.compile(r"\w+", re.UNICODE)
# What a damaged file can raise on the way: bytes that are not text, rows of the wrong type.
DAMAGE = (sqlite3.DatabaseError, UnicodeDecodeError, ValueError, TypeError)
NO_FTS5 = "This Python's SQLite has no full-text search (FTS5)"
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS docs(conv_id TEXT PRIMARY KEY, stamp TEXT NOT NULL,"
    " title TEXT NOT NULL)",
    "CREATE VIRTUAL TABLE IF NOT EXISTS messages USING fts5("
    "content, conv_id UNINDEXED, idx UNINDEXED, role UNINDEXED, thinking UNINDEXED,"
    " tokenize='unicode61 remove_diacritics 2')",
)


@dataclass(frozen=True)
class SearchHit:
    """One matching message: where it is and a snippet with ``HIT_START``/``HIT_END`` marks;
    ``thinking``: the words are in the reply's thinking, not its answer."""

    conv_id: str
    index: int
    role: str
    title: str
    snippet: str
    thinking: bool = False


def query_terms(text: str) -> list[str]:
    """The words of what the user typed that a search looks for."""
    return list(_TERM.findall(text[:QUERY_CHARS])[:QUERY_TERMS])


def fts_query(text: str) -> str:
    """An FTS5 query for what the user typed: every word must appear, the last one as a
    prefix (search as you type). Words are quoted, so no operator syntax gets through."""
    terms = query_terms(text)
    if not terms:
        return ""
    quoted = [f'"{t}"' for t in terms]
    quoted[-1] += " *"
    return " AND ".join(quoted)


class SearchIndex:
    """The index file of one data dir. Not thread-safe: one caller at a time (the store
    serializes its calls under its lock).

    ``transcripts`` is the folder the conversations' files are in (by default
    ``conversations/`` next to the index, as ``ConversationStore`` lays them out).
    """

    def __init__(self, path: Path, transcripts: Path | None = None) -> None:
        self.path = path
        self.transcripts = path.parent / "conversations" if transcripts is None else transcripts
        self._db: sqlite3.Connection | None = None
        self.problem = ""  # why search is unavailable, for the user; "" when it works
        self.notes: list[str] = []  # what was repaired, for the user

    # -- opening ---------------------------------------------------------------------

    def _open(self) -> sqlite3.Connection | None:
        if self._db is not None or self.problem:
            return self._db
        if not fts5_available():
            self.problem = NO_FTS5
            return None
        for attempt in range(2):
            try:
                self._check_files()
                self._db = self._connect()
                return self._db
            except DAMAGE as exc:
                self.close()
                if "no such module: fts5" in str(exc).lower():  # never said of damage
                    self.problem = NO_FTS5
                    return None
                if attempt:
                    self.problem = f"The search index cannot be used ({exc})"
                    log.warning("search index %s: %s", self.path, exc)
                    return None
                self._set_aside(str(exc))
        return None

    def _connect(self) -> sqlite3.Connection:
        # Any thread may ask, one at a time (the store's lock); not only the one that opened it.
        db = sqlite3.connect(self.path, timeout=2.0, isolation_level=None, check_same_thread=False)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            version = _meta(db, "schema")
            if version in OLDER_SCHEMAS:
                _drop_tables(db)  # rebuilt from the transcripts by the next ``sync``
            elif version not in (None, str(SCHEMA_VERSION)):
                raise sqlite3.DatabaseError(f"schema {version!r}, expected {SCHEMA_VERSION}")
            with _transaction(db):
                for statement in _SCHEMA:
                    db.execute(statement)
                db.execute(
                    "INSERT OR REPLACE INTO meta VALUES('schema', ?)", (str(SCHEMA_VERSION),)
                )
            if db.execute("PRAGMA quick_check").fetchone() != ("ok",):
                raise sqlite3.DatabaseError("quick_check failed")
            # Once per run: the full-text index agrees with the rows it indexes.
            db.execute("INSERT INTO messages(messages) VALUES('integrity-check')")
        except BaseException:
            db.close()
            raise
        return db

    def _check_files(self) -> None:
        """The index and its side files are regular files or absent (``check_sqlite_files``).

        Raises:
            sqlite3.DatabaseError: one of them is something else (the file is set aside).
        """
        check_sqlite_files(self.path)

    def _set_aside(self, why: str) -> None:
        """Move a damaged index (and its side files) out of the way; it is rebuilt.

        The index and anything that is not a regular file are renamed to ``.bad`` (a link
        is renamed, never followed); a regular journal of a damaged file is no use and is
        deleted.
        """
        note = f"The search index was damaged ({why}); it is rebuilt from the conversations."
        failed = set_aside_sqlite(self.path)
        if failed:
            note = f"The search index is damaged and {failed}."
        log.warning("%s", note)
        self.notes.append(note)

    def close(self) -> None:
        if self._db is not None:
            with contextlib.suppress(sqlite3.Error):
                self._db.close()
        self._db = None

    def _guarded(self, action: Callable[[sqlite3.Connection], object]) -> bool:
        """Run ``action`` on the database; a database found damaged on the way is set
        aside and rebuilt on the next call (the transcripts are untouched)."""
        db = self._open()
        if db is None:
            return False
        try:
            action(db)
            return True
        except DAMAGE as exc:
            self.close()
            self._set_aside(str(exc))
            return False

    # -- keeping it in step with the transcripts -------------------------------------

    def update(self, conv: Conversation, stamp: str) -> None:
        """Index ``conv`` as saved in a transcript with ``stamp`` (all or nothing)."""

        def write(db: sqlite3.Connection) -> None:
            with _transaction(db):
                _replace(db, conv, stamp)

        self._guarded(write)

    def remove(self, conv_id: str) -> None:
        def delete(db: sqlite3.Connection) -> None:
            with _transaction(db):
                db.execute("DELETE FROM messages WHERE conv_id = ?", (conv_id,))
                db.execute("DELETE FROM docs WHERE conv_id = ?", (conv_id,))

        self._guarded(delete)

    def sync(self, stamps: dict[str, str], load: Callable[[str], Conversation | None]) -> int:
        """Bring the index in step with the transcripts on disk: ``stamps`` maps every
        conversation id to its transcript's stamp, ``load`` reads one (None when it
        cannot be read). Returns how many conversations were (re)indexed."""
        done = 0

        def step(db: sqlite3.Connection) -> None:
            nonlocal done
            known = dict(db.execute("SELECT conv_id, stamp FROM docs").fetchall())
            for gone in set(known) - set(stamps):
                with _transaction(db):
                    db.execute("DELETE FROM messages WHERE conv_id = ?", (gone,))
                    db.execute("DELETE FROM docs WHERE conv_id = ?", (gone,))
            for conv_id, stamp in stamps.items():
                if known.get(conv_id) == stamp:
                    continue
                conv = load(conv_id) if self._is_transcript(conv_id) else None
                with _transaction(db):
                    if conv is None:  # unreadable now: nothing of it is searchable
                        db.execute("DELETE FROM messages WHERE conv_id = ?", (conv_id,))
                        db.execute("DELETE FROM docs WHERE conv_id = ?", (conv_id,))
                    else:
                        _replace(db, conv, stamp)
                done += 1

        if not self._guarded(step) and self.problem == "":
            self._guarded(step)  # once more on the rebuilt index
        return done

    def _is_transcript(self, conv_id: str) -> bool:
        """Whether ``conv_id``'s transcript is a regular file in the folder: a link (to a
        file out of the data folder, or anywhere) is not followed, so not indexed."""
        if not is_valid_id(conv_id):
            return False
        try:
            mode = os.lstat(self.transcripts / f"{conv_id}.json").st_mode
        except OSError:
            return False
        return stat.S_ISREG(mode)

    # -- asking ---------------------------------------------------------------------

    def search(
        self, text: str, limit: int = RESULTS, within: Iterable[str] | None = None
    ) -> list[SearchHit]:
        """Messages containing every word of ``text``, best first; with ``within``, only
        of those conversations (the limit applies among them)."""
        query = fts_query(text)
        ids = None if within is None else json.dumps(list(within))
        if not query or ids == "[]":
            return []
        hits: list[SearchHit] = []
        scope = "" if ids is None else " AND m.conv_id IN (SELECT value FROM json_each(?))"
        args = (HIT_START, HIT_END, SNIPPET_TOKENS, query, *(() if ids is None else (ids,)))

        def ask(db: sqlite3.Connection) -> None:
            rows = db.execute(
                "SELECT m.conv_id, m.idx, m.role, d.title,"
                " snippet(messages, 0, ?, ?, '…', ?), m.thinking"
                " FROM messages m JOIN docs d ON d.conv_id = m.conv_id"
                f" WHERE messages MATCH ?{scope} ORDER BY bm25(messages) LIMIT ?",
                (*args, max(1, min(limit, 500))),
            ).fetchall()
            hits.extend(
                SearchHit(str(c), int(i), str(r), str(t), " ".join(str(s).split()), k == 1)
                for c, i, r, t, s, k in rows
            )

        started = time.perf_counter()
        self._guarded(ask)
        log.debug("search %r: %d hits in %.1f ms", query, len(hits), _ms(started))
        return hits


def _replace(db: sqlite3.Connection, conv: Conversation, stamp: str) -> None:
    db.execute("DELETE FROM messages WHERE conv_id = ?", (conv.id,))
    db.executemany(
        "INSERT INTO messages(content, conv_id, idx, role, thinking) VALUES(?, ?, ?, ?, ?)",
        _rows(conv),
    )
    db.execute(
        "INSERT OR REPLACE INTO docs VALUES(?, ?, ?)", (conv.id, stamp, conv.title or "New chat")
    )


def _rows(conv: Conversation) -> Iterable[tuple[str, str, int, str, int]]:
    # Shown messages by index; then the versions not shown, numbered on past them in
    # ``every_message`` order: opening such a hit reveals that version (ui.chat.search_jump).
    for i, m in enumerate(conv.every_message()):
        for text, thinking in message_texts(m):
            yield text, conv.id, i, m.role, int(thinking)


def message_texts(m: Message) -> list[tuple[str, bool]]:
    """What search finds of one message, each text a row that opens message ``i``: its
    text, and a reply's thinking (True) apart, so a hit says which it is in; of its
    pictures, their file names."""
    if m.role not in ("user", "assistant"):
        return []
    parts = [(m.content, False), (m.reasoning if m.role == "assistant" else "", True)]
    parts.append((" ".join(r["name"] for r in m.images), False))
    return [(text[:INDEXED_CHARS], thinking) for text, thinking in parts if text.strip()]


def _drop_tables(db: sqlite3.Connection) -> None:
    """Empty an index of an older schema (its tables go; ``_SCHEMA`` makes them anew)."""
    with _transaction(db):
        db.execute("DROP TABLE IF EXISTS messages")
        db.execute("DROP TABLE IF EXISTS docs")
        db.execute("DELETE FROM meta WHERE key = 'schema'")


def _meta(db: sqlite3.Connection, key: str) -> str | None:
    try:
        row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return None
        raise
    return None if row is None else str(row[0])


def _ms(since: float) -> float:
    return (time.perf_counter() - since) * 1000
