"""Small Qt helpers shared by the panels."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from PySide6.QtCore import QObject, QSize, Qt
from PySide6.QtGui import QTextCursor, QTextFrame
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QScrollArea,
    QStyle,
    QStyleOptionToolButton,
    QToolButton,
    QWidget,
)


@contextmanager
def blocked(*widgets: QObject) -> Iterator[None]:
    """Signals of ``widgets`` blocked for the block (programmatic updates)."""
    before = [w.blockSignals(True) for w in widgets]
    try:
        yield
    finally:
        for w, was in zip(widgets, before, strict=True):
            w.blockSignals(was)


def chip_row(parent: QWidget, height: int) -> tuple[QHBoxLayout, QScrollArea]:
    """A row of chips that scrolls sideways (no frame, no vertical bar), ``height`` high:
    its layout (ends in a stretch: insert chips before it) and its scroll area."""
    row = QHBoxLayout()
    row.setContentsMargins(0, 0, 0, 0)
    row.addStretch(1)
    inner = QWidget(parent)
    inner.setLayout(row)
    area = QScrollArea(parent)
    area.setWidget(inner)
    area.setWidgetResizable(True)
    area.setFrameShape(QFrame.Shape.NoFrame)
    area.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    area.setFixedHeight(height)
    return row, area


def remove_text_frame(frame: QTextFrame) -> QTextCursor:
    """Remove ``frame`` and what it holds from its document; a cursor where it was."""
    cursor = QTextCursor(frame.document())
    cursor.setPosition(frame.firstPosition() - 1)
    cursor.setPosition(frame.lastPosition() + 1, QTextCursor.MoveMode.KeepAnchor)
    cursor.removeSelectedText()
    return cursor


class MenuToolButton(QToolButton):
    """A tool button that opens its menu at a click, wide enough for its label and arrow.

    With ``InstantPopup`` Qt draws the menu arrow over the label's right end but sizes the
    button for the label alone: "Think: auto" came out clipped, the arrow on its "o".
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)

    def sizeHint(self) -> QSize:  # Qt's name
        hint = super().sizeHint()
        opt = QStyleOptionToolButton()
        self.initStyleOption(opt)
        arrow = self.style().pixelMetric(QStyle.PixelMetric.PM_MenuButtonIndicator, opt, self)
        return QSize(hint.width() + arrow, hint.height())

    def minimumSizeHint(self) -> QSize:  # Qt's name
        return self.sizeHint()
