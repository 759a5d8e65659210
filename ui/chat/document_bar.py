"""The documents bar above the message box: one chip per document or collection the
conversation reads from (its state, counts and ×), the indexing progress line with
Cancel, and a note. ``ui.chat.document_attach`` drives it; nothing here does work."""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from ui.common.qt_util import chip_row

ERROR_STYLE = "color: #d1242f;"
STATE_TEXT = {
    "queued": "waiting",
    "reading": "reading…",
    "embedding": "embedding…",
    "ready": "ready",
    "error": "error",
    "missing": "missing",
}


@dataclass(frozen=True)
class ChipState:
    """What one chip shows. ``key``: the file path, or the collection's name."""

    key: str
    name: str
    state: str  # a DocState, "missing", or "collection"
    error: str = ""
    n_chunks: int = 0
    pages: int | None = None
    collection: bool = False
    n_documents: int = 0


def detail_text(item: ChipState) -> str:
    """ "ready · 12 chunks · 3 pages", "collection · 4 documents", "error"."""
    if item.collection:
        return f"collection · {item.n_documents} document{'s' if item.n_documents != 1 else ''}"
    parts = [STATE_TEXT.get(item.state, item.state)]
    if item.state == "ready":
        parts.append(f"{item.n_chunks} chunk{'s' if item.n_chunks != 1 else ''}")
        if item.pages:
            parts.append(f"{item.pages} page{'s' if item.pages != 1 else ''}")
    return " · ".join(parts)


class DocumentChip(QFrame):
    """One document or collection: name, state and counts, and ×.

    Signals:
        removeRequested(str): the × was clicked (the chip's key).
    """

    removeRequested = Signal(str)

    def __init__(self, item: ChipState, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("documentChip")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.item = item
        shown = item.name if len(item.name) <= 28 else item.name[:26] + "…"
        self.title = QLabel(shown, self)
        self.detail = QLabel(self)
        self.detail.setObjectName("documentState")
        self.remove_button = QToolButton(self)
        self.remove_button.setObjectName("removeDocument")
        self.remove_button.setText("×")
        self.remove_button.setAutoRaise(True)
        what = "collection" if item.collection else "document"
        self.remove_button.setToolTip(f"Stop using the {what} {item.name} in this conversation")
        self.remove_button.setAccessibleName(f"Remove {item.name}")
        self.remove_button.clicked.connect(lambda: self.removeRequested.emit(self.item.key))
        text = QVBoxLayout()
        text.setSpacing(0)
        text.addWidget(self.title)
        text.addWidget(self.detail)
        row = QHBoxLayout(self)
        row.setContentsMargins(6, 2, 2, 2)
        row.addLayout(text)
        row.addWidget(self.remove_button, 0, Qt.AlignmentFlag.AlignTop)
        self.set_item(item)

    def set_item(self, item: ChipState) -> None:
        self.item = item
        self.detail.setText(detail_text(item))
        bad = item.state in ("error", "missing")
        self.detail.setStyleSheet(ERROR_STYLE if bad else "color: #888888; font-size: small;")
        tip = item.key if not item.collection else f"Collection {item.name}"
        if bad:
            reason = item.error or "The file is no longer there."
            tip = f"{tip}\n{reason}"
        self.setToolTip(tip)


class DocumentBar(QWidget):
    """The chips in a row, the progress line (with Cancel) and a note under them.

    Signals:
        cancelRequested(): Cancel was clicked.
        removeRequested(str): a chip's × (its key).
    """

    cancelRequested = Signal()
    removeRequested = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("documentBar")
        self.chips: list[DocumentChip] = []
        self.row, self.area = chip_row(self, 52)
        self.progress_label = QLabel(self)
        self.progress_label.setObjectName("documentProgress")
        self.progress_bar = QProgressBar(self)
        self.progress_bar.setRange(0, 1000)
        self.progress_bar.setTextVisible(False)
        self.progress_bar.setMaximumHeight(8)
        self.cancel_button = QPushButton("Cancel", self)
        self.cancel_button.setObjectName("cancelIndexing")
        self.cancel_button.setToolTip("Stop reading these documents")
        self.cancel_button.clicked.connect(self.cancelRequested)
        self.progress_row = QWidget(self)
        line = QHBoxLayout(self.progress_row)
        line.setContentsMargins(0, 0, 0, 0)
        line.addWidget(self.progress_label, 1)
        line.addWidget(self.progress_bar, 1)
        line.addWidget(self.cancel_button)
        self.progress_row.hide()
        self.note = QLabel(self)
        self.note.setObjectName("documentNote")
        self.note.setWordWrap(True)
        self.note.setStyleSheet(ERROR_STYLE)
        self.note.hide()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 2, 0, 2)
        layout.setSpacing(2)
        layout.addWidget(self.area)
        layout.addWidget(self.progress_row)
        layout.addWidget(self.note)
        self.hide()

    def set_items(self, items: list[ChipState]) -> None:
        """Show ``items`` (chips are kept where their key stays, so a hover survives)."""
        old = {c.item.key: c for c in self.chips}
        chips = []
        for item in items:
            chip = old.pop(item.key, None)
            if chip is None:
                chip = DocumentChip(item, self)
                chip.removeRequested.connect(self.removeRequested)
            else:
                chip.set_item(item)
            chips.append(chip)
        for chip in old.values():
            chip.deleteLater()
        for i, chip in enumerate(chips):
            self.row.insertWidget(i, chip)
        self.chips = chips
        self._follow()

    def chip(self, key: str) -> DocumentChip | None:
        return next((c for c in self.chips if c.item.key == key), None)

    def show_progress(self, text: str, fraction: float) -> None:
        self.progress_label.setText(text)
        self.progress_bar.setValue(int(max(0.0, min(1.0, fraction)) * 1000))
        self.cancel_button.setEnabled(True)
        self.progress_row.show()
        self._follow()

    def hide_progress(self) -> None:
        self.progress_row.hide()
        self._follow()

    def show_note(self, text: str) -> None:
        self.note.setText(text)
        self.note.setVisible(bool(text))
        self._follow()

    def _follow(self) -> None:
        """Hidden when there is nothing to show."""
        self.area.setVisible(bool(self.chips))
        self.setVisible(
            bool(self.chips) or self.progress_row.isVisibleTo(self) or bool(self.note.text())
        )
