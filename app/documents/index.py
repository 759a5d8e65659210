"""The document index: every indexed file's record, its chunks, their vectors and words.

One SQLite file (``<data>/documents.sqlite3``, see ``index_schema``) holds, per file,
the stamp it was read at (size, mtime, sha256) and the embedding model used, and per
chunk its text, position and float16 vector; an FTS5 table indexes the chunk text.
``replace`` swaps a file's rows in one transaction, so a crash leaves the old version
or the new one. ``search`` ranks chunks by cosine (a float32 matrix kept in memory,
``vectors``), by BM25, or both fused (reciprocal rank fusion of the top 50 of each,
ties by cosine): at 100k chunks a hybrid search takes tens of milliseconds.

Thread-safe: one lock around the connection, which any thread may use.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np
import numpy.typing as npt

from app.documents.chunking import Chunk
from app.documents.index_schema import DAMAGE, IndexFile
from app.documents.parse import ParsedDocument
from app.documents.retrieval import fts_query, rrf, top_k_cosine
from app.documents.vectors import Layout, VectorCache, to_blob
from app.util.datafiles import os_reason
from app.util.errors import DocumentError
from app.util.sqlite_files import transaction

CANDIDATES = 50  # from each ranking, before fusion
COMMON_SHARE = 0.10  # a term in more of the chunks than this is left out of BM25 queries
COMMON_MIN_CHUNKS = 2_000  # below this FTS5 is fast on any term: nothing is left out
FEW_DOCUMENTS = 16  # up to this many wanted documents are searched one by one
BM25_SCAN = 5_000  # matches ranked before those of the wanted documents are picked
HASH_LIMIT = 4 << 30  # bytes; a larger file that changed its stamp is taken as changed
_T = TypeVar("_T")
Mode = Literal["hybrid", "vector", "bm25"]


@dataclass(frozen=True)
class DocRecord:
    """What the index knows of one file."""

    path: str
    name: str
    kind: str
    size: int
    mtime_ns: int
    sha256: str
    pages: int | None
    n_chunks: int
    n_chars: int
    model: str
    indexed_at: float


@dataclass(frozen=True)
class Hit:
    """One chunk found: ``score`` is the fused score (hybrid), the cosine (vector) or the
    BM25 score made positive (bm25); the ranks (from 1) say where each list had it."""

    path: str
    name: str
    chunk: Chunk
    score: float
    vector_rank: int | None
    bm25_rank: int | None


class DocumentIndex:
    """The index file of one data folder (see the module doc)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = IndexFile(path)
        self._lock = threading.RLock()
        self._version = 0  # bumped by every write: the vector cache is read again after it
        self._vectors = VectorCache()
        # (version, chunk count, whether each term asked about is too common)
        self._common: tuple[int, int, dict[str, bool]] = (-1, 0, {})

    def take_notes(self) -> list[str]:
        """What was repaired since the last call, for the user."""
        with self._lock:
            notes, self._file.notes = self._file.notes, []
            return notes

    def close(self) -> None:
        with self._lock:
            self._file.close()
            self._vectors.clear()

    def _run(self, action: Callable[[sqlite3.Connection], _T]) -> _T:
        """``action`` on the database; one found damaged on the way is set aside and the
        action tried once more on a fresh index.

        Raises:
            DocumentError: the index cannot be used at all.
        """
        with self._lock:
            for attempt in range(2):
                db = self._file.open()
                try:
                    return action(db)
                except DAMAGE as exc:
                    if _passing(exc):
                        raise DocumentError(
                            f"The document index is busy or the disk is full ({exc}). "
                            "Free some space or close other programs, then try again."
                        ) from exc
                    self._file.set_aside(str(exc))
                    self._changed()
                    if attempt:
                        raise DocumentError(
                            f"The document index cannot be used ({exc}). Try again; if it "
                            "keeps failing, check the data folder."
                        ) from exc
            raise AssertionError("unreachable")

    def _changed(self) -> None:
        self._version += 1

    # -- records ---------------------------------------------------------------------

    def record(self, path: str) -> DocRecord | None:
        def ask(db: sqlite3.Connection) -> DocRecord | None:
            row = db.execute("SELECT * FROM documents WHERE path = ?", (path,)).fetchone()
            return None if row is None else _record(row)

        return self._run(ask)

    def is_current(self, path: Path, model: str) -> bool:
        """Whether ``path`` is indexed as it is now, with ``model``: same size and mtime,
        or (a touched file) the same sha256, whose new stamp is then kept."""
        known = self.record(str(path))
        if known is None or known.model != model:
            return False
        try:
            st = os.stat(path)
        except (OSError, ValueError):
            return False
        if (st.st_size, st.st_mtime_ns) == (known.size, known.mtime_ns):
            return True
        if st.st_size != known.size or st.st_size > HASH_LIMIT:
            return False
        try:
            same = _sha256(path) == known.sha256
        except (OSError, ValueError):
            return False
        if same:

            def stamp(db: sqlite3.Connection) -> None:
                db.execute(
                    "UPDATE documents SET mtime_ns = ? WHERE path = ?", (st.st_mtime_ns, str(path))
                )

            self._run(stamp)
        return same

    def replace(
        self,
        doc: ParsedDocument,
        chunks: Sequence[Chunk],
        vectors: npt.NDArray[np.float32],
        sha256: str,
        model: str,
        stamp: tuple[int, int] | None = None,
    ) -> DocRecord:
        """Index ``doc`` (read from a file with ``sha256``) as ``chunks`` with their
        ``vectors`` (one row each, from ``model``), in place of what was there.
        ``stamp``: the file's (size, mtime_ns) from before it was read (None: now).

        Raises:
            DocumentError: the file cannot be read for its stamp, or the rows do not match.
        """
        if len(vectors) != len(chunks):
            raise DocumentError(f"{len(chunks)} passages came with {len(vectors)} vectors.")
        if stamp is None:
            try:
                st = os.stat(doc.path)
            except (OSError, ValueError) as exc:
                raise DocumentError(f"{doc.path} cannot be read ({os_reason(exc)}).") from exc
            stamp = (st.st_size, st.st_mtime_ns)
        record = DocRecord(
            path=doc.path,
            name=Path(doc.path).name,
            kind=doc.kind,
            size=stamp[0],
            mtime_ns=stamp[1],
            sha256=sha256,
            pages=doc.pages,
            n_chunks=len(chunks),
            n_chars=sum(len(c.text) for c in chunks),
            model=model,
            indexed_at=time.time(),
        )
        rows = [
            (doc.path, c.ord, c.text, c.page, c.line, c.end_line, to_blob(vectors[i]))
            for i, c in enumerate(chunks)
        ]

        def write(db: sqlite3.Connection) -> None:
            with transaction(db):
                _delete(db, doc.path)
                db.executemany(
                    "INSERT INTO chunks(path, ord, text, page, line, end_line, vector)"
                    " VALUES(?, ?, ?, ?, ?, ?, ?)",
                    rows,
                )
                db.execute(
                    "INSERT INTO chunk_fts(rowid, text) SELECT id, text FROM chunks WHERE path = ?",
                    (doc.path,),
                )
                db.execute(
                    "INSERT INTO documents VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    _values(record),
                )
            self._changed()

        self._run(write)
        return record

    def remove(self, path: str) -> None:
        def delete(db: sqlite3.Connection) -> None:
            with transaction(db):
                _delete(db, path)
            self._changed()

        self._run(delete)

    def chunks(self, path: str) -> list[Chunk]:
        """``path``'s chunks in order."""

        def ask(db: sqlite3.Connection) -> list[Chunk]:
            rows = db.execute(
                "SELECT ord, text, page, line, end_line FROM chunks WHERE path = ? ORDER BY ord",
                (path,),
            ).fetchall()
            return [_chunk(r) for r in rows]

        return self._run(ask)

    # -- search ------------------------------------------------------------------------

    def search(
        self,
        query: str,
        vector: npt.NDArray[np.float32] | None,
        paths: Sequence[str],
        k: int = 5,
        mode: Mode = "hybrid",
        model: str = "",
    ) -> list[Hit]:
        """The ``k`` chunks of the files in ``paths`` that best answer ``query`` (whose
        embedding is ``vector``; None: BM25 alone). ``model``: only chunks embedded by it
        are compared by cosine ("" = any of the vector's dimension)."""
        wanted = set(paths)
        if not wanted or k <= 0:
            return []
        use_vector = vector is not None and mode in ("hybrid", "vector")
        use_bm25 = mode in ("hybrid", "bm25") or vector is None
        pool = max(CANDIDATES, k)

        def ask(db: sqlite3.Connection) -> list[Hit]:
            cosine: dict[int, float] = {}
            by_vector: list[int] = []
            if use_vector and vector is not None:
                by_vector, cosine = self._by_vector(db, vector, wanted, pool, model)
            by_bm25: list[int] = []
            bm25: dict[int, float] = {}
            if use_bm25:
                by_bm25, bm25 = self._by_bm25(db, query, wanted, pool)
            if use_vector and use_bm25 and vector is not None:
                missing = [i for i in by_bm25 if i not in cosine]
                cosine.update(self._cosines(db, vector, missing, model))
                fused = rrf([by_vector, by_bm25])
                fused.sort(key=lambda kv: (-kv[1], -cosine.get(kv[0], -2.0)))
                scored = fused
            elif use_vector:
                scored = [(i, cosine[i]) for i in by_vector]
            else:
                scored = [(i, bm25[i]) for i in by_bm25]
            return _hits(db, scored[:k], by_vector, by_bm25)

        return self._run(ask)

    def _by_vector(
        self,
        db: sqlite3.Connection,
        vector: npt.NDArray[np.float32],
        wanted: set[str],
        pool: int,
        model: str,
    ) -> tuple[list[int], dict[int, float]]:
        dim = int(np.asarray(vector).size)
        table = self._vectors.table(db, self._version, model, dim)
        mask = table.mask_for(wanted)
        found = top_k_cosine(table.matrix, vector, pool, None if mask.all() else mask)
        ids = [int(table.ids[r]) for r, _ in found]
        return ids, {i: s for i, (_, s) in zip(ids, found, strict=True)}

    def _cosines(
        self, db: sqlite3.Connection, vector: npt.NDArray[np.float32], ids: list[int], model: str
    ) -> dict[int, float]:
        """The cosine of the chunks ``ids`` (ties in fusion are broken by it)."""
        query = np.asarray(vector, dtype=np.float32).reshape(-1)
        norm = float(np.linalg.norm(query))
        table = self._vectors.table(db, self._version, model, query.size)
        out: dict[int, float] = {}
        if norm == 0.0 or not np.isfinite(norm):
            return out
        for chunk_id, row in zip(ids, table.rows_of(ids), strict=True):
            if row is not None:
                out[chunk_id] = float(table.matrix[row] @ query) / norm
        return out

    def _by_bm25(
        self, db: sqlite3.Connection, query: str, wanted: set[str], pool: int
    ) -> tuple[list[int], dict[int, float]]:
        match = fts_query(query, self._too_common(db))
        if not match:
            return [], {}
        layout = self._vectors.layout(db, self._version)
        everything = wanted.issuperset(layout.paths)
        if not everything and len(wanted) <= FEW_DOCUMENTS:
            return _bm25_in_spans(db, match, layout, wanted, pool)
        # Ranked by BM25 over all documents, then the wanted ones kept (the chunk ids are
        # mapped to documents in memory: joining every match to its row costs more).
        cursor = db.execute(
            "SELECT rowid, bm25(chunk_fts) AS s FROM chunk_fts WHERE chunk_fts MATCH ?"
            " ORDER BY s, rowid LIMIT ?",
            (match, pool if everything else BM25_SCAN),
        )
        scores: dict[int, float] = {}
        ids: list[int] = []
        seen = 0
        while len(ids) < pool and (rows := cursor.fetchmany(pool if everything else 500)):
            seen += len(rows)
            batch = {int(r[0]): -float(r[1]) for r in rows}
            scores.update(batch)
            ids += list(batch) if everything else layout.among(list(batch), wanted)
        cursor.close()
        ids = ids[:pool]
        if len(ids) < pool and seen == BM25_SCAN and not everything:
            rows = db.execute(  # the wanted documents are rare among the matches
                "SELECT c.id, bm25(chunk_fts) AS s"
                " FROM chunk_fts JOIN chunks c ON c.id = chunk_fts.rowid"
                " WHERE chunk_fts MATCH ? AND c.path IN (SELECT value FROM json_each(?))"
                " ORDER BY s, c.id LIMIT ?",
                (match, json.dumps(sorted(wanted)), pool),
            ).fetchall()
            scores = {int(r[0]): -float(r[1]) for r in rows}
            ids = list(scores)
        return ids, {i: scores[i] for i in ids}

    def _too_common(self, db: sqlite3.Connection) -> Callable[[str], bool] | None:
        """A test for terms in more than ``COMMON_SHARE`` of the chunks (None for a small
        index, where every term is fast). Answers are kept until the next write: asking
        FTS5 about a common term reads its whole posting list."""
        if self._common[0] != self._version:
            total = int(db.execute("SELECT count(*) FROM chunks").fetchone()[0])
            self._common = (self._version, total, {})
        _, total, known = self._common
        if total < COMMON_MIN_CHUNKS:
            return None
        limit = total * COMMON_SHARE

        def too_common(term: str) -> bool:
            if term not in known:
                row = db.execute("SELECT doc FROM chunk_vocab WHERE term = ?", (term,)).fetchone()
                if len(known) >= 10_000:
                    known.clear()
                known[term] = row is not None and int(row[0]) > limit
            return known[term]

        return too_common


def _bm25_in_spans(
    db: sqlite3.Connection, match: str, layout: Layout, wanted: set[str], pool: int
) -> tuple[list[int], dict[int, float]]:
    """BM25 over a few documents, each asked for by its range of chunk ids (FTS5 seeks to
    it, so this costs what those documents' matches cost, not all matches)."""
    scores: dict[int, float] = {}
    for first, last in layout.spans(wanted):
        rows = db.execute(
            "SELECT rowid, bm25(chunk_fts) AS s FROM chunk_fts WHERE chunk_fts MATCH ?"
            " AND rowid BETWEEN ? AND ? ORDER BY s, rowid LIMIT ?",
            (match, first, last, pool),
        ).fetchall()
        scores.update((int(r[0]), -float(r[1])) for r in rows)
    ids = layout.among(list(scores), wanted)
    ids.sort(key=lambda i: (-scores[i], i))
    return ids[:pool], {i: scores[i] for i in ids[:pool]}


def _hits(
    db: sqlite3.Connection,
    scored: list[tuple[int, float]],
    by_vector: list[int],
    by_bm25: list[int],
) -> list[Hit]:
    if not scored:
        return []
    ids = [i for i, _ in scored]
    rows = db.execute(
        "SELECT c.id, c.path, d.name, c.ord, c.text, c.page, c.line, c.end_line"
        " FROM chunks c JOIN documents d ON d.path = c.path"
        " WHERE c.id IN (SELECT value FROM json_each(?))",
        (json.dumps(ids),),
    ).fetchall()
    found = {int(r[0]): r for r in rows}
    vector_rank = {i: n for n, i in enumerate(by_vector, start=1)}
    bm25_rank = {i: n for n, i in enumerate(by_bm25, start=1)}
    hits = []
    for chunk_id, score in scored:
        row = found.get(chunk_id)
        if row is None:
            continue
        hits.append(
            Hit(
                path=str(row[1]),
                name=str(row[2]),
                chunk=_chunk(row[3:]),
                score=score,
                vector_rank=vector_rank.get(chunk_id),
                bm25_rank=bm25_rank.get(chunk_id),
            )
        )
    return hits


def _passing(exc: BaseException) -> bool:
    """An error that says nothing about the file's health (setting it aside would not help)."""
    text = str(exc).lower()
    return isinstance(exc, sqlite3.OperationalError) and any(
        word in text for word in ("locked", "busy", "full", "interrupted")
    )


def _delete(db: sqlite3.Connection, path: str) -> None:
    db.execute(
        "INSERT INTO chunk_fts(chunk_fts, rowid, text)"
        " SELECT 'delete', id, text FROM chunks WHERE path = ?",
        (path,),
    )
    db.execute("DELETE FROM chunks WHERE path = ?", (path,))
    db.execute("DELETE FROM documents WHERE path = ?", (path,))


def _chunk(row: Sequence[Any]) -> Chunk:
    ord_, text, page, line, end_line = row
    return Chunk(
        ord=int(ord_),
        text=str(text),
        page=None if page is None else int(page),
        line=int(line),
        end_line=int(end_line),
    )


def _record(row: Sequence[Any]) -> DocRecord:
    path, name, kind, size, mtime_ns, sha, pages, n_chunks, n_chars, model, at = row
    return DocRecord(
        path=str(path),
        name=str(name),
        kind=str(kind),
        size=int(size),
        mtime_ns=int(mtime_ns),
        sha256=str(sha),
        pages=None if pages is None else int(pages),
        n_chunks=int(n_chunks),
        n_chars=int(n_chars),
        model=str(model),
        indexed_at=float(at),
    )


def _values(r: DocRecord) -> tuple[object, ...]:
    return (
        r.path,
        r.name,
        r.kind,
        r.size,
        r.mtime_ns,
        r.sha256,
        r.pages,
        r.n_chunks,
        r.n_chars,
        r.model,
        r.indexed_at,
    )


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
    return h.hexdigest()
