"""Reading documents (issue 31): every kind gives its text in blocks with the right page
and line, and the child process that reads them is killed on timeout, cancel or crash."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from app.documents import parse, parse_child
from app.documents.parse import Block, ParsedDocument, kind_for, parse_file
from app.documents.parse_child import doc_from_dict, doc_to_dict, parse_bounded
from app.util.errors import DocumentCancelled, DocumentError
from tests.document_files import write_docx, write_html, write_pdf

ROOT = Path(__file__).resolve().parents[3]


def texts(doc: ParsedDocument) -> list[tuple[str, int | None, int]]:
    return [(b.text, b.page, b.line) for b in doc.blocks]


def test_kinds_by_suffix() -> None:
    expected = {
        "a.txt": "text",
        "b.LOG": "text",
        "c.md": "markdown",
        "d.rst": "markdown",
        "e.py": "code",
        "f.rs": "code",
        "g.yaml": "code",
        "h.HTML": "html",
        "i.pdf": "pdf",
        "j.docx": "docx",
        "Makefile": "code",
        "k.doc": None,
        "l.png": None,
        "noext": None,
    }
    assert {n: kind_for(Path(n)) for n in expected} == expected
    assert ".pdf" in parse.SUPPORTED and ".docx" in parse.SUPPORTED


def test_text_paragraphs_with_their_first_line(tmp_path: Path) -> None:
    f = tmp_path / "notes.txt"
    f.write_text("first line\nsecond line\n\n\nthird para\n  \nlast\n", encoding="utf-8")
    doc = parse_file(f)
    assert (doc.kind, doc.title, doc.pages) == ("text", "notes", None)
    assert texts(doc) == [
        ("first line\nsecond line", None, 1),
        ("third para", None, 5),
        ("last", None, 7),
    ]


@pytest.mark.parametrize(
    "data",
    [
        "\ufeffcafé au lait".encode(),
        "café au lait".encode("utf-16"),  # with its BOM
        "café au lait".encode("latin-1"),
    ],
    ids=["utf-8-bom", "utf-16", "latin-1"],
)
def test_text_encodings(tmp_path: Path, data: bytes) -> None:
    f = tmp_path / "t.txt"
    f.write_bytes(data)
    assert texts(parse_file(f)) == [("café au lait", None, 1)]


def test_binary_named_txt_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "photo.txt"
    f.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    with pytest.raises(DocumentError, match=r"photo\.txt: it is not a text file"):
        parse_file(f)


def test_markdown_headings_start_blocks_but_not_inside_code(tmp_path: Path) -> None:
    f = tmp_path / "guide.md"
    f.write_text(
        "# The Guide\nIntro text.\n## Setup\nRun it.\n\n```sh\n# a comment\n\necho hi\n```\n",
        encoding="utf-8",
    )
    doc = parse_file(f)
    assert doc.title == "The Guide"
    assert texts(doc) == [
        ("# The Guide\nIntro text.", None, 1),
        ("## Setup\nRun it.", None, 3),
        ("```sh\n# a comment\n\necho hi\n```", None, 6),
    ]


def test_code_keeps_lines(tmp_path: Path) -> None:
    f = tmp_path / "tool.py"
    f.write_text("import os\n\n\ndef main():\n    return os.sep\n", encoding="utf-8")
    doc = parse_file(f)
    assert doc.kind == "code"
    assert texts(doc) == [("import os", None, 1), ("def main():\n    return os.sep", None, 4)]


def test_a_long_paragraph_is_cut_at_line_ends_with_exact_lines(tmp_path: Path) -> None:
    f = tmp_path / "long.txt"
    rows = [f"row {i} " + "x" * 90 for i in range(1, 101)]
    f.write_text("\n".join(rows), encoding="utf-8")
    blocks = parse_file(f).blocks
    assert len(blocks) > 1
    for b in blocks:
        assert len(b.text) <= 2000
        assert b.text.startswith(f"row {b.line} ")
    assert "".join(b.text.replace("\n", "") for b in blocks) == "".join(rows)


def test_html_visible_text_title_and_source_lines(tmp_path: Path) -> None:
    f = write_html(tmp_path / "page.html", "A Page", ["One & two", "Three"])
    doc = parse_file(f)
    assert (doc.kind, doc.title) == ("html", "A Page")
    assert texts(doc) == [("One & two", None, 9), ("Three", None, 10)]
    assert "script text" not in str(doc) and "color" not in str(doc)


def test_html_block_elements_end_paragraphs(tmp_path: Path) -> None:
    f = tmp_path / "x.htm"
    f.write_text("<body><div>a <b>bold</b> word<div>next</div>\n<ul><li>item</li></ul>", "utf-8")
    assert texts(parse_file(f)) == [("a bold word", None, 1), ("next", None, 1), ("item", None, 2)]


def test_pdf_three_pages(tmp_path: Path) -> None:
    f = write_pdf(
        tmp_path / "report.pdf",
        [["Alpha one", "alpha two"], ["Beta (paren) one"], ["Gamma one", "gamma two"]],
    )
    doc = parse_file(f)
    assert (doc.kind, doc.pages, doc.title) == ("pdf", 3, "report")
    assert texts(doc) == [
        ("Alpha one\nalpha two", 1, 1),
        ("Beta (paren) one", 2, 1),
        ("Gamma one\ngamma two", 3, 1),
    ]


def test_pdf_with_a_password_is_refused_but_an_empty_one_opens(tmp_path: Path) -> None:
    from pypdf import PdfReader, PdfWriter

    plain = write_pdf(tmp_path / "plain.pdf", [["Secret text"]])
    for password, name in (("", "open.pdf"), ("hunter2", "locked.pdf")):
        writer = PdfWriter(clone_from=PdfReader(plain))
        writer.encrypt(user_password=password, owner_password="owner", algorithm="RC4-128")
        with (tmp_path / name).open("wb") as out:
            writer.write(out)
    assert texts(parse_file(tmp_path / "open.pdf")) == [("Secret text", 1, 1)]
    with pytest.raises(DocumentError, match=r"locked\.pdf: it is password-protected"):
        parse_file(tmp_path / "locked.pdf")


def test_pdf_without_text_says_so(tmp_path: Path) -> None:
    f = write_pdf(tmp_path / "scan.pdf", [[], []])
    with pytest.raises(DocumentError, match=r"no text in scan\.pdf \(a scanned PDF"):
        parse_file(f)


def test_docx_heading_paragraphs_table_and_page_break(tmp_path: Path) -> None:
    f = write_docx(
        tmp_path / "memo.docx",
        ["First paragraph.", "Second, then a break."],
        page_break_after=2,
        heading="Quarterly Memo",
        table=[["Name", "Score"], ["Ada", "10"]],
    )
    doc = parse_file(f)
    assert (doc.kind, doc.title, doc.pages) == ("docx", "Quarterly Memo", 2)
    assert texts(doc) == [
        ("Quarterly Memo", 1, 1),
        ("First paragraph.", 1, 2),
        ("Second, then a break.", 1, 3),
        ("Name | Score", 2, 4),
        ("Ada | 10", 2, 5),
    ]


def test_docx_without_breaks_has_no_pages(tmp_path: Path) -> None:
    doc = parse_file(write_docx(tmp_path / "short.docx", ["One", "", "Three"]))
    assert doc.pages is None
    assert texts(doc) == [("One", None, 1), ("Three", None, 3)]


def test_unsupported_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(DocumentError, match=r"cannot read a\.exe: it reads PDF"):
        parse_file(tmp_path / "a.exe")
    with pytest.raises(DocumentError, match=r"could not open gone\.md .*Check that it exists"):
        parse_file(tmp_path / "gone.md")
    (tmp_path / "blank.txt").write_text("\n  \n", encoding="utf-8")
    with pytest.raises(DocumentError, match=r"no text in blank\.txt\.$"):
        parse_file(tmp_path / "blank.txt")


def test_text_beyond_the_limit_is_left_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parse, "MAX_TEXT_CHARS", 25)
    f = tmp_path / "big.txt"
    f.write_text("aaaaaaaaaa\n\nbbbbbbbbbb\n\ncccccccccc\n", encoding="utf-8")
    assert [b.text for b in parse_file(f).blocks] == ["aaaaaaaaaa", "bbbbbbbbbb"]


def test_json_round_trip_and_malformed_answers() -> None:
    doc = ParsedDocument("/x/a.pdf", "pdf", "A", (Block("t", 1, 2), Block("u", 2, 1)), 2)
    assert doc_from_dict(doc_to_dict(doc)) == doc
    for bad in ({}, {"kind": "exe"}, {**doc_to_dict(doc), "blocks": [["t", "1", 2]]}):
        with pytest.raises((ValueError, TypeError, KeyError)):
            doc_from_dict(bad)


# -- the child process -----------------------------------------------------------


def our_children() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if p.is_running()]


def test_bounded_parse_matches_in_process(tmp_path: Path) -> None:
    f = write_pdf(tmp_path / "r.pdf", [["Page one"], ["Page two"], ["Page three"]])
    doc = parse_bounded(f)
    assert doc == parse_file(f)
    assert [b.page for b in doc.blocks] == [1, 2, 3]
    bad = tmp_path / "bin.txt"
    bad.write_bytes(b"\x00\x01\x02")
    with pytest.raises(DocumentError, match=r"bin\.txt: it is not a text file"):
        parse_bounded(bad)


def test_bounded_parse_times_out_and_kills_the_child(tmp_path: Path) -> None:
    f = write_pdf(tmp_path / "slow.pdf", [["x"]])
    before = {p.pid for p in our_children()}
    t0 = time.monotonic()
    with pytest.raises(DocumentError, match=r"could not read slow\.pdf: it took longer"):
        parse_bounded(f, timeout_s=0.01)
    assert time.monotonic() - t0 < 5
    assert {p.pid for p in our_children()} <= before


def test_bounded_parse_cancel_kills_the_child(tmp_path: Path) -> None:
    f = write_pdf(tmp_path / "c.pdf", [["x"]])
    cancel = threading.Event()
    timer = threading.Timer(0.02, cancel.set)
    timer.start()
    try:
        with pytest.raises(DocumentCancelled, match=r"c\.pdf"):
            parse_bounded(f, cancel=cancel, timeout_s=30)
    finally:
        timer.cancel()
    assert not [p for p in our_children() if "parse_child" in " ".join(p.cmdline())]


@pytest.mark.parametrize(
    "code",
    [
        "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)",
        "print('{not json')",
        'import sys; sys.stdout.write(\'{"ok": true, "doc": {"kind": "pdf"}}\')',
    ],
    ids=["crash", "garbage", "malformed"],
)
def test_a_child_that_crashes_or_talks_nonsense(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: str
) -> None:
    if code.startswith("import os, signal") and sys.platform == "win32":
        pytest.skip("no SIGSEGV by os.kill on Windows")
    monkeypatch.setattr(parse_child, "child_command", lambda: [sys.executable, "-c", code])
    with pytest.raises(DocumentError, match=r"could not read x\.md: the reader stopped"):
        parse_bounded(tmp_path / "x.md")


def test_the_app_sub_command_prints_json(tmp_path: Path) -> None:
    f = write_docx(tmp_path / "w.docx", ["Hello"])
    proc = subprocess.run(
        [sys.executable, "-m", "ui.main", "parse-document", str(f)],
        capture_output=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-500:]
    assert doc_from_dict(json.loads(proc.stdout)["doc"]) == parse_file(f)
