"""The conversation view: message frames, streamed text, Markdown once a reply ends."""

from __future__ import annotations

import html

from PySide6.QtCore import QUrl, Signal
from PySide6.QtGui import (
    QColor,
    QDesktopServices,
    QFont,
    QPalette,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextFrame,
    QTextFrameFormat,
)
from PySide6.QtWidgets import QTextBrowser, QWidget

from app.markdown_render import render_markdown

SAFE_LINK_SCHEMES = ("http", "https", "mailto")


class TranscriptView(QTextBrowser):
    """Shows the conversation.

    While a reply streams its text is appended as plain text at the end of
    its frame, a cost that does not depend on how long the message or the
    conversation already is; when the reply ends, that frame alone is
    re-rendered as Markdown.

    Signals:
        linkActivated(QUrl): the user clicked a link that is safe to open.
    """

    linkActivated = Signal(QUrl)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("transcriptView")
        self.setOpenLinks(False)
        self.setOpenExternalLinks(False)
        self.setReadOnly(True)
        self.document().setDocumentMargin(12)
        self.anchorClicked.connect(self._on_anchor_clicked)
        self._stream_frame: QTextFrame | None = None
        self._stream_cursor: QTextCursor | None = None
        self._placeholder = True
        self._body_format = QTextCharFormat()
        self._show_placeholder()

    # A QTextBrowser fetches <img> and stylesheet URLs through this; Lamplight fetches nothing.
    def loadResource(self, type: int, name: QUrl | str) -> object:  # Qt's name
        return None

    def _dark(self) -> bool:
        return self.palette().color(QPalette.ColorRole.Base).lightness() < 128

    def _show_placeholder(self) -> None:
        self.setHtml(
            "<p style='color:#888888' align='center'><br><br>Type a message below and press "
            "Enter.<br>Shift+Enter adds a line; Esc stops a reply.</p>"
        )
        self._placeholder = True

    def clear_conversation(self) -> None:
        self._stream_frame = None
        self._stream_cursor = None
        self._show_placeholder()

    def _new_frame(self, role: str) -> QTextFrame:
        if self._placeholder:
            self.clear()
            self._placeholder = False
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        fmt = QTextFrameFormat()
        fmt.setPadding(8)
        fmt.setTopMargin(6)
        fmt.setBottomMargin(6)
        fmt.setBorder(0)
        if role == "user":
            dark = self._dark()
            fmt.setBackground(QColor("#2b3a55" if dark else "#e8f0fe"))
        frame = cursor.insertFrame(fmt)
        header = QTextCharFormat()
        header.setFontWeight(QFont.Weight.Bold)
        header.setForeground(QColor("#888888"))
        inner = frame.firstCursorPosition()
        inner.insertText("You" if role == "user" else "Assistant", header)
        inner.insertBlock(QTextBlockFormat(), self._body_format)
        return frame

    def add_user_message(self, text: str) -> None:
        at_bottom = self._at_bottom()
        frame = self._new_frame("user")
        cursor = frame.lastCursorPosition()
        cursor.insertHtml(render_markdown(text, self._dark()))
        self._follow(at_bottom)

    def begin_reply(self) -> None:
        """Open the frame a streamed reply goes into."""
        at_bottom = self._at_bottom()
        self._stream_frame = self._new_frame("assistant")
        self._stream_cursor = self._stream_frame.lastCursorPosition()
        self._follow(at_bottom)

    def append_stream(self, text: str) -> None:
        """Append plain reply text at the end of the streaming frame."""
        if self._stream_cursor is None or not text:
            return
        at_bottom = self._at_bottom()
        self._stream_cursor.insertText(text, self._body_format)
        self._follow(at_bottom)

    def end_reply(self, text: str, footer: str = "", error: str = "") -> None:
        """Replace the streamed text with its Markdown rendering and add a footer line."""
        frame = self._stream_frame
        if frame is None:
            return
        at_bottom = self._at_bottom()
        cursor = frame.firstCursorPosition()
        cursor.movePosition(QTextCursor.MoveOperation.NextBlock)  # keep the header
        cursor.setPosition(frame.lastPosition(), QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()
        parts = []
        if text.strip():
            parts.append(render_markdown(text, self._dark()))
        if error:
            parts.append(f"<p style='color:#d1242f'>{html.escape(error)}</p>")
        if footer:
            parts.append(f"<p style='color:#888888; font-size:small'>{html.escape(footer)}</p>")
        cursor.insertHtml("".join(parts) or "<p style='color:#888888'>(no reply)</p>")
        self._stream_frame = None
        self._stream_cursor = None
        self._follow(at_bottom)

    def add_notice(self, text: str) -> None:
        """A one-line note from the app (an error, a model change)."""
        if self._placeholder:
            self.clear()
            self._placeholder = False
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.insertHtml(f"<p style='color:#888888'><i>{html.escape(text)}</i></p>")

    @property
    def streaming(self) -> bool:
        return self._stream_frame is not None

    def _at_bottom(self) -> bool:
        bar = self.verticalScrollBar()
        return bar.value() >= bar.maximum() - 4

    def _follow(self, was_at_bottom: bool) -> None:
        # Only follow new text when the reader has not scrolled up to read.
        if was_at_bottom:
            bar = self.verticalScrollBar()
            bar.setValue(bar.maximum())

    def _on_anchor_clicked(self, url: QUrl) -> None:
        if url.scheme() in SAFE_LINK_SCHEMES:
            self.linkActivated.emit(url)
            QDesktopServices.openUrl(url)
