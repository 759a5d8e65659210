"""Citations: a message's "Sources" list in the transcript, its links, the document
viewer at the passage, and sources that are not what they should be."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PySide6.QtCore import QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QApplication, QPushButton
from pytestqt.qtbot import QtBot

from app.chat.conversation import Conversation, Message
from app.documents.sources import Source, sources_from_list
from tests.hypothesis_budget import examples
from ui.chat.citations import label, preview, sources_frame
from ui.chat.document_viewer import (
    CHANGED,
    MISSING,
    DocumentViewer,
    assemble,
    find_passage,
    load,
    location,
    open_viewer,
)
from ui.chat.transcript import TranscriptView

PAGE3 = "Intro line.\nThe yearly revenue grew by 12 percent,\nmostly in the north.\nEnd."


def two_sources(path: Path) -> list[Source]:
    return [
        Source(1, str(path), "report.pdf", "The yearly revenue grew by 12 percent,\nmostly in "
               "the north.", page=3, line=2, end_line=3, chunk=4, score=0.5),
        Source(2, str(path.with_name("notes.md")), "notes.md", "All of the notes.", whole=True),
    ]  # fmt: skip


def conversation(path: Path) -> list[Message]:
    sources = [s.to_dict() for s in two_sources(path)]
    return [
        Message("user", "How did revenue change?", sources=sources),
        Message("assistant", "It grew by 12 percent [1]."),
    ]


def source_links(view: TranscriptView) -> list[str]:
    return re.findall(r'href="(lamplight://[^"]+/source/[^"]+)"', view.toHtml())


def fake_reader(blocks: list[tuple[int | None, int, str]]) -> Any:
    calls: list[str] = []

    def read_text(path: str) -> list[tuple[int | None, int, str]]:
        calls.append(path)
        return blocks

    read_text.calls = calls  # type: ignore[attr-defined]
    return read_text


def test_labels_and_preview(tmp_path: Path) -> None:
    first, whole = two_sources(tmp_path / "report.pdf")
    assert label(first) == "[1] report.pdf, page 3, lines 2–3"
    assert label(whole) == "[2] notes.md, whole document"
    assert location(first) == "page 3, lines 2–3"
    assert preview("a  b\n" + "x" * 300).endswith("…") and len(preview("y" * 300)) == 120


def sources_at(view: TranscriptView) -> list[int]:
    """The indexes of the messages whose bubble holds a sources list."""
    return [i for i, f in enumerate(view._frames) if sources_frame(f) is not None]


def test_sources_show_in_the_question_and_click_emits(qtbot: QtBot, tmp_path: Path) -> None:
    view = TranscriptView()
    qtbot.addWidget(view)
    view.show_messages(conversation(tmp_path / "report.pdf"))
    text = view.toPlainText()
    assert text.index("How did revenue") < text.index("Sources") < text.index("It grew by 12")
    assert sources_at(view) == [0]
    assert "[1] report.pdf, page 3, lines 2–3" in text
    assert "[2] notes.md, whole document" in text
    at = view.document().find("[1] report.pdf")
    at.setPosition(at.position() - 2)  # inside the link
    assert (
        at.charFormat().toolTip() == "The yearly revenue grew by 12 percent, mostly in the north."
    )
    links = source_links(view)
    assert len(links) == 2
    got: list[object] = []
    view.sourceActivated.connect(got.append)
    view.anchorClicked.emit(QUrl(links[1]))
    view.anchorClicked.emit(QUrl(links[0]))
    assert got == two_sources(tmp_path / "report.pdf")[::-1]
    # A link with another key, or past the list, does nothing.
    view.anchorClicked.emit(QUrl(re.sub(r"//\w+/", "//0000/", links[0])))
    view.anchorClicked.emit(QUrl(links[0][:-1] + "9"))
    assert len(got) == 2


def test_sources_stay_in_the_question_while_streaming_after_and_reopened(
    qtbot: QtBot, tmp_path: Path
) -> None:
    """They jumped from the question's bubble to under the reply when the reply ended."""
    view = TranscriptView()
    qtbot.addWidget(view)
    msgs = conversation(tmp_path / "report.pdf")
    view.add_user_message(msgs[0].content, 0, sources=msgs[0].sources)
    view.begin_reply(1)
    view.append_stream("It grew")
    text = view.toPlainText()
    assert sources_at(view) == [0] and text.index("Sources") < text.index("It grew")
    view.end_reply(msgs[1].content)
    live = view.toPlainText()
    assert sources_at(view) == [0] and live.count("Sources") == 1
    assert live.index("Sources") < live.index("It grew by 12 percent")
    assert len(source_links(view)) == 2
    view.show_messages(msgs)  # the chat opened again
    assert sources_at(view) == [0]
    assert view.toPlainText().index("Sources") == live.index("Sources")
    # A reply that is not kept (stopped) leaves them where they are too.
    view.clear_conversation()
    view.add_user_message("again?", 0, sources=msgs[0].sources)
    view.begin_reply(1)
    view.end_reply("", error="Stopped.", kept=False)
    text = view.toPlainText()
    assert sources_at(view) == [0] and text.index("Sources") < text.index("Stopped.")


def test_reopened_conversation_shows_the_same_sources(qtbot: QtBot, tmp_path: Path) -> None:
    conv = Conversation(messages=conversation(tmp_path / "report.pdf"))
    view = TranscriptView()
    qtbot.addWidget(view)
    view.show_messages(conv.messages)
    before = view.toPlainText()
    again = Conversation.from_dict(conv.to_dict())
    view.show_messages(again.messages)
    assert view.toPlainText() == before
    got: list[object] = []
    view.sourceActivated.connect(got.append)
    view.anchorClicked.emit(QUrl(source_links(view)[0]))
    assert got == two_sources(tmp_path / "report.pdf")[:1]


def test_a_question_without_reply_keeps_its_sources(qtbot: QtBot, tmp_path: Path) -> None:
    view = TranscriptView()
    qtbot.addWidget(view)
    msgs = conversation(tmp_path / "report.pdf")
    view.show_messages([msgs[0], Message("assistant", "ok"), Message("user", "more?")])
    text = view.toPlainText()
    assert text.index("Sources") < text.index("ok") < text.index("more?")
    assert sources_at(view) == [0]
    view.show_messages(msgs[:1], answerable=True)
    assert "Sources" in view.toPlainText()


def viewer_for(qtbot: QtBot, source: Source, read_text: Any) -> DocumentViewer:
    viewer = open_viewer(None, source, read_text)
    qtbot.addWidget(viewer)
    qtbot.waitUntil(lambda: viewer.loaded, timeout=5000)
    return viewer


def test_viewer_highlights_the_passage(qtbot: QtBot, tmp_path: Path) -> None:
    path = tmp_path / "report.pdf"
    path.write_bytes(b"%PDF")
    source = two_sources(path)[0]
    blocks: list[tuple[int | None, int, str]] = [
        (1, 1, "Page one. The yearly revenue grew by 12 percent,"),
        (2, 1, "filler " * 400),
        (3, 1, PAGE3),
    ]
    read_text = fake_reader(blocks)
    viewer = viewer_for(qtbot, source, read_text)
    assert read_text.calls == [str(path)]
    assert viewer.windowTitle() == "report.pdf" and not viewer.isModal()
    assert viewer.header.text() == "page 3, lines 2–3"
    assert viewer.note.isHidden() and viewer.open_button.isEnabled()
    marks = viewer.view.extraSelections()
    assert len(marks) == 1
    chosen = marks[0].cursor.selectedText()
    assert " ".join(chosen.split()) == " ".join(source.text.split())
    # The one on page 3 (the saved page), not the partial one on page 1.
    assert marks[0].cursor.selectionStart() > viewer.view.toPlainText().index("Page 3")
    assert viewer.view.textCursor().position() == marks[0].cursor.selectionStart()  # in view
    viewer.copy_passage()
    assert QApplication.clipboard().text() == source.text
    viewer.close()


def test_viewer_changed_and_missing_files(qtbot: QtBot, tmp_path: Path) -> None:
    path = tmp_path / "report.pdf"
    path.write_bytes(b"%PDF")
    source = two_sources(path)[0]
    changed = viewer_for(qtbot, source, fake_reader([(3, 1, "Revenue fell sharply.")]))
    assert changed.note.text() == CHANGED and changed.note.isVisibleTo(changed)
    assert changed.view.toPlainText() == source.text
    assert changed.open_button.isEnabled() and not changed.view.extraSelections()
    changed.close()
    path.unlink()
    read_text = fake_reader([(3, 1, PAGE3)])
    missing = viewer_for(qtbot, source, read_text)
    assert missing.note.text() == MISSING and not missing.open_button.isEnabled()
    assert missing.view.toPlainText() == source.text and read_text.calls == []
    missing.close()


def test_open_file_names_the_document_where_nothing_opens_it(
    qtbot: QtBot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: "Open file" did nothing where no app opens the document (``openUrl``
    False) and never said where it is."""
    path = tmp_path / "report.pdf"
    path.write_bytes(b"%PDF")
    viewer = viewer_for(qtbot, two_sources(path)[0], fake_reader([(3, 1, PAGE3)]))
    asked: list[QUrl] = []

    def nothing_opens(url: QUrl) -> bool:
        asked.append(url)
        return False

    monkeypatch.setattr(QDesktopServices, "openUrl", nothing_opens)
    viewer.open_button.click()
    assert asked == [QUrl.fromLocalFile(str(path))]
    note = viewer.path_note
    assert note is not None and note.isVisible()
    assert "Nothing on this computer opened this document" in note.text()
    assert str(path) in note.text()
    QApplication.clipboard().clear()
    note.findChild(QPushButton, "copyPath").click()
    assert QApplication.clipboard().text() == str(path)
    note.close()
    monkeypatch.setattr(QDesktopServices, "openUrl", lambda _url: True)
    viewer.open_button.click()
    assert viewer.path_note is None
    viewer.close()


def test_viewer_reader_errors_and_whole_documents(qtbot: QtBot, tmp_path: Path) -> None:
    notes = tmp_path / "notes.md"
    notes.write_text("x")
    whole = two_sources(tmp_path / "report.pdf")[1]

    def broken(path: str) -> list[tuple[int | None, int, str]]:
        raise OSError("the disk is not there.")

    shown = load(whole, broken)
    assert "could not be read (the disk is not there)" in shown.note and shown.text == whole.text
    same = load(whole, fake_reader([(None, 1, "All of  the\nnotes.")]))
    assert same.note == "" and same.start == -1 and "All of  the" in same.text
    assert load(whole, fake_reader([(None, 1, "Other notes.")])).note == CHANGED


@settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    st.lists(
        st.one_of(
            st.dictionaries(
                st.sampled_from(
                    ["n", "path", "name", "text", "page", "line", "end_line", "whole", "score"]
                ),
                st.one_of(
                    st.none(),
                    st.booleans(),
                    st.integers(-(2**70), 2**70),
                    st.floats(),
                    st.text(max_size=40),
                ),
            ),
            st.text(max_size=5),
            st.integers(),
        ),
        max_size=20,
    ),
    st.text(max_size=200),
)
def test_hostile_sources_never_raise(qtbot: QtBot, items: list[object], doc: str) -> None:
    view = TranscriptView()
    qtbot.addWidget(view)
    view.show_messages([Message("user", "q", sources=items), Message("assistant", "a")])  # type: ignore[arg-type]
    sources = sources_from_list(items)
    assert len(source_links(view)) == len(sources)
    for link in source_links(view):
        view.anchorClicked.emit(QUrl(link))
    for source in sources:
        text, offsets, places = assemble([(source.page, 1, doc), (None, 2, source.text)])
        find_passage(text, offsets, places, source)
        load(source, fake_reader([(None, 1, doc)]))
    view.close()
