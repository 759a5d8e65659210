"""The chunks' vectors held in memory as one float32 matrix, for brute-force cosine search.

On disk each vector is float16 (half the bytes); numpy has no fast float16 product
(185 ms at 100k x 384 against 20 ms for float32), so search reads a float32 copy that
is made once and made again, lazily, only after the index was written (its version).
Rows are in chunk-id order, so a chunk's row is found by binary search, and each row
knows its document by a small integer, so limiting a search to some documents is one
boolean mask.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class Layout:
    """Which document each chunk belongs to, by chunk id."""

    ids: npt.NDArray[np.int64]  # chunk ids, ascending
    doc_of: npt.NDArray[np.int32]  # row -> index into ``paths``
    paths: tuple[str, ...]

    def mask_for(self, wanted: set[str]) -> npt.NDArray[np.bool_]:
        """Which rows belong to the documents in ``wanted``."""
        chosen = np.fromiter(
            (p in wanted for p in self.paths), dtype=np.bool_, count=len(self.paths)
        )
        return chosen[self.doc_of] if self.doc_of.size else np.zeros(0, dtype=np.bool_)

    def rows_of(self, ids: list[int]) -> list[int | None]:
        """The row of each chunk id (None when it has none here)."""
        rows = self._rows(ids)
        return [None if r < 0 else r for r in rows.tolist()]

    def _rows(self, ids: list[int]) -> npt.NDArray[np.int64]:
        """The row of each chunk id, -1 for none."""
        wanted = np.asarray(ids, dtype=np.int64)
        if self.ids.size == 0 or wanted.size == 0:
            return np.full(wanted.size, -1, dtype=np.int64)
        at = np.minimum(np.searchsorted(self.ids, wanted), self.ids.size - 1)
        return np.where(self.ids[at] == wanted, at, -1).astype(np.int64)

    def spans(self, wanted: set[str]) -> list[tuple[int, int]]:
        """The (first, last) chunk id of each document in ``wanted`` that has chunks."""
        out = []
        for i, path in enumerate(self.paths):
            if path in wanted:
                ids = self.ids[self.doc_of == i]
                out.append((int(ids[0]), int(ids[-1])))
        return out

    def among(self, ids: list[int], wanted: set[str]) -> list[int]:
        """Those of ``ids`` (in order) whose document is in ``wanted``."""
        if not ids:
            return []
        chosen = np.fromiter(
            (p in wanted for p in self.paths), dtype=np.bool_, count=len(self.paths)
        )
        rows = self._rows(ids)
        keep = (rows >= 0) & chosen[self.doc_of[np.maximum(rows, 0)]]
        kept: list[int] = np.asarray(ids, dtype=np.int64)[keep].tolist()
        return kept


@dataclass(frozen=True)
class VectorTable(Layout):
    """The vectors of one model (``model`` "" = every model of this dimension)."""

    matrix: npt.NDArray[np.float32]  # (rows, dim), L2-normalised


class VectorCache:
    """One ``VectorTable`` per (model, dim), valid for one version of the index."""

    def __init__(self) -> None:
        self._version = -1
        self._tables: dict[tuple[str, int], VectorTable] = {}
        self._layout: Layout | None = None

    def table(self, db: sqlite3.Connection, version: int, model: str, dim: int) -> VectorTable:
        """The table for ``model`` and ``dim``, read from ``db`` unless already held for
        ``version``."""
        if version != self._version:
            self._tables.clear()
            self._layout = None
            self._version = version
        key = (model, dim)
        table = self._tables.get(key)
        if table is None:
            table = _read(db, model, dim)
            self._tables = {key: table}  # one model is in use at a time: keep memory to one
        return table

    def layout(self, db: sqlite3.Connection, version: int) -> Layout:
        """Every chunk's document (for limiting a full-text search to some documents)."""
        if version != self._version:
            self._tables.clear()
            self._layout = None
            self._version = version
        if self._layout is None:
            rows = db.execute("SELECT id, path FROM chunks ORDER BY id").fetchall()
            index: dict[str, int] = {}
            ids = np.fromiter((int(r[0]) for r in rows), dtype=np.int64, count=len(rows))
            doc_of = np.fromiter(
                (index.setdefault(str(r[1]), len(index)) for r in rows),
                dtype=np.int32,
                count=len(rows),
            )
            self._layout = Layout(ids, doc_of, tuple(index))
        return self._layout

    def clear(self) -> None:
        self._tables.clear()
        self._layout = None
        self._version = -1


def _read(db: sqlite3.Connection, model: str, dim: int) -> VectorTable:
    sql = (
        "SELECT c.id, c.path, c.vector FROM chunks c JOIN documents d ON d.path = c.path"
        " WHERE length(c.vector) = ?"
    )
    args: tuple[object, ...] = (2 * dim,)
    if model:
        sql += " AND d.model = ?"
        args += (model,)
    rows = db.execute(sql + " ORDER BY c.id", args).fetchall()
    n = len(rows)
    ids = np.empty(n, dtype=np.int64)
    doc_of = np.empty(n, dtype=np.int32)
    raw = bytearray(n * 2 * dim)
    index: dict[str, int] = {}
    for i, (chunk_id, path, blob) in enumerate(rows):
        ids[i] = int(chunk_id)
        doc_of[i] = index.setdefault(str(path), len(index))
        raw[i * 2 * dim : (i + 1) * 2 * dim] = bytes(blob)
    matrix = np.frombuffer(bytes(raw), dtype="<f2").reshape(n, dim).astype(np.float32)
    matrix = np.nan_to_num(matrix, nan=0.0, posinf=0.0, neginf=0.0)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    matrix /= np.where(norms > 0, norms, 1.0)
    return VectorTable(ids, doc_of, tuple(index), matrix)


def to_blob(vector: npt.NDArray[np.float32]) -> bytes:
    """A vector as stored: little-endian float16."""
    return np.asarray(vector, dtype="<f2").tobytes()
