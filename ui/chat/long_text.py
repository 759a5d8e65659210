"""A message too long to draw: the transcript shows its start, a viewer shows it all.

A 25 MB paste froze the window for 33 s: Markdown already falls back to plain text
past ``MARKDOWN_LIMIT``, but the view still laid out every character. The transcript
draws the first ``SHOWN_CHARS`` of a message and a "Show all (25 MB)…" link; the message
itself stays whole (saved, copied, sent to the model). The viewer shows it a part at a
time, so no part it lays out is longer than what the transcript draws, and saves it.

The message box is a ``QPlainTextEdit``, which lays out a paragraph whole: a 4 MB
paragraph took 5 s, an unbroken 400,000-character line 11 s (quadratic). A paste past
``PASTE_CHARS`` is held beside the box instead (``HeldText``) and sent after what is
typed there.
"""

from __future__ import annotations

import html
from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QApplication,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.chat.markdown_render import breakable
from app.util.atomic import atomic_write_bytes
from app.util.sysinfo import size_text

SHOWN_CHARS = 200_000  # of one message drawn in the transcript (and of one viewer part)
PASTE_CHARS = 100_000  # a longer paste into the message box is held beside it


def cut(text: str) -> str:
    """The part of ``text`` the transcript draws."""
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS]


def cut_plain(text: str) -> str:
    """``text`` to draw as plain text (a reply's thinking): cut, with a note, when long."""
    if len(text) <= SHOWN_CHARS:
        return text
    return (
        f"{text[:SHOWN_CHARS]}\n\n[{len(text) - SHOWN_CHARS:,} more characters "
        f"({size_label(text)} in all) are not drawn here; Copy has all of them.]"
    )


def fits_the_box(text: str) -> bool:
    """Whether the message box can take ``text`` and stay responsive."""
    return len(text) <= PASTE_CHARS


def size_label(text: str) -> str:
    """The message's size in UTF-8 bytes, for people ("25 MB")."""
    return size_text(len(text.encode("utf-8", "surrogatepass")))


def more_html(text: str, href: str = "") -> str:
    """The line after a cut message: what is not drawn, and (``href``) "Show all"."""
    if len(text) <= SHOWN_CHARS:
        return ""
    rest = len(text) - SHOWN_CHARS
    label = f"Show all ({html.escape(size_label(text))})…"
    link = f'<a href="{href}">{label}</a>' if href else ""
    return (
        f"<p style='color:#888888'><i>{rest:,} more characters are not drawn here; the "
        f"message is kept whole.</i> {link}</p>"
    )


class LongTextViewer(QDialog):
    """A long message, read-only, one part of ``SHOWN_CHARS`` at a time; Copy and Save."""

    def __init__(self, text: str, title: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("longTextViewer")
        self.setWindowTitle(f"{title} ({size_label(text)})")
        self.resize(820, 600)
        self.text = text
        self.parts = max(1, -(-len(text) // SHOWN_CHARS))
        self.part = 0
        self.view = QPlainTextEdit(self)
        self.view.setObjectName("longTextView")
        self.view.setAccessibleName("Message text")
        self.view.setReadOnly(True)
        self.where = QLabel(self)
        self.prev_button = QPushButton("‹ Previous part", self)
        self.prev_button.clicked.connect(lambda: self.show_part(self.part - 1))
        self.next_button = QPushButton("Next part ›", self)
        self.next_button.clicked.connect(lambda: self.show_part(self.part + 1))
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close, self)
        copy = buttons.addButton("Copy all", QDialogButtonBox.ButtonRole.ActionRole)
        copy.clicked.connect(self.copy_all)
        save = buttons.addButton("Save as…", QDialogButtonBox.ButtonRole.ActionRole)
        save.clicked.connect(self.ask_save)
        buttons.rejected.connect(self.reject)
        row = QHBoxLayout()
        row.addWidget(self.prev_button)
        row.addWidget(self.where, 1)
        row.addWidget(self.next_button)
        layout = QVBoxLayout(self)
        layout.addWidget(self.view, 1)
        layout.addLayout(row)
        layout.addWidget(buttons)
        self.show_part(0)

    def show_part(self, part: int) -> None:
        self.part = min(max(part, 0), self.parts - 1)
        start = self.part * SHOWN_CHARS
        # Break opportunities in long runs: Qt lays out an unbroken line in quadratic time.
        self.view.setPlainText(breakable(self.text[start : start + SHOWN_CHARS]))
        end = min(start + SHOWN_CHARS, len(self.text))
        self.where.setText(
            f"Part {self.part + 1} of {self.parts}: characters {start + 1:,}–{end:,} "
            f"of {len(self.text):,}"
        )
        self.prev_button.setEnabled(self.part > 0)
        self.next_button.setEnabled(self.part < self.parts - 1)

    def copy_all(self) -> None:
        QApplication.clipboard().setText(self.text)

    def ask_save(self) -> None:
        path, _ = QFileDialog.getSaveFileName(
            self, "Save message as", str(Path.home() / "message.txt"), "Text (*.txt)"
        )
        if path:
            self.save(Path(path))

    def save(self, path: Path) -> bool:
        try:  # a lone surrogate (from an imported file) is written as "?"
            atomic_write_bytes(path, self.text.encode("utf-8", "replace"))
        except OSError as exc:
            QMessageBox.warning(self, "Could not save", f"{path}: {exc}")
            return False
        return True


class HeldText(QWidget):
    """A paste too long for the message box, as one line above it: its size, View…,
    Remove. It is sent after what is typed in the box (``ChatPane.text``).

    Signals:
        changed(): text was held or let go.
    """

    changed = Signal()
    WHAT = "Pasted text"  # what is held, for the line and the viewer's title
    USE = "it is sent after what you type"

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("heldText")
        self.text = ""
        self.label = QLabel(self)
        self.label.setObjectName("heldTextLabel")
        view = QPushButton("View…", self)
        view.setObjectName("heldTextView")
        view.setAccessibleName("View the pasted text")
        view.clicked.connect(self.view)
        remove = QPushButton("Remove", self)
        remove.setObjectName("heldTextRemove")
        remove.setAccessibleName("Remove the pasted text")
        remove.clicked.connect(self.clear)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.label, 1)
        row.addWidget(view)
        row.addWidget(remove)
        self.hide()

    def add(self, text: str) -> None:
        """Hold ``text`` (after what is held already: nothing pasted is dropped)."""
        if not text.strip():
            return
        self.text = f"{self.text}\n\n{text}" if self.text else text
        self._show()
        self.changed.emit()

    def hold(self, text: str) -> None:
        """Hold exactly ``text`` (a stored one, shown again) instead; no ``changed``."""
        self.text = text
        if text:
            self._show()
        else:
            self.hide()

    def _show(self) -> None:
        lines = self.text.count("\n") + 1
        self.label.setText(
            f"{self.WHAT}: {size_label(self.text)}, {lines:,} line{'s' * (lines != 1)}; "
            f"too long to edit here, {self.USE}."
        )
        self.show()

    def clear(self) -> None:
        if self.text:
            self.text = ""
            self.hide()
            self.changed.emit()

    def view(self) -> LongTextViewer:
        viewer = LongTextViewer(self.text, self.WHAT, self)
        viewer.show()
        return viewer
