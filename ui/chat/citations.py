"""The numbered passages a message was sent with, as a "Sources" list in the transcript.

The list of a user message's sources shows in that message's bubble, where the data
lives (``Message.sources``): the same place while the reply streams, after it ends and
when the chat is opened again (it used to move under the reply once it ended). Each line
is a link (``<href>/<message index>/<position>``) that the transcript turns into a
``sourceActivated(Source)`` signal. The sources come from the saved message
(``Message.sources``), read defensively, so a reopened chat shows the same list.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

from PySide6.QtGui import (
    QColor,
    QTextBlockFormat,
    QTextCharFormat,
    QTextFrame,
    QTextFrameFormat,
)

from app.documents.sources import MAX_SOURCES, Source, source_from_dict
from ui.common.qt_util import remove_text_frame

MARK = QTextFrameFormat.Property.UserProperty + 31  # marks a message's sources frame
PREVIEW_CHARS = 120


def as_sources(items: object) -> list[Source]:
    """``Source`` objects from a message's saved dicts (or from sources): bad entries
    skipped, at most ``MAX_SOURCES``."""
    if not isinstance(items, (list, tuple)):
        return []
    out: list[Source] = []
    for item in items[: MAX_SOURCES * 4]:
        source = item if isinstance(item, Source) else source_from_dict(item)
        if source is not None:
            out.append(source)
    return out[:MAX_SOURCES]


def preview(text: str, limit: int = PREVIEW_CHARS) -> str:
    """The passage's first ``limit`` characters on one line, elided."""
    flat = " ".join(text[: limit * 8].split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def label(source: Source) -> str:
    """ "[1] report.pdf, page 3, lines 4–9" (a line of the list)."""
    return f"[{source.n}] {source.where()}"


def sources_html(sources: list[Source], href: str, dark: bool) -> str:
    """The "Sources" heading and one link per passage (``href``/position), its preview
    as the tooltip."""
    muted = "#9aa4b1" if dark else "#57606a"
    link = "#8ab4f8" if dark else "#0b57d0"
    lines = [f"<p style='color:{muted}; margin-top:6px'><small><b>Sources</b></small></p>"]
    for pos, source in enumerate(sources):
        tip = html.escape(preview(source.text) or source.name, quote=True)
        text = html.escape(label(source))
        lines.append(
            f'<p style=\'margin:0\'><small><a href="{href}/{pos}" title="{tip}" '
            f"style='color:{link}'>{text}</a></small></p>"
        )
    return "".join(lines)


def sources_frame(message: QTextFrame) -> QTextFrame | None:
    """The frame holding a message's sources list, if it has one."""
    for child in message.childFrames():
        if child.frameFormat().property(MARK):
            return child
    return None


def remove_frame(message: QTextFrame) -> None:
    """Remove the sources list from ``message`` (if there)."""
    frame = sources_frame(message)
    if frame is not None:
        remove_text_frame(frame)


def insert_frame(message: QTextFrame, body: str, dark: bool) -> QTextFrame:
    """Put the sources list ``body`` (HTML) at the end of ``message``."""
    remove_frame(message)
    cursor = message.lastCursorPosition()
    if cursor.block().length() > 1:  # never inside the body's last line
        cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
    fmt = QTextFrameFormat()
    fmt.setProperty(MARK, True)
    fmt.setPadding(4)
    fmt.setTopMargin(2)
    fmt.setBorder(0)
    fmt.setBackground(QColor("#20252c" if dark else "#f6f8fa"))
    frame = cursor.insertFrame(fmt)
    frame.lastCursorPosition().insertHtml(body)
    return frame


class MessageSources:
    """The sources lists of the transcript's messages.

    ``show`` is called with every user message (its sources may be empty) and puts its
    list at the end of that message, where it stays. ``activate`` calls ``on_activate``
    with the chosen source.
    """

    def __init__(
        self, href: str, dark: Callable[[], bool], on_activate: Callable[[Source], Any]
    ) -> None:
        self._href = href
        self._dark = dark
        self._on_activate = on_activate
        self._sources: dict[int, list[Source]] = {}  # user message index -> its sources

    def clear(self) -> None:
        self._sources = {}

    def show(self, index: int, frame: QTextFrame, items: object) -> None:
        """User message ``index`` (in ``frame``) was sent with ``items`` (dicts or sources)."""
        for stale in [k for k in self._sources if k >= index]:
            self._sources.pop(stale)
        sources = as_sources(items)
        if sources:
            self._sources[index] = sources
            self._place(index, frame)

    def _place(self, user: int, frame: QTextFrame) -> None:
        body = sources_html(self._sources[user], f"{self._href}/{user}", self._dark())
        insert_frame(frame, body, self._dark())

    def sources(self, index: int) -> list[Source]:
        """User message ``index``'s sources, as shown."""
        return list(self._sources.get(index, []))

    def activate(self, index: int, pos: int) -> bool:
        """The user chose source ``pos`` of user message ``index``."""
        sources = self._sources.get(index, [])
        if not 0 <= pos < len(sources):
            return False
        self._on_activate(sources[pos])
        return True
