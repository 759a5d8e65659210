"""Stand-ins for the documents: ``FakeLibrary`` for ``app.documents.library.DocumentLibrary``
in the window tests (the same methods, no embedder, no parsing; ``gate`` holds
``add``/``context_for`` until set), and for the index tests a deterministic embedding
(``fake_embed``) and built documents (``document``)."""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from app.documents.library import DocState, DocumentStatus, Progress
from app.documents.parse import Block, ParsedDocument
from app.documents.sources import Source
from app.util.errors import DocumentCancelled, DocumentError

DIM = 64  # fake_embed's vector size
SUFFIXES = frozenset({".pdf", ".md", ".txt", ".html", ".docx", ".py"})


@dataclass
class FakeCollections:
    saved: dict[str, list[str]] = field(default_factory=dict)

    def names(self) -> list[str]:
        return sorted(self.saved)

    def paths(self, name: str) -> list[str]:
        return list(self.saved.get(name, []))

    def save(self, name: str, paths: Sequence[str]) -> None:
        if not name.strip():
            raise DocumentError("Give the collection a name.")
        self.saved[name] = list(paths)

    def delete(self, name: str) -> None:
        self.saved.pop(name, None)

    def rename(self, old: str, new: str) -> None:
        self.saved[new] = self.saved.pop(old)


class FakeEmbedder:
    """The embedder worker's stand-in: only closed at quit."""

    closed = False

    def close(self) -> None:
        self.closed = True


class FakeLibrary:
    """Records its calls; ``errors`` maps a file name to the reason it fails."""

    def __init__(self) -> None:
        self.collections = FakeCollections()
        self.gate = threading.Event()
        self.gate.set()  # open: nothing waits unless a test clears it
        self.errors: dict[str, str] = {}
        self.indexed: dict[str, DocumentStatus] = {}
        self.add_calls: list[list[str]] = []
        self.context_calls: list[tuple[list[str], str, int, set[str]]] = []
        self.count: Callable[[str], int] | None = None  # the last search's token counter
        self.context_error: Exception | None = None
        self.cancelled = threading.Event()
        self.closed = False

    def expand(self, paths: Sequence[Path]) -> list[Path]:
        out: list[Path] = []
        for p in paths:
            if p.is_dir():
                out.extend(f for f in p.rglob("*") if f.suffix.lower() in SUFFIXES)
            else:
                out.append(p)
        return sorted(set(out))

    def _wait(self, cancel: threading.Event | None) -> None:
        while not self.gate.wait(0.02):
            if cancel is not None and cancel.is_set():
                self.cancelled.set()
                raise DocumentCancelled("Indexing was cancelled.")
        if cancel is not None and cancel.is_set():
            self.cancelled.set()
            raise DocumentCancelled("Cancelled.")

    def add(
        self,
        paths: Sequence[Path],
        progress: Callable[[Any], None],
        cancel: threading.Event,
    ) -> list[DocumentStatus]:
        self.add_calls.append([str(p) for p in paths])
        out = []
        for i, p in enumerate(paths):
            progress(Progress(i, len(paths), p.name, i / max(1, len(paths)), "embedding"))
            self._wait(cancel)
            reason = self.errors.get(p.name, "")
            state: DocState = "error" if reason else "ready"
            status = DocumentStatus(str(p), p.name, "text", state, reason, 0 if reason else 3, None)
            self.indexed[str(p)] = status
            out.append(status)
        progress(Progress(len(paths), len(paths), "", 1.0, "done"))
        return out

    def status(self, paths: Sequence[str]) -> list[DocumentStatus]:
        out = []
        for p in paths:
            name = Path(p).name
            if not Path(p).exists():
                out.append(DocumentStatus(p, name, "text", "error", f"{name} is missing."))
            else:
                out.append(self.indexed.get(p, DocumentStatus(p, name, "text", "queued")))
        return out

    def context_for(
        self,
        paths: Sequence[str],
        query: str,
        room_tokens: int,
        given_whole: set[str],
        cancel: threading.Event | None = None,
        count: Callable[[str], int] | None = None,
    ) -> list[Source]:
        self.context_calls.append((list(paths), query, room_tokens, set(given_whole)))
        self.count = count
        self._wait(cancel)
        if self.context_error is not None:
            raise self.context_error
        return [Source(1, paths[0], Path(paths[0]).name, "the passage", None, 1, 2, 0)]

    def take_notes(self) -> list[str]:
        return []

    def close(self) -> None:
        self.closed = True


def fake_embed(texts: Sequence[str]) -> npt.NDArray[np.float32]:
    """A hashed bag of words as a unit vector: texts sharing words point alike."""
    out = np.zeros((len(texts), DIM), dtype=np.float32)
    for i, text in enumerate(texts):
        for word in re.findall(r"\w+", text.lower()):
            h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=4).digest(), "little")
            out[i, h % DIM] += 1.0
        norm = float(np.linalg.norm(out[i]))
        out[i] = out[i] / norm if norm else out[i]
        if not norm:
            out[i, 0] = 1.0
    return out


def document(path: str, paragraphs: Sequence[str], page: int | None = None) -> ParsedDocument:
    """A document of ``paragraphs`` separated by blank lines, each a block at its line."""
    blocks = []
    line = 1
    for text in paragraphs:
        blocks.append(Block(text, page, line))
        line += text.count("\n") + 2
    return ParsedDocument(path, "text", path.rsplit("/", 1)[-1], tuple(blocks), None)
