"""The user's documents as the chat uses them: indexing files and giving a message its
passages, whole documents when they fit, retrieved ones when they do not.

Indexing (``add``) reads each file in a bounded child process (``parse_child``), cuts
it into chunks that keep their page and lines (``chunking``), embeds them on the
embedder's own thread (``EmbedWorker``) and stores both in the index; an unchanged
file is skipped. ``context_for`` decides, per message, what goes into the new user
turn (never the system prompt, so the cached conversation before it stays valid):

- documents the model does not have yet that fit in half the room left go in whole,
  smallest first; once given they are part of the cached conversation, and later
  turns do not read them again;
- from the others, the passages that best match the message (vectors and BM25 fused,
  ``DocumentIndex.search``), as many as a quarter of the room allows (one at least).

Both ``add`` and ``context_for`` block: call them from a worker thread.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from app.documents.chunking import chunk_document
from app.documents.collections import Collections
from app.documents.index import DocRecord, DocumentIndex
from app.documents.parse import ParsedDocument, kind_for
from app.documents.parse_child import parse_bounded
from app.documents.sources import MAX_SOURCES, Source
from app.engine.local.embed_worker import EmbedWorker
from app.engine.token_estimate import CHARS_PER_TOKEN
from app.util.errors import DocumentCancelled, DocumentError
from app.util.hashing import sha256_file

DocState = Literal["queued", "reading", "embedding", "ready", "error"]
MAX_FILES = 2000  # from one folder
MAX_DEPTH = 8
EMBED_BATCH = 32  # chunks per embedder job: progress and Cancel between them
PASSAGE_TOKENS = 320  # a 900-character chunk, at CHARS_PER_TOKEN
MAX_PASSAGES = 6
WAIT_S = 600.0  # for one embedder job (a slow first load included)
READS = 3  # of a file that changes while it is read, before it is left for the next add
_NEVER = threading.Event()  # a cancel flag nobody sets


@dataclass(frozen=True)
class DocumentStatus:
    """One document as the documents bar shows it."""

    path: str
    name: str
    kind: str
    state: DocState
    error: str = ""
    n_chunks: int = 0
    pages: int | None = None


@dataclass(frozen=True)
class Progress:
    """How far ``add`` is: file ``done + 1`` of ``total`` (``current``), at ``stage``."""

    done: int
    total: int
    current: str
    fraction: float
    stage: str


def _ready(rec: DocRecord) -> DocumentStatus:
    return DocumentStatus(rec.path, rec.name, rec.kind, "ready", "", rec.n_chunks, rec.pages)


def _failed(path: Path, message: str) -> DocumentStatus:
    return DocumentStatus(str(path), path.name, kind_for(path) or "", "error", message)


def _stamp(path: Path) -> tuple[int, int]:
    """The file's (size, mtime_ns): what ``DocumentIndex.is_current`` compares."""
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def whole_text(doc: ParsedDocument) -> str:
    """A document's text as one piece: its blocks, with page headings for paged files."""
    out: list[str] = []
    page: int | None = None
    for block in doc.blocks:
        if block.page is not None and block.page != page:
            page = block.page
            out.append(f"(page {page})")
        out.append(block.text.strip())
    return "\n\n".join(t for t in out if t)


class DocumentLibrary:
    """The document index, the saved collections and the embedder that feeds them."""

    def __init__(self, data_dir: Path, worker: EmbedWorker) -> None:
        self.index = DocumentIndex(data_dir / "documents.sqlite3")
        self.collections = Collections(data_dir / "collections.json")
        self._worker = worker

    def close(self) -> None:
        """Nothing to release but the embedder, which its owner closes."""

    def take_notes(self) -> list[str]:
        """For the user, once: the index or collections file was damaged and set aside."""
        return [*self.index.take_notes(), *self.collections.take_notes()]

    # -- files -----------------------------------------------------------------------

    def expand(self, paths: Sequence[Path]) -> list[Path]:
        """The readable documents in ``paths``: files of a supported kind, and those in
        folders (not hidden ones, no links followed, ``MAX_DEPTH`` deep, ``MAX_FILES``)."""
        found: list[Path] = []
        for path in paths:
            path = Path(os.path.abspath(path))
            if path.is_dir():
                found += self._walk(path, MAX_FILES - len(found))
            elif path.is_file() and kind_for(path) is not None:
                found.append(path)
            if len(found) >= MAX_FILES:
                break
        return sorted(dict.fromkeys(found))[:MAX_FILES]

    @staticmethod
    def _walk(root: Path, room: int) -> list[Path]:
        out: list[Path] = []
        for folder, dirs, files in os.walk(root, followlinks=False):
            depth = len(Path(folder).relative_to(root).parts)
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and depth < MAX_DEPTH)
            for name in sorted(files):
                p = Path(folder) / name
                if not name.startswith(".") and not p.is_symlink() and kind_for(p) is not None:
                    out.append(p)
                    if len(out) >= room:
                        return out
        return out

    def status(self, paths: Sequence[str]) -> list[DocumentStatus]:
        """What the index knows of each of ``paths`` now (a missing file says so)."""
        out = []
        for p in paths:
            path = Path(p)
            rec = self.index.record(p)
            if not path.is_file():
                out.append(_failed(path, f"{path.name} is missing: it was moved or deleted."))
            elif rec is None:
                out.append(DocumentStatus(p, path.name, kind_for(path) or "", "queued"))
            else:
                out.append(_ready(rec))
        return out

    def paths_of(self, documents: Sequence[str], collections: Sequence[str]) -> list[str]:
        """The files of a chat's documents and collections, each once, in order."""
        every = [*documents, *(p for name in collections for p in self.collections.paths(name))]
        return list(dict.fromkeys(every))

    # -- indexing --------------------------------------------------------------------

    def add(
        self,
        paths: Sequence[Path],
        progress: Callable[[Progress], None],
        cancel: threading.Event,
    ) -> list[DocumentStatus]:
        """Index ``paths`` (files and folders); one status per file. A file that cannot
        be read comes back as an error; files done before a Cancel stay indexed.

        Raises:
            DocumentCancelled: ``cancel`` was set.
            EmbedderError: the embedding model could not be loaded.
        """
        files = self.expand(paths)
        model = self._worker.info().result(WAIT_S)[0] if files else ""
        out: list[DocumentStatus] = []
        for i, path in enumerate(files):
            if cancel.is_set():
                raise DocumentCancelled("Indexing was cancelled.")

            def report(stage: str, part: float, i: int = i, path: Path = path) -> None:
                progress(Progress(i, len(files), path.name, (i + part) / len(files), stage))

            report("checking", 0.0)
            out.append(self._add_one(path, model, report, cancel))
        return out

    def _add_one(
        self,
        path: Path,
        model: str,
        report: Callable[[str, float], None],
        cancel: threading.Event,
    ) -> DocumentStatus:
        try:
            rec = self.index.record(str(path))
            if rec is not None and self.index.is_current(path, model):
                return _ready(rec)
            status, settled = self._read_one(path, model, report, cancel)
            for _ in range(READS - 1):
                if settled:
                    break
                # It changed while it was read: what was indexed may mix two versions.
                status, settled = self._read_one(path, model, report, cancel)
            return status  # still changing after READS reads: read again by the next add
        except DocumentCancelled:
            raise
        except DocumentError as exc:
            return _failed(path, str(exc))
        except OSError as exc:
            return _failed(path, f"Lamplight could not read {path.name}: {exc.strerror or exc}.")

    def _read_one(
        self,
        path: Path,
        model: str,
        report: Callable[[str, float], None],
        cancel: threading.Event,
    ) -> tuple[DocumentStatus, bool]:
        """Read, chunk, embed and index ``path`` once; True with it when the file did not
        change meanwhile. The stamp recorded is the one from before the read, and a file
        that changed is recorded with no sha256, so the index never takes text read from
        one version of the file as another's (``DocumentIndex.is_current``)."""
        before = _stamp(path)
        report("reading", 0.1)
        doc = parse_bounded(path, cancel)
        sha = sha256_file(path)
        chunks = chunk_document(doc)
        if not chunks:
            return _failed(path, f"{path.name} has no text to read."), True
        texts = [c.text for c in chunks]
        parts = []
        for start in range(0, len(texts), EMBED_BATCH):
            report("embedding", 0.2 + 0.8 * start / len(texts))
            batch = texts[start : start + EMBED_BATCH]
            parts.append(self._worker.embed(batch, stop=cancel).result(WAIT_S))
        vectors = np.concatenate(parts) if parts else np.zeros((0, 1), np.float32)
        settled = _stamp(path) == before
        sha = sha if settled else ""
        return _ready(self.index.replace(doc, chunks, vectors, sha, model, before)), settled

    # -- a message's passages --------------------------------------------------------

    def context_for(
        self,
        paths: Sequence[str],
        query: str,
        room_tokens: int,
        given_whole: set[str],
        cancel: threading.Event | None = None,
        progress: Callable[[Progress], None] | None = None,
        count: Callable[[str], int] | None = None,
    ) -> list[Source]:
        """The passages to give with the message ``query``: whole documents that fit in
        half of ``room_tokens`` and are not in ``given_whole``, then retrieved passages
        from the rest. Changed files are indexed again first (``progress``); missing and
        unreadable ones are left out. A document's size is estimated from its characters
        (``CHARS_PER_TOKEN``); once read, ``count`` (the model's tokenizer) counts it.

        Raises:
            DocumentCancelled: ``cancel`` was set.
            EmbedderError: the embedding model could not be loaded.
        """
        # A file changed since it was indexed is read again first; a missing one is out.
        fresh = self.add([Path(p) for p in paths], progress or (lambda _: None), cancel or _NEVER)
        ready = [s.path for s in fresh if s.state == "ready"]
        records = [r for r in (self.index.record(p) for p in ready) if r is not None]
        rest = [r for r in records if r.path not in given_whole]
        out: list[Source] = []
        budget = room_tokens // 2
        for rec in sorted(rest, key=lambda r: r.n_chars):
            cost = int(rec.n_chars / CHARS_PER_TOKEN) + 16
            if cost > budget or len(out) >= MAX_SOURCES // 2:
                continue
            if cancel is not None and cancel.is_set():
                raise DocumentCancelled("Searching the documents was cancelled.")
            source = self._whole(rec, len(out) + 1, cancel)
            if source is not None and count is not None:
                cost = count(source.text) + 16
            if source is not None and cost <= budget:
                out.append(source)
                budget -= cost
        taken = {s.path for s in out}
        search = [r.path for r in rest if r.path not in taken]
        # One passage even when the chat is nearly full: the overflow policy makes room
        # by dropping older turns, and an answer without its source is worse.
        k = max(1, min(MAX_PASSAGES, (room_tokens // 4) // PASSAGE_TOKENS))
        if search and query.strip():
            out += self._retrieve(search, query, k, len(out), cancel)
        return out

    def _whole(self, rec: DocRecord, n: int, cancel: threading.Event | None) -> Source | None:
        try:
            doc = parse_bounded(Path(rec.path), cancel)
        except DocumentCancelled:
            raise
        except DocumentError:
            return None  # changed into something unreadable: its passages may still serve
        text = whole_text(doc)
        lines = text.count("\n") + 1
        return Source(n, rec.path, rec.name, text, None, 1, lines, -1, True)

    def _retrieve(
        self,
        paths: Sequence[str],
        query: str,
        k: int,
        first: int,
        cancel: threading.Event | None,
    ) -> list[Source]:
        model = self._worker.info().result(WAIT_S)[0]
        vector = self._worker.embed([query[:4000]], urgent=True, stop=cancel).result(WAIT_S)[0]
        # Only vectors of the model in use are compared (a file indexed by another is
        # indexed again by ``add`` first; this keeps a race from mixing them).
        hits = self.index.search(query, vector, paths, k=k, model=model)
        return [
            Source(
                first + i + 1,
                h.path,
                h.name,
                h.chunk.text,
                h.chunk.page,
                h.chunk.line,
                h.chunk.end_line,
                h.chunk.ord,
                False,
                round(h.score, 6),
            )
            for i, h in enumerate(hits)
        ]

    def read_blocks(self, path: str) -> list[tuple[int | None, int, str]]:
        """The file's current text as (page, line, text) blocks, for the viewer.

        Raises:
            DocumentError: the file is missing or cannot be read.
        """
        doc = parse_bounded(Path(path))
        return [(b.page, b.line, b.text) for b in doc.blocks]
