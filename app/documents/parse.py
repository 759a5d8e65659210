"""Reading a document into text blocks that know where they came from (page, line).

:func:`parse_file` runs in this process with bounded inputs; the app reads files the
user adds through :func:`app.documents.parse_child.parse_bounded`, which runs it in a
child process that a hostile file can only crash or stall.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from app.documents.parse_text import RawBlock, parse_text
from app.util.errors import DocumentError

log = logging.getLogger(__name__)

MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_TEXT_FILE_BYTES = 16 * 1024 * 1024  # text, Markdown, code, HTML
MAX_TEXT_CHARS = 4_000_000  # of extracted text per document; the rest is left out (logged)

_TEXT = {".txt": "text", ".text": "text", ".log": "text", ".csv": "text", ".tsv": "text"}
_MARKDOWN = {".md": "markdown", ".markdown": "markdown", ".rst": "markdown"}
_CODE_SUFFIXES = (
    ".py .pyi .js .mjs .cjs .jsx .ts .tsx .c .h .cc .cpp .cxx .hpp .hh .rs .go .java .kt "
    ".kts .scala .swift .m .mm .cs .fs .vb .rb .php .pl .pm .lua .r .jl .dart .ex .exs .erl "
    ".hs .ml .mli .clj .sh .bash .zsh .fish .ps1 .bat .cmd .toml .yaml .yml .json .jsonc "
    ".ini .cfg .conf .sql .css .scss .sass .less .xml .svg .tex .bib .cmake .gradle .proto "
    ".graphql .vue .svelte .zig .nim .v .sv .vhd .asm .s .mk .diff .patch .properties"
)
_CODE = {s: "code" for s in _CODE_SUFFIXES.split()}
_KINDS: dict[str, str] = {
    **_TEXT,
    **_MARKDOWN,
    **_CODE,
    ".html": "html",
    ".htm": "html",
    ".xhtml": "html",
    ".pdf": "pdf",
    ".docx": "docx",
}
_CODE_NAMES = {"makefile": "code", "dockerfile": "code", "cmakelists.txt": "code"}
SUPPORTED: frozenset[str] = frozenset(_KINDS)


@dataclass(frozen=True)
class Block:
    """A paragraph (or a few lines) of a document."""

    text: str
    page: int | None
    line: int  # 1-based first line within the page's text (the document's when no pages)


@dataclass(frozen=True)
class ParsedDocument:
    """A document's text in order, in blocks; ``pages`` is None for page-less kinds."""

    path: str
    kind: str  # "text", "markdown", "code", "html", "pdf" or "docx"
    title: str
    blocks: tuple[Block, ...]
    pages: int | None


def kind_for(path: Path) -> str | None:
    """The kind of document ``path`` holds, by its name; None when not supported."""
    name = path.name.lower()
    return _CODE_NAMES.get(name) or _KINDS.get(path.suffix.lower())


def parse_file(path: Path) -> ParsedDocument:
    """Read ``path`` (any supported kind); raises DocumentError with a message for the user."""
    name = path.name
    kind = kind_for(path)
    if kind is None:
        raise DocumentError(
            f"Lamplight cannot read {name}: it reads PDF, Word (.docx), HTML, Markdown, "
            "text and source code files."
        )
    data = _read(path, kind)
    try:
        title, raw, pages = _parse(data, name, kind)
    except DocumentError:
        raise
    except MemoryError as exc:  # the child's address-space limit
        raise DocumentError(f"Lamplight could not read {name}: it needs too much memory.") from exc
    except Exception as exc:  # untrusted bytes: any parser failure (RecursionError too)
        log.info("%s: %s: %s", name, type(exc).__name__, exc)
        raise DocumentError(
            f"Lamplight could not read {name}: the file is damaged or in a form it does "
            "not understand."
        ) from exc
    blocks = _bounded(raw, name)
    if not blocks:
        hint = " (a scanned PDF holds pictures of text, not text)" if kind == "pdf" else ""
        raise DocumentError(f"Lamplight found no text in {name}{hint}.")
    return ParsedDocument(str(path), kind, title or path.stem, blocks, pages)


def _read(path: Path, kind: str) -> bytes:
    name = path.name
    limit = MAX_FILE_BYTES if kind in ("pdf", "docx") else MAX_TEXT_FILE_BYTES
    try:
        size = path.stat().st_size
        if size > limit:
            raise DocumentError(
                f"Lamplight cannot read {name}: it is {size / (1 << 20):.0f} MB, and "
                f"{limit // (1 << 20)} MB is the most it reads from a {kind} file."
            )
        with path.open("rb") as f:
            data = f.read(limit + 1)  # the file may have grown since stat
    except OSError as exc:
        raise DocumentError(
            f"Lamplight could not open {name} ({exc.strerror or exc}). Check that it "
            "exists and that you may read it."
        ) from exc
    if len(data) > limit:
        raise DocumentError(f"Lamplight cannot read {name}: it is larger than {limit} bytes.")
    return data


def _parse(data: bytes, name: str, kind: str) -> tuple[str, list[RawBlock], int | None]:
    if kind == "pdf":
        from app.documents.parse_pdf import parse_pdf

        return parse_pdf(data, name, MAX_TEXT_CHARS)
    if kind == "docx":
        from app.documents.parse_docx import parse_docx

        return parse_docx(data, name)
    if kind == "html":
        from app.documents.parse_html import parse_html

        return (*parse_html(data, name), None)
    return (*parse_text(data, name, kind), None)


def _bounded(raw: list[RawBlock], name: str) -> tuple[Block, ...]:
    """Blocks up to MAX_TEXT_CHARS in all (the rest is dropped and logged)."""
    out: list[Block] = []
    total = 0
    for text, page, line in raw:
        if total + len(text) > MAX_TEXT_CHARS:
            log.warning("%s: text cut at %d characters (of more)", name, total)
            break
        total += len(text)
        out.append(Block(text, page, max(1, line)))
    return tuple(out)
