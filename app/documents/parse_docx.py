"""Word (.docx) text with the standard library: the zip read with limits, its XML streamed
through expat (no tree, so deep nesting costs nothing; a DTD or entity is refused).

``line`` is the paragraph number (a table row counts as one). Pages come from explicit
page breaks and the breaks Word recorded when it last laid the document out; a document
with neither has no page numbers.
"""

from __future__ import annotations

import io
import zipfile
from xml.parsers import expat

from app.documents.parse_text import RawBlock, split_long
from app.util.errors import DocumentError

MAX_MEMBERS = 5000
MAX_XML_BYTES = 64 * 1024 * 1024
_W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main "
_DOCUMENT = "word/document.xml"


class _Refused(Exception):
    """The XML declares a DTD or an entity."""


class _Body:
    """expat handlers that collect paragraphs and table rows in document order."""

    def __init__(self) -> None:
        self.blocks: list[RawBlock] = []
        self.page = 1
        self.breaks = False
        self.title = ""
        self.heading = ""
        self._count = 0  # paragraphs (and table rows) seen, for ``line``
        self._paras: list[tuple[list[str], int | None, str]] = []  # text, page, style
        self._rows: list[list[list[str]]] = []  # open table rows: cells of paragraphs
        self._in_text = 0
        self._text_since_break = True

    def start(self, tag: str, attrs: dict[str, str]) -> None:
        if not tag.startswith(_W):
            return
        local = tag[len(_W) :]
        if local == "p":
            self._paras.append(([], None, ""))
        elif local == "t":
            self._in_text += 1
        elif local == "tab":
            self._add("\t")
        elif local in ("br", "cr"):
            if attrs.get(_W + "type") == "page":
                self._break()
            else:
                self._add(" ")
        elif local == "lastRenderedPageBreak":
            self._break()
        elif local == "pStyle" and self._paras:
            parts, page, _ = self._paras[-1]
            self._paras[-1] = (parts, page, attrs.get(_W + "val", ""))
        elif local == "tr":
            self._rows.append([])
        elif local == "tc" and self._rows:
            self._rows[-1].append([])

    def end(self, tag: str) -> None:
        if not tag.startswith(_W):
            return
        local = tag[len(_W) :]
        if local == "t":
            self._in_text = max(0, self._in_text - 1)
        elif local == "p" and self._paras:
            self._end_paragraph(*self._paras.pop())
        elif local == "tr" and self._rows:
            cells = self._rows.pop()
            row = " | ".join(" ".join(c) for c in cells if any(c))
            if self._rows and self._rows[-1]:
                self._rows[-1][-1].append(row)  # a table inside a table cell
            else:
                self._emit(row)

    def data(self, text: str) -> None:
        if self._in_text:
            self._add(text)

    def _add(self, text: str) -> None:
        if not self._paras:
            return
        parts, page, style = self._paras[-1]
        if page is None and text.strip():
            self._paras[-1] = (parts, self.page, style)  # the page its first text is on
            self._text_since_break = True
        parts.append(text)

    def _break(self) -> None:
        # Word also records the break it laid out right after an explicit one: count once.
        if self._text_since_break:
            self.page += 1
            self.breaks = True
            self._text_since_break = False

    def _end_paragraph(self, parts: list[str], page: int | None, style: str) -> None:
        text = " ".join("".join(parts).split())
        if self._rows and self._rows[-1]:
            if text:
                self._rows[-1][-1].append(text)
            return
        if text and style.lower() == "title" and not self.title:
            self.title = text
        elif text and style.lower().startswith("heading") and not self.heading:
            self.heading = text
        self._emit(text, page)

    def _emit(self, text: str, page: int | None = None) -> None:
        self._count += 1
        if text:
            self.blocks.extend(split_long(text, page or self.page, self._count))


def _refuse(*_args: object) -> None:
    raise _Refused


def _read_body(z: zipfile.ZipFile, name: str) -> _Body:
    try:
        info = z.getinfo(_DOCUMENT)
    except KeyError:
        raise DocumentError(
            f"Lamplight could not read {name}: it is not a Word document (no document text "
            "inside). Save it again as a .docx file from a word processor."
        ) from None
    if info.flag_bits & 0x1:
        raise DocumentError(
            f"Lamplight could not read {name}: it is password-protected. Save an "
            "unprotected copy and add that instead."
        )
    if info.file_size > MAX_XML_BYTES:
        raise _too_big(name)
    body = _Body()
    parser = expat.ParserCreate(namespace_separator=" ")
    parser.StartElementHandler = body.start
    parser.EndElementHandler = body.end
    parser.CharacterDataHandler = body.data
    parser.StartDoctypeDeclHandler = _refuse
    parser.EntityDeclHandler = _refuse
    read = 0
    with z.open(info) as member:
        while chunk := member.read(1 << 20):
            read += len(chunk)
            if read > MAX_XML_BYTES:  # the header's size is checked by zipfile too
                raise _too_big(name)
            parser.Parse(chunk, False)
        parser.Parse(b"", True)
    return body


def _too_big(name: str) -> DocumentError:
    return DocumentError(
        f"Lamplight could not read {name}: its text unpacks to more than "
        f"{MAX_XML_BYTES // (1 << 20)} MB."
    )


def parse_docx(data: bytes, name: str) -> tuple[str, list[RawBlock], int | None]:
    """(title, blocks, pages: None when the document records no page breaks)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            if len(z.infolist()) > MAX_MEMBERS:
                raise DocumentError(
                    f"Lamplight could not read {name}: it holds more than {MAX_MEMBERS} parts."
                )
            body = _read_body(z, name)
    except _Refused:
        raise DocumentError(
            f"Lamplight could not read {name}: it declares XML entities, which Word never "
            "writes. Save it again from a word processor."
        ) from None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, expat.ExpatError, EOFError) as exc:
        raise DocumentError(
            f"Lamplight could not read {name}: the file is damaged or not a Word document ({exc})."
        ) from exc
    if not body.breaks:
        blocks: list[RawBlock] = [(text, None, line) for text, _page, line in body.blocks]
        return body.title or body.heading, blocks, None
    return body.title or body.heading, body.blocks, body.page
