"""Real document files for the tests, written by hand: PDF, Word (.docx) and HTML.

The PDF is minimal but valid (catalog, page tree, one Type1 Helvetica font, one content
stream per page, a computed cross-reference table); every line of a page is shown with
``Tj`` and moved down with ``Td``, so pypdf gives the lines back in order.
"""

from __future__ import annotations

import html
import io
import zipfile
from collections.abc import Sequence
from pathlib import Path

W_NS = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"


def _pdf_string(text: str) -> str:
    return "(" + text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)") + ")"


def pdf_bytes(pages: Sequence[Sequence[str]], contents: dict[int, bytes] | None = None) -> bytes:
    """A PDF whose page i shows ``pages[i]``, one line each; ``contents`` replaces the
    content stream (the whole ``<< … >> stream … endstream`` object body) of a page."""
    n = len(pages)
    font = 3 + 2 * n
    objs = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{' '.join(f'{3 + 2 * i} 0 R' for i in range(n))}] "
        f"/Count {n} >>".encode(),
    ]
    for i, lines in enumerate(pages):
        objs.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {4 + 2 * i} 0 R "
            f"/Resources << /Font << /F1 {font} 0 R >> >> >>".encode()
        )
        ops = ["BT /F1 12 Tf 72 720 Td"]
        for j, line in enumerate(lines):
            ops.append(("" if j == 0 else "0 -16 Td ") + f"{_pdf_string(line)} Tj")
        ops.append("ET")
        body = "\n".join(ops).encode("latin-1")
        stream = b"<< /Length %d >>\nstream\n" % len(body) + body + b"\nendstream"
        objs.append((contents or {}).get(i, stream))
    objs.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, obj in enumerate(objs):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % (i + 1) + obj + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    for off in offsets:
        out += b"%010d 00000 n \n" % off
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)
    return bytes(out)


def write_pdf(path: Path, pages: list[list[str]]) -> Path:
    """A PDF with one page per entry of ``pages``, each a list of text lines."""
    path.write_bytes(pdf_bytes(pages))
    return path


def _run(text: str) -> str:
    return f'<w:r><w:t xml:space="preserve">{html.escape(text, quote=False)}</w:t></w:r>'


def docx_bytes(
    paragraphs: Sequence[str],
    page_break_after: int | None = None,
    *,
    heading: str | None = None,
    table: Sequence[Sequence[str]] | None = None,
    document_xml: bytes | None = None,
) -> bytes:
    """A .docx: an optional Heading1, the paragraphs (a page break after paragraph number
    ``page_break_after``, 1-based), then an optional table; ``document_xml`` replaces it all."""
    body = []
    if heading is not None:
        body.append(f'<w:p><w:pPr><w:pStyle w:val="Heading1"/></w:pPr>{_run(heading)}</w:p>')
    for i, text in enumerate(paragraphs, 1):
        brk = '<w:r><w:br w:type="page"/></w:r>' if i == page_break_after else ""
        body.append(f"<w:p>{_run(text)}{brk}</w:p>")
    if table:
        rows = "".join(
            "<w:tr>" + "".join(f"<w:tc><w:p>{_run(c)}</w:p></w:tc>" for c in row) + "</w:tr>"
            for row in table
        )
        body.append(f"<w:tbl>{rows}</w:tbl>")
    document = (
        document_xml
        or (
            f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
            f'<w:document xmlns:w="{W_NS}"><w:body>{"".join(body)}</w:body></w:document>'
        ).encode()
    )
    files = {
        "[Content_Types].xml": (
            b'<?xml version="1.0" encoding="UTF-8"?><Types xmlns="http://schemas.openxmlformats.'
            b'org/package/2006/content-types"><Default Extension="rels" ContentType="application/'
            b'vnd.openxmlformats-package.relationships+xml"/><Default Extension="xml" ContentType='
            b'"application/xml"/><Override PartName="/word/document.xml" ContentType="application'
            b'/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/></Types>'
        ),
        "_rels/.rels": (
            b'<?xml version="1.0" encoding="UTF-8"?><Relationships xmlns="http://schemas.'
            b'openxmlformats.org/package/2006/relationships"><Relationship Id="rId1" Type="http:'
            b"//schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument"
            b'" Target="word/document.xml"/></Relationships>'
        ),
        "word/document.xml": document,
    }
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for member, data in files.items():
            z.writestr(member, data)
    return buf.getvalue()


def write_docx(
    path: Path,
    paragraphs: list[str],
    page_break_after: int | None = None,
    *,
    heading: str | None = None,
    table: list[list[str]] | None = None,
) -> Path:
    """A Word document (see :func:`docx_bytes`)."""
    path.write_bytes(docx_bytes(paragraphs, page_break_after, heading=heading, table=table))
    return path


def html_text(title: str, paragraphs: Sequence[str]) -> str:
    """An HTML page: a head with a title, style and script, then one <p> per line."""
    body = "\n".join(f"<p>{html.escape(p)}</p>" for p in paragraphs)
    return (
        "<!DOCTYPE html>\n<html>\n<head>\n"
        f"<title>{html.escape(title)}</title>\n"
        "<style>p { color: red }</style>\n<script>var hidden = 'script text';</script>\n"
        f"</head>\n<body>\n{body}\n</body>\n</html>\n"
    )


def write_html(path: Path, title: str, paragraphs: list[str]) -> Path:
    """An HTML page; paragraph i is on line 8 + i (1-based i)."""
    path.write_text(html_text(title, paragraphs), encoding="utf-8")
    return path
