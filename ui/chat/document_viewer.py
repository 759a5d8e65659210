"""The document a cited passage came from, opened at the passage.

The document's text is read in the background through ``read_text`` (the window's:
the text as the index parsed it, in blocks of (page, line, text)), never on the GUI
thread. The passage is found again by its words (whitespace may differ) and
highlighted; where the file is gone, or no longer holds the passage, the viewer shows
the passage as it was saved with the message, and says why.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QPalette, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (
    QApplication,
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QLabel,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QTextEdit,
    QVBoxLayout,
    QWidget,
)

from app.documents.sources import Source
from ui.common.background import run_in_background
from ui.common.open_path import open_path

Blocks = Sequence[tuple[int | None, int, str]]
ReadText = Callable[[str], Blocks]

SAVED = "this is the passage as the model saw it."
CHANGED = f"This file has changed since the message was sent; {SAVED}"
MISSING = f"This file is missing; {SAVED}"
UNREADABLE = "This file could not be read ({why}); " + SAVED
MAX_SHOWN_CHARS = 4_000_000  # of a document's text; the rest is left out
MAX_WORDS = 2_000  # of a passage, matched to find it (chunks have far fewer)
MAX_MATCHES = 64  # occurrences weighed to pick the one at the passage's page and line


@dataclass(frozen=True)
class Shown:
    """What the viewer shows: ``text``, the passage's span in it (``start`` -1: none),
    whether the file is there, and a note (empty when the passage was found)."""

    text: str
    start: int
    end: int
    exists: bool
    note: str


def location(source: Source) -> str:
    """ "page 3, lines 4–9" (``Source.where`` without the file name)."""
    where = source.where()
    prefix = source.name + ", "
    return where[len(prefix) :] if where.startswith(prefix) else where


def assemble(blocks: Blocks) -> tuple[str, list[int], list[tuple[int | None, int]]]:
    """The document's text from its blocks (a "Page N" line where a page starts), each
    block's offset in it and its (page, line); at most ``MAX_SHOWN_CHARS``."""
    parts: list[str] = []
    offsets: list[int] = []
    places: list[tuple[int | None, int]] = []
    size = 0
    page: int | None = None
    for block_page, line, text in blocks:
        if size >= MAX_SHOWN_CHARS:
            break
        if block_page is not None and block_page != page:
            head = f"— Page {block_page} —\n\n"
            parts.append(head)
            size += len(head)
        page = block_page
        text = text[: MAX_SHOWN_CHARS - size].rstrip("\n")
        offsets.append(size)
        places.append((block_page, line))
        parts.append(text + "\n\n")
        size += len(text) + 2
    return "".join(parts).rstrip("\n"), offsets, places


def find_passage(
    text: str, offsets: list[int], places: list[tuple[int | None, int]], source: Source
) -> tuple[int, int] | None:
    """The passage's span in ``text``, its words matched whatever the whitespace between
    them; of several, the one nearest the saved page and line. None: not there."""
    words = source.text.split()[:MAX_WORDS]
    if not words:
        return None
    pattern = re.compile(r"\s+".join(re.escape(w) for w in words))
    best: tuple[tuple[int, int], tuple[int, int]] | None = None
    for n, match in enumerate(pattern.finditer(text)):
        if n >= MAX_MATCHES:
            break
        at = bisect.bisect_right(offsets, match.start()) - 1
        page, line = places[at] if at >= 0 else (None, 1)
        cost = (0 if page == source.page else 1, abs(line - source.line))
        if best is None or cost < best[0]:
            best = (cost, match.span())
    return best[1] if best is not None else None


def load(source: Source, read_text: ReadText) -> Shown:
    """What to show for ``source`` (any thread: reads the file)."""
    saved = Shown(source.text, -1, -1, False, MISSING)
    try:
        if not Path(source.path).is_file():
            return saved
        blocks = read_text(source.path)
    except Exception as exc:  # the reader's own error, whatever it is, becomes a note
        why = str(exc).strip().rstrip(".") or type(exc).__name__
        return Shown(source.text, -1, -1, True, UNREADABLE.format(why=why[:300]))
    text, offsets, places = assemble(blocks)
    if source.whole:
        same = " ".join(text.split()) == " ".join(source.text.split())
        return Shown(text, -1, -1, True, "") if same else Shown(source.text, -1, -1, True, CHANGED)
    span = find_passage(text, offsets, places, source)
    if span is None:
        return Shown(source.text, -1, -1, True, CHANGED)
    return Shown(text, span[0], span[1], True, "")


class DocumentViewer(QDialog):
    """A non-modal window with the document's text, the passage highlighted and in view.

    ``loaded`` is True once the text is there; ``shown`` is what it shows.
    """

    def __init__(self, source: Source, read_text: ReadText, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("documentViewer")
        self.setModal(False)
        self.setWindowTitle(source.name or "Document")
        self.source = source
        self.loaded = False
        self.shown: Shown | None = None
        self.path_note: QMessageBox | None = None  # where nothing opened the file
        self.header = QLabel(location(source), self)
        self.header.setAccessibleName("Passage location")
        font = self.header.font()
        font.setBold(True)
        self.header.setFont(font)
        self.note = QLabel(self)
        self.note.setWordWrap(True)
        self.note.setAccessibleName("Note")
        self.note.hide()
        self.view = QPlainTextEdit(self)
        self.view.setObjectName("documentText")
        self.view.setReadOnly(True)
        self.view.setAccessibleName(f"Text of {source.name}")
        self.view.setAccessibleDescription("The cited passage is highlighted")
        self.view.setPlainText(f"Reading {source.name}…")
        self.open_button = QPushButton("Open file", self)
        self.open_button.setToolTip("Open the file in the app your system uses for it")
        self.open_button.setEnabled(False)
        self.open_button.clicked.connect(self.open_file)
        self.copy_button = QPushButton("Copy passage", self)
        self.copy_button.setToolTip("Copy the passage as the model saw it")
        self.copy_button.clicked.connect(self.copy_passage)
        close = QDialogButtonBox(QDialogButtonBox.StandardButton.Close, self)
        close.rejected.connect(self.reject)
        row = QHBoxLayout()
        row.addWidget(self.open_button)
        row.addWidget(self.copy_button)
        row.addStretch(1)
        row.addWidget(close)
        layout = QVBoxLayout(self)
        layout.addWidget(self.header)
        layout.addWidget(self.note)
        layout.addWidget(self.view, 1)
        layout.addLayout(row)
        self.resize(760, 640)
        run_in_background(partial(load, source, read_text), self._on_loaded)

    def _on_loaded(self, shown: object) -> None:
        if not isinstance(shown, Shown):
            return
        self.shown = shown
        self.view.setPlainText(shown.text)
        self.note.setText(shown.note)
        self.note.setVisible(bool(shown.note))
        self.open_button.setEnabled(shown.exists)
        if shown.start >= 0:
            self._highlight(shown.start, shown.end)
        self.loaded = True

    def _highlight(self, start: int, end: int) -> None:
        cursor = QTextCursor(self.view.document())
        cursor.setPosition(start)
        cursor.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
        mark = QTextEdit.ExtraSelection()
        mark.cursor = cursor
        fmt = QTextCharFormat()
        dark = self.palette().color(QPalette.ColorRole.Base).lightness() < 128
        fmt.setBackground(QColor("#6b5a12" if dark else "#fff1a8"))
        mark.format = fmt
        self.view.setExtraSelections([mark])
        # The end first, then the start: the whole passage in view where it fits.
        at = QTextCursor(self.view.document())
        at.setPosition(end)
        self.view.setTextCursor(at)
        self.view.ensureCursorVisible()
        at.setPosition(start)
        self.view.setTextCursor(at)
        self.view.ensureCursorVisible()

    def open_file(self) -> None:
        """Open the document in the desktop's app; where none does, say so and give its
        path to copy (a click used to do nothing, silently)."""
        self.path_note = open_path(self, Path(self.source.path), "this document")

    def copy_passage(self) -> None:
        QApplication.clipboard().setText(self.source.text)


def open_viewer(parent: QWidget | None, source: Source, read_text: ReadText) -> DocumentViewer:
    """Open ``source``'s document in a new viewer window (deleted when closed)."""
    viewer = DocumentViewer(source, read_text, parent)
    viewer.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
    viewer.show()
    viewer.raise_()
    return viewer
