"""Passages given to the model with a user message, as saved with it and as it reads them.

A ``Source`` is a copy of the passage (its text, where it was in the file, and which
file): a reopened chat shows, and sends, the same text even when the file changed
since. ``with_sources`` is the only place that turns them into prompt text, so the
window, snapshots and every backend see the same bytes, and a follow-up turn finds
the whole earlier turn, passages included, in the KV cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

MAX_SOURCES = 16  # per message, read back from a transcript
MAX_SOURCE_CHARS = 2_000_000  # one whole document; more is cut when read back
_NAME_MAX = 255
_PATH_MAX = 4096


@dataclass(frozen=True)
class Source:
    """One passage (or a whole document, ``whole``) given with a message.

    ``n``: its number in the message, from 1, as the model and the citations show it.
    ``path``: the file when it was read (absolute); ``name``: what the user sees.
    ``page``: 1-based page for paged formats (PDF, DOCX page hints), else None.
    ``line``/``end_line``: 1-based lines of the passage in the document's text (in the
    page's text when ``page`` is set). ``chunk``: the passage's position among the
    document's chunks (-1 for a whole document). ``score``: the fused retrieval score.
    """

    n: int
    path: str
    name: str
    text: str
    page: int | None = None
    line: int = 1
    end_line: int = 1
    chunk: int = -1
    whole: bool = False
    score: float = 0.0

    def where(self) -> str:
        """Where the passage is, for people: "report.pdf, page 3, lines 4–9"."""
        parts = [self.name]
        if self.whole:
            parts.append("whole document")
        else:
            if self.page is not None:
                parts.append(f"page {self.page}")
            if self.end_line > self.line:
                parts.append(f"lines {self.line}–{self.end_line}")
            else:
                parts.append(f"line {self.line}")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _int(value: object, default: int, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        return default
    return min(max(value, low), high)


def source_from_dict(data: object) -> Source | None:
    """A saved source read defensively (None when it is not one)."""
    if not isinstance(data, dict):
        return None
    text, path, name = data.get("text"), data.get("path"), data.get("name")
    if not isinstance(text, str) or not isinstance(path, str) or not isinstance(name, str):
        return None
    page = data.get("page")
    line = _int(data.get("line"), 1, 1, 10**9)
    score = data.get("score")
    return Source(
        n=_int(data.get("n"), 1, 1, MAX_SOURCES),
        path=path[:_PATH_MAX],
        name=name[:_NAME_MAX],
        text=text[:MAX_SOURCE_CHARS],
        page=_int(page, 1, 1, 10**7) if page is not None else None,
        line=line,
        end_line=_int(data.get("end_line"), line, line, 10**9),
        chunk=_int(data.get("chunk"), -1, -1, 10**9),
        whole=data.get("whole") is True,
        score=float(score) if isinstance(score, (int, float)) and score == score else 0.0,
    )


def sources_from_list(data: object) -> list[Source]:
    """The sources of a saved message (at most ``MAX_SOURCES``, bad entries skipped)."""
    if not isinstance(data, list):
        return []
    out = [s for s in (source_from_dict(d) for d in data[: MAX_SOURCES * 4]) if s is not None]
    return out[:MAX_SOURCES]


def with_sources(text: str, sources: Sequence[Source]) -> str:
    """The user turn's text as the model reads it: the passages, numbered, then the
    message. Without sources it is ``text`` itself, so old chats render as before."""
    if not sources:
        return text
    blocks = []
    for s in sources:
        head = f"[{s.n}] {s.where()}"
        blocks.append(f"{head}\n{s.text.strip()}")
    intro = (
        "Use these documents to answer. Cite them by number, like [1]."
        if any(not s.whole for s in sources)
        else "Documents the user attached:"
    )
    return intro + "\n\n" + "\n\n".join(blocks) + "\n\n" + text
