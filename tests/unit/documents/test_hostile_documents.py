"""Hostile and damaged documents (issue 31): a DocumentError with a readable message or a
parsed document, never another exception, never a long wait, never a huge allocation.

Inputs: small valid PDF, DOCX and HTML files with bytes flipped, inserted or cut off
(Hypothesis), and crafted files: a flate bomb, deep nesting, a zip bomb, XML entities,
a file too large, binary data named .txt.
"""

from __future__ import annotations

import io
import struct
import tempfile
import time
import zipfile
import zlib
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.documents.parse import ParsedDocument, parse_file
from app.documents.parse_child import parse_bounded
from app.util.errors import DocumentError
from tests.document_files import docx_bytes, html_text, pdf_bytes
from tests.hypothesis_budget import examples

TIME_BUDGET_S = 3.0
W_NS = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"


@cache
def sample(suffix: str) -> bytes:
    if suffix == ".pdf":
        return pdf_bytes([["Alpha one", "alpha (two)"], ["Beta one"]])
    if suffix == ".docx":
        return docx_bytes(["One", "Two"], 1, heading="Head", table=[["a", "b"]])
    return html_text("T", ["One & two", "<b>three</b>"]).encode()


def readable(exc: DocumentError, name: str) -> bool:
    text = str(exc)
    return name in text and 10 < len(text) < 400 and text[0].isupper() and text.endswith(".")


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="lamplight-docs-") as d:
        yield Path(d)


def parse_bytes(
    scratch: Path, name: str, data: bytes, budget_s: float = TIME_BUDGET_S
) -> ParsedDocument | DocumentError:
    f = scratch / name
    f.write_bytes(data)
    t0 = time.monotonic()
    try:
        return parse_file(f)
    except DocumentError as exc:
        assert readable(exc, name), str(exc)
        return exc
    finally:
        assert time.monotonic() - t0 < budget_s


@st.composite
def mutated(draw: st.DrawFn, suffix: str) -> bytes:
    data = bytearray(sample(suffix))
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "cut"]))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "flip" and data:
            data[at] = draw(st.integers(0, 255))
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete":
            del data[at : at + draw(st.integers(1, 32))]
        else:
            del data[at:]
    return bytes(data)


FUZZ = settings(
    max_examples=examples(200),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@FUZZ
@given(data=mutated(".pdf"))
def test_mutated_pdf(scratch: Path, data: bytes) -> None:
    parse_bytes(scratch, "m.pdf", data)


@FUZZ
@given(data=mutated(".docx"))
def test_mutated_docx(scratch: Path, data: bytes) -> None:
    parse_bytes(scratch, "m.docx", data)


@FUZZ
@given(data=mutated(".html"))
def test_mutated_html(scratch: Path, data: bytes) -> None:
    parse_bytes(scratch, "m.html", data)


def flate_bomb_pdf(megabytes: int = 100) -> bytes:
    """A page whose content stream inflates to ``megabytes`` MB of spaces."""
    packer = zlib.compressobj(1)
    chunk = b" " * (1 << 20)
    packed = b"".join(packer.compress(chunk) for _ in range(megabytes)) + packer.flush()
    stream = b"<< /Filter /FlateDecode /Length %d >>\nstream\n" % len(packed)
    return pdf_bytes([["x"]], contents={0: stream + packed + b"\nendstream"})


def nested_pdf(depth: int = 200_000) -> bytes:
    body = b"BT /F1 12 Tf 72 720 Td " + b"[" * depth + b"]" * depth + b" TJ ET"
    return pdf_bytes(
        [["x"]], contents={0: b"<< /Length %d >>\nstream\n" % len(body) + body + b"\nendstream"}
    )


def test_flate_bomb_pdf_is_refused(scratch: Path) -> None:
    result = parse_bytes(scratch, "bomb.pdf", flate_bomb_pdf())
    assert isinstance(result, DocumentError)
    assert "unpacks to more data" in str(result)


def test_deeply_nested_pdf_array(scratch: Path) -> None:
    result = parse_bytes(scratch, "deep.pdf", nested_pdf())
    assert isinstance(result, DocumentError)  # the only page is unreadable: no text


def test_deeply_nested_html(scratch: Path) -> None:
    # html.parser itself takes about a second here; the point is no recursion, no stack.
    result = parse_bytes(scratch, "deep.html", b"<div>" * 200_000 + b"deep text", 15.0)
    assert isinstance(result, ParsedDocument)
    assert [b.text for b in result.blocks] == ["deep text"]


def test_zip_bomb_docx_is_refused_before_inflating(scratch: Path) -> None:
    buf = io.BytesIO()
    with (
        zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z,
        z.open("word/document.xml", "w", force_zip64=True) as member,
    ):
        member.write(f'<w:document xmlns:w="{W_NS}"><w:body>'.encode())
        for _ in range(80):
            member.write(b" " * (1 << 20))
        member.write(b"</w:body></w:document>")
    result = parse_bytes(scratch, "bomb.docx", buf.getvalue())
    assert isinstance(result, DocumentError)
    assert "unpacks to more than 64 MB" in str(result)


def test_zip_bomb_docx_that_lies_about_its_size(scratch: Path) -> None:
    """The zip says 1000 bytes: reading stops there (zipfile keeps to the declared size)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        z.writestr(
            "word/document.xml", f'<w:document xmlns:w="{W_NS}">'.encode() + b" " * (80 << 20)
        )
    data = bytearray(buf.getvalue())
    data[22:26] = struct.pack("<I", 1000)  # the local header's uncompressed size
    central = data.rfind(b"PK\x01\x02")
    data[central + 24 : central + 28] = struct.pack("<I", 1000)  # and the central directory's
    result = parse_bytes(scratch, "liar.docx", bytes(data))
    assert isinstance(result, DocumentError)


@pytest.mark.parametrize(
    "prolog",
    [
        '<!DOCTYPE w:document [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;">]>',
        "<!DOCTYPE w:document SYSTEM 'file:///etc/passwd'>",
    ],
    ids=["entities", "external-dtd"],
)
def test_docx_with_a_dtd_is_refused(scratch: Path, prolog: str) -> None:
    xml = (
        f'<?xml version="1.0"?>{prolog}<w:document xmlns:w="{W_NS}"><w:body><w:p><w:r>'
        "<w:t>&b;</w:t></w:r></w:p></w:body></w:document>"
    )
    result = parse_bytes(scratch, "ent.docx", docx_bytes([], document_xml=xml.encode()))
    assert isinstance(result, DocumentError)
    assert "declares XML entities" in str(result)


@pytest.mark.parametrize(("name", "mb"), [("huge.pdf", 70), ("huge.txt", 17)])
def test_a_file_too_large_is_refused_by_its_size(scratch: Path, name: str, mb: int) -> None:
    f = scratch / name
    with f.open("wb") as out:
        out.truncate(mb * 1024 * 1024)  # sparse: nothing written
    try:
        with pytest.raises(DocumentError, match=rf"cannot read {name}: it is {mb} MB"):
            parse_file(f)
    finally:
        f.unlink()


def test_binary_named_txt(scratch: Path) -> None:
    result = parse_bytes(scratch, "data.txt", bytes(range(256)) * 64)
    assert isinstance(result, DocumentError)
    assert "not a text file" in str(result)


def test_hostile_files_in_the_child_process(scratch: Path) -> None:
    """The same files through parse_bounded: clean errors, quickly, no child left over."""
    cases = {
        "bomb.pdf": flate_bomb_pdf(),
        "deep.pdf": nested_pdf(),
        "deep.html": b"<div>" * 200_000 + b"deep text",
    }
    for name, data in cases.items():
        f = scratch / name
        f.write_bytes(data)
        t0 = time.monotonic()
        try:
            doc = parse_bounded(f, timeout_s=20)
        except DocumentError as exc:
            assert readable(exc, name), str(exc)
        else:
            assert name == "deep.html" and doc.blocks[0].text == "deep text"
        assert time.monotonic() - t0 < 15
