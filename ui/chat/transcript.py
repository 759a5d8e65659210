"""The conversation view: message frames, streamed text, Markdown once a reply ends."""

from __future__ import annotations

import html
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from PySide6.QtCore import QMimeData, QUrl, Signal
from PySide6.QtGui import (
    QColor,
    QDesktopServices,
    QPalette,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextFrame,
    QTextFrameFormat,
)
from PySide6.QtWidgets import QApplication, QTextBrowser, QWidget

from app.chat.conversation import Message
from app.chat.markdown_render import RUN_LIMIT, code_blocks, render_markdown, strip_breaks
from app.engine.metrics import MessageMetrics
from ui.chat import long_text, thinking_block
from ui.chat.citations import MessageSources
from ui.chat.image_viewer import MessageImages
from ui.chat.message_header import (
    ACTION_SCHEME,
    FORGOTTEN,
    SUMMARISED,
    MessageHeaders,
    summary_head,
)
from ui.chat.tool_card import ToolCards
from ui.common.draft_stats import reply_footer

SAFE_LINK_SCHEMES = ("http", "https", "mailto")
ACTIONS = ("edit", "fork", "regenerate", "drop-older", "answer", "prev-version", "next-version")
UNANSWERED = "not answered yet"


class TranscriptView(QTextBrowser):
    """Shows the conversation.

    While a reply streams its text is appended as plain text at the end of
    its frame, a cost that does not depend on how long the message or the
    conversation already is; when the reply ends, that frame alone is
    re-rendered as Markdown. Each message header carries its actions as
    ``lamplight://<key>/<action>/<index>`` links, where ``key`` is a random
    per-view secret: message text is rendered without such links anyway, and
    the key keeps anything that did slip through from acting.

    Every finished message offers Copy, and each of its code blocks a Copy link of
    its own; both copy the message's source text, not what the view draws.

    A reply's tool calls show under it as cards (``ui.chat.tool_card``), with the results.

    A reply's thinking shows above its answer (``ui.chat.thinking_block``): open and
    live while it streams, folded once the answer starts (a click opens it), open with
    a note when there is no answer. It has its own Copy thinking link.

    Signals:
        linkActivated(QUrl): the user clicked a link that is safe to open.
        actionRequested(str, int): "edit", "fork" or "regenerate", and the message index.
        copied(str): what was put on the clipboard, in words ("message", "code block",
            "thinking").
        sourceActivated(Source): the user clicked a passage of a message's "Sources" list
            (``ui.chat.citations``: it shows in the message sent with them).
    """

    linkActivated = Signal(QUrl)
    actionRequested = Signal(str, int)
    copied = Signal(str)
    sourceActivated = Signal(object)

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
        self._frames: list[QTextFrame] = []
        self._texts: dict[int, str] = {}  # message index -> its source text (for Copy)
        self._key = secrets.token_hex(8)
        self.headers = MessageHeaders(self._key, self._frame)
        self._run = 0  # characters since the last whitespace in the streaming reply
        self.thoughts = thinking_block.Thoughts()
        self._think_cursor: QTextCursor | None = None  # end of the live thinking frame
        self.cards = ToolCards(self, f"{ACTION_SCHEME}://{self._key}", self._dark, self.copied.emit)
        self.images = MessageImages(self, f"{ACTION_SCHEME}://{self._key}/image")
        href = f"{ACTION_SCHEME}://{self._key}/source"
        self.sources = MessageSources(href, self._dark, self.sourceActivated.emit)
        self._show_placeholder()

    # A QTextBrowser fetches <img> and stylesheet URLs through this; Lamplight fetches nothing.
    def loadResource(self, type: int, name: QUrl | str) -> object:  # Qt's name
        return None

    def createMimeDataFromSelection(self) -> QMimeData:  # Qt's name
        """Copied text without the invisible break opportunities added for layout."""
        data = QMimeData()
        data.setText(strip_breaks(self.textCursor().selection().toPlainText()))
        return data

    def _dark(self) -> bool:
        return self.palette().color(QPalette.ColorRole.Base).lightness() < 128

    def _show_placeholder(self) -> None:
        self.setHtml(
            "<p style='color:#888888' align='center'><br><br>Type a message below and press "
            "Enter.<br>Shift+Enter adds a line; Esc stops a reply.</p>"
        )
        self._placeholder = True

    def clear_conversation(self) -> None:
        self._stream_frame, self._stream_cursor = None, None
        self._frames, self._texts = [], {}
        self.headers.clear()
        self.thoughts.clear()
        self._think_cursor = None
        self.cards.clear()
        self.images.clear()
        self.sources.clear()
        self._show_placeholder()

    def show_messages(
        self,
        messages: Sequence[Message],
        versions: Sequence[tuple[int, int]] = (),
        answerable: bool = False,
    ) -> None:
        """Render a whole conversation (on open, edit, regenerate).

        ``versions``: each message's (position, count) among its versions;
        ``answerable``: a last user message without a reply offers Answer.
        """
        self.clear_conversation()
        self.headers.versions = {i: v for i, v in enumerate(versions) if v[1] > 1}
        last_reply = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=-1)
        for i, m in enumerate(messages):
            note = FORGOTTEN if m.forgotten else SUMMARISED if m.summarised else ""
            if m.role == "user":
                last = answerable and i == len(messages) - 1
                actions: tuple[str, ...] = ("answer", "edit", "fork") if last else ("edit", "fork")
                actions = () if m.summarised else actions  # read only through its summary
                note = note or (UNANSWERED if last else "")
                self.add_user_message(m.content, i, note, m.created, actions, m.images, m.sources)
            elif m.role == "assistant":
                metrics = m.message_metrics()
                self.headers.times[i] = m.created
                frame = self._new_frame("assistant", i, () if m.summarised else ("fork",), note)
                self._texts[i] = m.content
                card = summary_head(messages, i) if m.summary_of else ""  # a folded card
                text = self.thoughts.keep_message(i, m, metrics, card)
                self._fill(frame, text, reply_footer(metrics) if metrics else "", "", i)
                self.show_tool_calls(i, m, messages)
            elif m.role == "tool" and self._frames:
                self._frames.append(self._frames[-1])  # a result: its call's card shows it
        self.headers.set_last_reply(last_reply)
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())

    def _new_frame(
        self, role: str, index: int, actions: tuple[str, ...], note: str = ""
    ) -> QTextFrame:
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
        inner = frame.firstCursorPosition()
        inner.insertHtml(self.headers.html(role, index, actions, note))
        inner.insertBlock(QTextBlockFormat(), self._body_format)
        while len(self._frames) <= index:
            self._frames.append(frame)
        self._frames[index] = frame
        return frame

    def _frame(self, index: int) -> QTextFrame | None:
        return self._frames[index] if 0 <= index < len(self._frames) else None

    def add_user_message(
        self,
        text: str,
        index: int = 0,
        note: str = "",
        created: float | None = None,
        actions: tuple[str, ...] = ("edit", "fork"),
        images: Sequence[Mapping[str, Any]] = (),
        sources: object = (),
    ) -> None:
        """``sources``: the passages sent with it (saved dicts or ``Source``s)."""
        at_bottom = self._at_bottom()
        self.headers.times[index] = time.time() if created is None else created
        self._texts[index] = text
        frame = self._new_frame("user", index, actions, note)
        cursor = frame.lastCursorPosition()
        cursor.insertHtml(self.images.html(index, images) + self._body_html(text, index))
        self.sources.show(index, frame, sources)
        self._follow(at_bottom)

    def begin_reply(self, index: int = 1) -> None:
        """Open the frame a streamed reply goes into."""
        at_bottom = self._at_bottom()
        self.headers.set_last_reply(-1)
        self.headers.times[index] = time.time()
        self._texts.pop(index, None)
        self.thoughts.forget(index)
        self._think_cursor = None
        self.thoughts.live = False
        self._stream_frame = self._new_frame("assistant", index, ())
        self._stream_index = index
        self._stream_cursor = self._stream_frame.lastCursorPosition()
        self._run = 0
        self._follow(at_bottom)

    def append_stream(self, text: str) -> None:
        """Append plain reply text at the end of the streaming frame."""
        if self._stream_cursor is None or not text:
            return
        at_bottom = self._at_bottom()
        if self.thinking_live:
            self.end_thinking()  # the answer starts: fold the thinking away
        self._stream_cursor.insertText(self._breakable_stream(text), self._body_format)
        self._follow(at_bottom)

    def _breakable_stream(self, text: str) -> str:
        """``text`` with a break opportunity wherever the streamed run grows past the limit."""
        out = []
        for ch in text:
            if ch.isspace():
                self._run = 0
            elif self._run >= RUN_LIMIT:
                out.append("\u200b")
                self._run = 1
            else:
                self._run += 1
            out.append(ch)
        return "".join(out)

    def end_reply(
        self,
        text: str,
        footer: str = "",
        error: str = "",
        kept: bool = True,
        thinking: str | None = None,
        metrics: MessageMetrics | None = None,
    ) -> None:
        """Replace the streamed text with its Markdown rendering and add a footer line.

        ``kept`` says the reply is now a message of the conversation (and so gets actions);
        ``thinking`` (None: what streamed) and ``metrics`` give its thinking block.
        """
        frame = self._stream_frame
        if frame is None:
            return
        at_bottom = self._at_bottom()
        index = self._stream_index
        if kept:
            self._texts[index] = text
        streamed = self.thoughts.text.get(index, "")
        live = self.thoughts.live_summary()
        self._think_cursor, self.thoughts.live = None, False
        thought = streamed if thinking is None else thinking
        self.thoughts.keep(index, thought, metrics, text)
        if thought and (metrics is None or not metrics.reasoning_tokens):
            self.thoughts.heads[index] = live
        self._fill(frame, text, footer, error, index if kept else -1, index)
        self._stream_frame, self._stream_cursor = None, None
        if kept:
            self.headers.set_last_reply(self._stream_index)
        self._follow(at_bottom)

    # -- thinking ------------------------------------------------------------------------

    @property
    def thinking_live(self) -> bool:
        """The streaming reply is thinking (no answer text yet)."""
        return self.thoughts.live and self._stream_frame is not None

    def _action_href(self, action: str, index: int) -> str:
        return f"{ACTION_SCHEME}://{self._key}/{action}/{index}"

    def _toggle(self, index: int, is_open: bool) -> str:
        live = self.thoughts.live and index == self._stream_index and self.streaming
        text = self.thoughts.live_text() if live else self.thoughts.heads.get(index, "Thinking")
        copy = self._action_href("copy-thinking", index) if index in self._texts else ""
        what = "summary" if index in self.thoughts.cards else "thinking"
        return thinking_block.toggle_html(
            self._action_href("thinking", index), text, is_open, copy, what
        )

    def append_thinking(self, text: str, tokens: int) -> None:
        """Append thinking text to the streaming reply (``tokens``: its count so far)."""
        frame, index = self._stream_frame, self._stream_index
        if frame is None or self._stream_cursor is None or not text:
            return
        at_bottom = self._at_bottom()
        if not self.thoughts.live and index not in self.thoughts.text:
            self.thoughts.start(index)
            self._run = 0
            cursor = QTextCursor(self._stream_cursor)
            self._stream_cursor = thinking_block.insert(
                cursor, self._toggle(index, True), "", True, self._dark()
            )
            inner = thinking_block.thinking_frame(frame)
            self._think_cursor = inner.lastCursorPosition() if inner is not None else None
        self.thoughts.text[index] += text
        self.thoughts.tokens = tokens
        if self._think_cursor is not None:
            shade = thinking_block.text_format(self._dark())
            self._think_cursor.insertText(self._breakable_stream(text), shade)
        self._follow(at_bottom)

    def tick_thinking(self) -> None:
        """Update the live toggle line's time and token count."""
        if self.thinking_live and self._stream_frame is not None:
            index = self._stream_index
            is_open = index in self.thoughts.open
            thinking_block.set_toggle(self._stream_frame, self._toggle(index, is_open))

    def end_thinking(self) -> None:
        """The answer starts: fold the thinking away, with its time and token count."""
        frame = self._stream_frame
        if not self.thoughts.live or frame is None:
            return
        index = self._stream_index
        self.thoughts.heads[index] = self.thoughts.live_summary()
        self.thoughts.live = False
        self._think_cursor = None
        self._run = 0
        if index in self.thoughts.open:
            self.thoughts.open.discard(index)
            thinking_block.close_frame(frame)
        thinking_block.set_toggle(frame, self._toggle(index, False))
        self._stream_cursor = frame.lastCursorPosition()

    def toggle_thinking(self, index: int) -> bool:
        """Open or fold message ``index``'s thinking; False if it has none."""
        if index not in self.thoughts.text or not 0 <= index < len(self._frames):
            return False
        frame = self._frames[index]
        streaming = self.streaming and index == self._stream_index
        if index in self.thoughts.open:
            self.thoughts.open.discard(index)
            thinking_block.close_frame(frame)
            self._think_cursor = None if streaming else self._think_cursor
        else:
            self.thoughts.open.add(index)
            thought = self.thoughts.text[index]
            shown = thought if streaming else long_text.cut_plain(thought)
            end = thinking_block.open_frame(frame, shown, self._dark())
            if streaming and self.thoughts.live:
                self._think_cursor = end
        thinking_block.set_toggle(frame, self._toggle(index, index in self.thoughts.open))
        if streaming:
            self._stream_cursor = frame.lastCursorPosition()
        return True

    def thinking_open(self, index: int) -> bool:
        return index in self.thoughts.open

    def copy_thinking(self, index: int) -> bool:
        """Put message ``index``'s thinking on the clipboard."""
        text = self.thoughts.text.get(index)
        if not text:
            return False
        QApplication.clipboard().setText(text)
        self.copied.emit("thinking")
        return True

    def show_tool_calls(self, index: int, message: Message, messages: Sequence[Message]) -> None:
        """Draw (or redraw) message ``index``'s call cards, with results from ``messages``."""
        if 0 <= index < len(self._frames):
            self.cards.show_message(index, self._frames[index], message, messages)

    def _code_link(self, index: int) -> Callable[[int], str] | None:
        if index < 0:
            return None
        return lambda n: f"{ACTION_SCHEME}://{self._key}/copy-code/{index}/{n}"

    def _fill(
        self,
        frame: QTextFrame,
        text: str,
        footer: str,
        error: str,
        index: int,
        slot: int | None = None,
    ) -> None:
        """Render a message's body; ``slot``: its place (for its thinking) when ``index``
        is -1 (a reply not kept)."""
        slot = index if slot is None else slot
        cursor = frame.firstCursorPosition()
        cursor.movePosition(QTextCursor.MoveOperation.NextBlock)  # keep the header
        cursor.setPosition(frame.lastPosition(), QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()
        parts = []
        thought = self.thoughts.text.get(slot, "")
        if thought:
            is_open = slot in self.thoughts.open
            toggle = self._toggle(slot, is_open)
            shown = long_text.cut_plain(thought)  # Copy thinking copies all of it
            cursor = thinking_block.insert(cursor, toggle, shown, is_open, self._dark())
        if text.strip():
            parts.append(self._body_html(text, index))
        elif thought and not error and (note := self.thoughts.no_answer(slot)):
            parts.append(f"<p style='color:#888888'><i>{html.escape(note)}</i></p>")
        if error:
            parts.append(f"<p style='color:#d1242f'>{html.escape(error)}</p>")
        if footer:
            parts.append(f"<p style='color:#888888; font-size:small'>{html.escape(footer)}</p>")
        cursor.insertHtml("".join(parts) or "<p style='color:#888888'>(no reply)</p>")

    def _body_html(self, text: str, index: int) -> str:
        """A message's text as drawn: a long one only in part (``ui.chat.long_text``)."""
        if not text:
            return ""
        body = render_markdown(long_text.cut(text), self._dark(), self._code_link(index))
        href = self._action_href("show-all", index) if index >= 0 else ""  # -1: not kept
        return body + long_text.more_html(text, href)

    def show_all(self, index: int) -> long_text.LongTextViewer | None:
        """Message ``index``'s whole text in a viewer (a message too long to draw)."""
        text = self._texts.get(index)
        if text is None:
            return None
        viewer = long_text.LongTextViewer(text, f"Message {index + 1}", self)
        viewer.show()
        return viewer

    def add_notice(self, text: str, action: str = "", label: str = "") -> None:
        """A one-line note from the app (an error, a model change, a rebuilt cache),
        optionally with one app action link (``action`` from ``ACTIONS``, index 0)."""
        if self._placeholder:
            self.clear()
            self._placeholder = False
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        if cursor.block().length() > 1:  # Qt merges HTML into the last paragraph otherwise
            cursor.insertBlock()
        link = (
            f' <a href="{ACTION_SCHEME}://{self._key}/{action}/0">{html.escape(label)}</a>'
            if action
            else ""
        )
        cursor.insertHtml(f"<p style='color:#888888'><i>{html.escape(text)}</i>{link}</p>")

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

    def show_message(self, index: int, term: str = "") -> bool:
        """Scroll to message ``index`` and select the first ``term`` in it (a search hit)."""
        if not 0 <= index < len(self._frames):
            return False
        frame = self._frames[index]
        thought = self.thoughts.text.get(index, "").lower()
        answer = self._texts.get(index, "").lower()
        hidden = term and term.lower() in thought and term.lower() not in answer
        if hidden and index not in self.thoughts.open:
            self.toggle_thinking(index)  # the hit is in the folded thinking
        cursor = frame.firstCursorPosition()
        if term:
            found = self.document().find(term, cursor)
            if not found.isNull() and found.position() <= frame.lastPosition():
                cursor = found
        bar = self.verticalScrollBar()
        top = self.cursorRect(frame.firstCursorPosition()).top() + bar.value()
        self.setTextCursor(cursor)
        bar.setValue(max(0, top - 12))
        self.ensureCursorVisible()
        return True

    def copy_message(self, index: int, block: int | None = None) -> bool:
        """Put message ``index`` (or its ``block``-th code block) on the clipboard."""
        text = self._texts.get(index)
        if text is None:
            return False
        what = "message"
        if block is not None:
            blocks = code_blocks(text)
            if not 0 <= block < len(blocks):
                return False
            text, what = blocks[block], "code block"
        QApplication.clipboard().setText(text)
        self.copied.emit(what)
        return True

    def _on_anchor_clicked(self, url: QUrl) -> None:
        if url.scheme() == ACTION_SCHEME:
            if url.host() != self._key:
                return
            action, *rest = url.path().strip("/").split("/")
            if not rest or not all(p.isdigit() and len(p) < 9 for p in rest):
                return
            numbers = [int(p) for p in rest]
            if action == "copy" and len(numbers) == 1:
                self.copy_message(numbers[0])
            elif action == "copy-thinking" and len(numbers) == 1:
                self.copy_thinking(numbers[0])
            elif action == "thinking" and len(numbers) == 1:
                self.toggle_thinking(numbers[0])
            elif action.startswith("tool-") and len(numbers) == 2:
                self.cards.activate(action[5:], numbers[0], numbers[1])
            elif action == "source" and len(numbers) == 2:
                self.sources.activate(numbers[0], numbers[1])
            elif action == "image" and len(numbers) == 2:
                self.images.activate(numbers[0], numbers[1])
            elif action == "show-all" and len(numbers) == 1:
                self.show_all(numbers[0])
            elif action == "copy-code" and len(numbers) == 2:
                self.copy_message(numbers[0], numbers[1])
            elif action in ACTIONS and len(numbers) == 1:
                self.actionRequested.emit(action, numbers[0])
            return
        if url.scheme() in SAFE_LINK_SCHEMES:
            self.linkActivated.emit(url)
            QDesktopServices.openUrl(url)
