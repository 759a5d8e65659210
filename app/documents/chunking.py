"""A parsed document cut into passages (chunks) for the index, each knowing where it is.

Consecutive blocks of one page are packed into a chunk up to ``max_chars``; a block is
split only when it alone is longer, at a paragraph, sentence or word boundary. The next
chunk may begin with the tail of the block before it (at most ``overlap_chars``), so a
sentence cut at a boundary is still found whole in one of the two. Chunks never cross
pages, and ``line``/``end_line`` are the first and last lines (1-based, inclusive) of
the chunk in its page's text (the document's text when it has no pages), so a citation
can point at them. Deterministic: the same document gives the same chunks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import groupby

from app.documents.parse import ParsedDocument

_SEPARATOR = "\n\n"
# Where a too-long block is best cut: after a paragraph, a line, a sentence, a clause.
_BREAKS = (
    re.compile(r"\n\s*\n"),
    re.compile(r"\n"),
    re.compile(r"[.!?…。]\s"),
    re.compile(r"[;:,]\s"),
)
_SPACE = re.compile(r"\s")


@dataclass(frozen=True)
class Chunk:
    """One passage: ``ord`` its position among the document's chunks (from 0)."""

    ord: int
    text: str
    page: int | None
    line: int
    end_line: int


@dataclass(frozen=True)
class _Piece:
    """A block (or part of one) with its first and last line."""

    text: str
    line: int
    end_line: int


def chunk_document(
    doc: ParsedDocument, max_chars: int = 900, overlap_chars: int = 120
) -> list[Chunk]:
    """``doc``'s blocks packed into chunks of at most ``max_chars`` characters."""
    max_chars = max(16, max_chars)
    overlap_chars = max(0, min(overlap_chars, max_chars // 2))
    chunks: list[Chunk] = []
    for page, blocks in groupby(doc.blocks, key=lambda b: b.page):
        pieces: list[_Piece] = []
        for block in blocks:
            pieces.extend(_split(block.text, max(1, block.line), max_chars))
        for text, line, end_line in _pack(pieces, max_chars, overlap_chars):
            chunks.append(Chunk(len(chunks), text, page, line, end_line))
    return chunks


def _pack(pieces: list[_Piece], max_chars: int, overlap_chars: int) -> list[tuple[str, int, int]]:
    """Consecutive pieces joined while they fit; each chunk after the first starts with the
    tail of the piece before it when that still fits."""
    out: list[tuple[str, int, int]] = []
    current: list[_Piece] = []
    size = 0
    for piece in pieces:
        if current and size + len(_SEPARATOR) + len(piece.text) > max_chars:
            out.append(_joined(current))
            tail = _tail(current[-1], overlap_chars)
            current, size = [], 0
            if tail is not None and len(tail.text) + len(_SEPARATOR) + len(piece.text) <= max_chars:
                current, size = [tail], len(tail.text)
        size += (len(_SEPARATOR) if current else 0) + len(piece.text)
        current.append(piece)
    if current:
        out.append(_joined(current))
    return out


def _joined(pieces: list[_Piece]) -> tuple[str, int, int]:
    return _SEPARATOR.join(p.text for p in pieces), pieces[0].line, pieces[-1].end_line


def _tail(piece: _Piece, overlap_chars: int) -> _Piece | None:
    """The last ``overlap_chars`` (or fewer) of ``piece``, starting at a word; None when
    there is none (no overlap asked, or one word longer than that)."""
    if overlap_chars <= 0:
        return None
    if len(piece.text) <= overlap_chars:
        return None  # the whole piece again: not an overlap but a repeat
    start = len(piece.text) - overlap_chars
    space = _SPACE.search(piece.text, start)
    if space is None:
        return None
    return _piece(piece.text, space.end(), len(piece.text), piece.line)


def _split(text: str, line: int, max_chars: int) -> list[_Piece]:
    """``text`` (starting at ``line``) as pieces of at most ``max_chars``, cut at the best
    boundary in the second half of each window (else at a space, else anywhere)."""
    pieces: list[_Piece] = []
    pos, end = 0, len(text)
    while pos < end:
        fits = end - pos <= max_chars
        cut = end if fits else pos + _cut(text[pos : pos + max_chars], max_chars)
        piece = _piece(text, pos, cut, line)
        if piece is not None:
            pieces.append(piece)
        pos = cut
    return pieces


def _cut(window: str, max_chars: int) -> int:
    """Where to end a piece that starts at the window's start (> 0)."""
    for pattern in _BREAKS:
        ends = [m.end() for m in pattern.finditer(window) if m.end() > max_chars // 2]
        if ends:
            return ends[-1]
    spaces = [m.end() for m in _SPACE.finditer(window) if m.end() > max_chars // 4]
    return spaces[-1] if spaces else max_chars


def _piece(text: str, start: int, stop: int, line: int) -> _Piece | None:
    """``text[start:stop]`` without surrounding white space, with its own first and last
    lines (``line`` is the line ``text`` starts on); None when it is all white space."""
    part = text[start:stop]
    stripped = part.strip()
    if not stripped:
        return None
    lead = len(part) - len(part.lstrip())
    first = line + text.count("\n", 0, start + lead)
    return _Piece(stripped, first, first + stripped.count("\n"))
