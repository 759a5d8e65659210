"""Plain text, Markdown and source code: decoding, and splitting into numbered blocks.

Also the block helpers the other readers share: a raw block is ``(text, page, line)``
with ``line`` the 1-based first line of the block within its page (or the document).
"""

from __future__ import annotations

import re

from app.util.errors import DocumentError

RawBlock = tuple[str, int | None, int]
MAX_BLOCK_CHARS = 2000  # longer paragraphs are cut at line ends, so lines stay exact

_HEADING = re.compile(r"^(#{1,6}\s|=+\s*$|-+\s*$)")
_FENCE = re.compile(r"^\s*(```|~~~)")
_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def decode_text(data: bytes, name: str) -> str:
    """UTF-8 (with or without BOM), UTF-16 with a BOM, else Latin-1 when no NUL byte."""
    if data.startswith(_UTF16_BOMS):
        try:
            return data.decode("utf-16")
        except UnicodeDecodeError as exc:
            raise DocumentError(
                f"Lamplight could not read {name}: its UTF-16 text is damaged."
            ) from exc
    if b"\x00" in data:
        raise DocumentError(
            f"Lamplight could not read {name}: it is not a text file (it holds binary data). "
            "Add PDF, Word (.docx), HTML, Markdown, text or source files."
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return data.decode("latin-1")  # older Windows/ISO text: every byte is a character


def split_long(text: str, page: int | None, line: int) -> list[RawBlock]:
    """``text`` as one block, or cut at line ends (a huge line at characters) when long."""
    if len(text) <= MAX_BLOCK_CHARS:
        return [(text, page, line)]
    out: list[RawBlock] = []
    part: list[str] = []
    size, start = 0, line
    for i, row in enumerate(text.split("\n")):
        if part and size + len(row) > MAX_BLOCK_CHARS:
            out.append(("\n".join(part), page, start))
            part, size, start = [], 0, line + i
        while len(row) > MAX_BLOCK_CHARS:  # one enormous line (minified code): same line
            out.append((row[:MAX_BLOCK_CHARS], page, line + i))
            row = row[MAX_BLOCK_CHARS:]
            start = line + i
        part.append(row)
        size += len(row) + 1
    if any(p.strip() for p in part):
        out.append(("\n".join(part), page, start))
    return out


def paragraphs(text: str, page: int | None, markdown: bool = False) -> list[RawBlock]:
    """Blocks separated by blank lines, each with its 1-based first line. In Markdown a
    heading starts a block too (outside fenced code)."""
    out: list[RawBlock] = []
    part: list[str] = []
    start = 1
    fenced = False

    def flush() -> None:
        body = "\n".join(part).rstrip()
        if body.strip():  # ``part`` starts at a non-blank row, so ``start`` is its line
            out.extend(split_long(body, page, start))
        part.clear()

    for no, row in enumerate(text.splitlines(), 1):
        if markdown and _FENCE.match(row):
            fenced = not fenced
        if not row.strip() and not fenced:
            flush()
            continue
        if markdown and not fenced and row.startswith("#") and _HEADING.match(row):
            flush()
        if not part:
            start = no
        part.append(row)
    flush()
    return out


def markdown_title(blocks: list[RawBlock]) -> str:
    """The first ``#`` heading's text, or ''."""
    for text, _page, _line in blocks:
        first = text.split("\n", 1)[0]
        if first.startswith("#") and _HEADING.match(first):
            return first.lstrip("#").strip()
    return ""


def parse_text(data: bytes, name: str, kind: str) -> tuple[str, list[RawBlock]]:
    """(title, blocks) of a text, Markdown or code file."""
    text = decode_text(data, name)
    blocks = paragraphs(text, None, markdown=kind == "markdown")
    title = markdown_title(blocks) if kind == "markdown" else ""
    return title, blocks
