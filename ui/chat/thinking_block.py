"""A reply's thinking in the transcript: a toggle line and, when open, a shaded frame.

Inside an assistant message's frame the thinking comes right after the header: one
block with the toggle link ("▸ Thought for 14 s · 380 tokens"), then, while open, a
child frame holding the thinking as plain text (escaped by construction: it is
inserted as text, never as HTML). Closing removes that frame; the text stays with the
view (``Thoughts``), so a long thought costs nothing while it is folded away.
"""

from __future__ import annotations

import html
import time

from PySide6.QtGui import (
    QColor,
    QTextBlock,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextFormat,
    QTextFrame,
    QTextFrameFormat,
)

from app.chat.conversation import Message
from app.chat.markdown_render import breakable
from app.engine.metrics import MessageMetrics
from ui.common.qt_util import remove_text_frame

MARK = QTextFormat.Property.UserProperty + 28  # set on a thinking frame's format
LINK_STYLE = "color:#6b7a90; text-decoration:none"
NO_ANSWER = "The model did not answer: it spent its whole reply thinking."
BUDGET_NO_ANSWER = (
    "The model did not answer: the thinking budget ended its thinking, and the reply's "
    "token limit ran out before the answer."
)
STOPPED_NO_ANSWER = "Stopped before the model answered."
CUT_NOTES = {"budget": "stopped at the budget", "user": "stopped by you"}


def duration_text(seconds: float) -> str:
    """``4.2 s``, ``14 s``, ``2 min 5 s``."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s"


def live_text(seconds: float, tokens: int) -> str:
    """The toggle line while the model thinks: ``Thinking… 14 s, 380 tokens``."""
    return f"Thinking… {duration_text(seconds)}, {tokens} token{'s' * (tokens != 1)}"


def summary_text(
    seconds: float, tokens: int, cut: str = "", budget: int = 0, known: bool = True
) -> str:
    """The toggle line once thinking ended: ``Thought for 14 s · 380 tokens · stopped by
    you``; ``known`` False (no figures saved): just ``Thinking``."""
    if not known:
        return "Thinking"
    parts = [f"Thought for {duration_text(seconds)}"]
    if tokens:
        parts.append(f"{tokens} token{'s' * (tokens != 1)}")
    if cut == "budget" and budget:
        parts.append(f"stopped at the budget of {budget} tokens")
    elif cut in CUT_NOTES:
        parts.append(CUT_NOTES[cut])
    return " · ".join(parts)


def metrics_summary(m: MessageMetrics | None, budget: int = 0) -> str:
    """``summary_text`` from a reply's figures."""
    if m is None or not m.reasoning_tokens:
        return summary_text(0, 0, known=False)
    return summary_text(m.reasoning_ms / 1000, m.reasoning_tokens, m.thinking_cut, budget)


def no_answer_note(m: MessageMetrics | None) -> str:
    """Why a reply that only thought has no answer."""
    if m is not None and m.stop_reason == "cancelled":
        return STOPPED_NO_ANSWER
    if m is not None and m.thinking_cut == "budget":
        return BUDGET_NO_ANSWER
    return NO_ANSWER


def toggle_html(
    href: str, text: str, is_open: bool, copy_href: str = "", what: str = "thinking"
) -> str:
    """The toggle line: an arrow and ``text`` as one link, and Copy thinking (``what``:
    "summary" for a compaction's card)."""
    arrow = "▾" if is_open else "▸"
    copy = (
        f"&nbsp;&nbsp;&nbsp;<small><a href='{copy_href}' style='{LINK_STYLE}'>"
        f"Copy {what}</a></small>"
        if copy_href
        else ""
    )
    return (
        f"<a href='{href}' style='{LINK_STYLE}'><small>{arrow}</small> "
        f"<i>{html.escape(text)}</i></a>{copy}"
    )


def frame_format(dark: bool) -> QTextFrameFormat:
    fmt = QTextFrameFormat()
    fmt.setProperty(MARK, True)
    fmt.setPadding(8)
    fmt.setTopMargin(2)
    fmt.setBottomMargin(6)
    fmt.setBorder(0)
    fmt.setBackground(QColor("#262b33" if dark else "#f3f4f6"))
    return fmt


def text_format(dark: bool) -> QTextCharFormat:
    fmt = QTextCharFormat()
    fmt.setForeground(QColor("#9aa4b1" if dark else "#57606a"))
    return fmt


def toggle_block(message: QTextFrame) -> QTextBlock:
    """The block after a message's header: the toggle line, where there is thinking."""
    return message.firstCursorPosition().block().next()


def thinking_frame(message: QTextFrame) -> QTextFrame | None:
    for child in message.childFrames():
        if child.frameFormat().property(MARK):
            return child
    return None


def set_toggle(message: QTextFrame, toggle: str) -> None:
    """Replace the toggle line's content with the HTML ``toggle``."""
    block = toggle_block(message)
    cursor = QTextCursor(block)
    cursor.setPosition(block.position() + block.length() - 1, QTextCursor.MoveMode.KeepAnchor)
    cursor.insertHtml(toggle)


def insert(cursor: QTextCursor, toggle: str, text: str, is_open: bool, dark: bool) -> QTextCursor:
    """Write the toggle line (and, open, the frame with ``text``) at ``cursor``, the start
    of an empty block; returns a cursor where what follows goes (an empty block)."""
    cursor.insertHtml(toggle)
    spaced = cursor.blockFormat()
    spaced.setBottomMargin(4)  # folded, the answer does not touch the toggle line
    cursor.setBlockFormat(spaced)
    if not is_open:
        cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
        return cursor
    frame = cursor.insertFrame(frame_format(dark))
    inner = frame.lastCursorPosition()
    inner.insertText(breakable(text), text_format(dark))
    after = QTextCursor(cursor.document())
    after.setPosition(frame.lastPosition() + 1)
    return after


def open_frame(message: QTextFrame, text: str, dark: bool) -> QTextCursor:
    """Show the thinking frame after the toggle line; returns a cursor at its end."""
    block = toggle_block(message)
    cursor = QTextCursor(block)
    cursor.setPosition(block.position() + block.length() - 1)
    frame = cursor.insertFrame(frame_format(dark))
    inner = frame.lastCursorPosition()
    inner.insertText(breakable(text), text_format(dark))
    # insertFrame at a block's end leaves an empty block after the frame: drop it.
    tail = QTextCursor(cursor.document())
    tail.setPosition(frame.lastPosition() + 1)
    if tail.block().length() == 1 and tail.block().next().isValid():
        tail.deleteChar()
    end = QTextCursor(cursor.document())
    end.setPosition(frame.lastPosition())
    return end


def close_frame(message: QTextFrame) -> None:
    """Remove the thinking frame (the text is kept by the caller)."""
    frame = thinking_frame(message)
    if frame is None:
        return
    cursor = remove_text_frame(frame)
    # The frame separated the toggle line from what follows: keep them apart.
    cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())


class Thoughts:
    """Each message's thinking as a transcript keeps it (its text, toggle line, why there
    is no answer, open or folded), and the streaming reply's live thinking."""

    def __init__(self) -> None:
        self.text: dict[int, str] = {}  # message index -> its thinking
        self.heads: dict[int, str] = {}  # message index -> its toggle line text
        self.notes: dict[int, str] = {}  # message index -> why it has no answer
        self.open: set[int] = set()  # message indexes whose thinking is shown
        self.cards: set[int] = set()  # message indexes that are a compaction's summary
        self.live = False  # the streaming reply is in its thinking
        self.started = 0.0  # monotonic() at the first thinking text
        self.tokens = 0  # the live thinking's tokens so far
        self.budget = 0  # the streaming reply's thinking budget (for its summary)

    def clear(self) -> None:
        self.text, self.heads, self.notes, self.open, self.cards = {}, {}, {}, set(), set()
        self.live = False

    def keep(self, index: int, thought: str, metrics: MessageMetrics | None, answer: str) -> None:
        """Message ``index``'s thinking, as it ended (``answer``: the text after it)."""
        if not thought:
            self.forget(index)
            return
        self.text[index] = thought
        self.heads[index] = metrics_summary(metrics, self.budget)
        self.notes[index] = no_answer_note(metrics)
        if not answer.strip():
            self.open.add(index)  # all thinking, no answer: show it

    def keep_message(
        self, index: int, m: Message, metrics: MessageMetrics | None, card: str = ""
    ) -> str:
        """Message ``index``'s thinking kept; the text to show as its answer. A summary
        (``card``: its fold line, "Summary of 14 earlier messages") is a folded card: its
        text where a reply's thinking goes, and no answer."""
        if not card:
            self.keep(index, m.reasoning, metrics, m.content)
            return m.content
        self.keep(index, m.content, metrics, m.content)
        self.heads[index], self.notes[index] = card, ""
        self.cards.add(index)
        return ""

    def no_answer(self, index: int) -> str:
        """Why message ``index`` shows thinking and no answer ("": say nothing)."""
        return self.notes.get(index, NO_ANSWER)

    def forget(self, index: int) -> None:
        self.text.pop(index, None)
        self.heads.pop(index, None)
        self.notes.pop(index, None)
        self.open.discard(index)
        self.cards.discard(index)

    def start(self, index: int) -> None:
        """The streaming reply (message ``index``) begins to think, open."""
        self.live = True
        self.started = time.monotonic()
        self.text[index] = ""
        self.open.add(index)

    def live_text(self) -> str:
        return live_text(time.monotonic() - self.started, self.tokens)

    def live_summary(self) -> str:
        return summary_text(time.monotonic() - self.started, self.tokens)
