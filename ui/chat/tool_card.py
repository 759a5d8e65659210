"""Tool calls in the transcript: one card per call, under the assistant message that made it.

A card is a child frame of the message's frame (marked with the call's id), so one card
is redrawn without touching the message's text. It says which tool of which server is
called with what arguments (pretty JSON, folded when long) and where the call stands:
waiting for the user (the four choices and Edit arguments…), running (with its time
and Stop), or ended (a one-line summary; the result folded, a click opens it).

Tool results are messages of their own in the conversation (role "tool"); the transcript
shows them only here, in the card of the call they answer. Everything on a card came from
the model or a server: it is escaped, and its links are the view's own
``lamplight://<key>/tool-<verb>/<message>/<call>`` actions.
"""

from __future__ import annotations

import html
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtGui import (
    QBrush,
    QColor,
    QGuiApplication,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
    QTextFormat,
    QTextFrame,
    QTextFrameFormat,
)

from app.chat.conversation import Message
from app.chat.markdown_render import breakable
from app.mcp.approvals import Decision

MARK = QTextFormat.Property.UserProperty + 29  # a card frame's format: its call's id
MAX_STATES = 1_000  # cards whose opened parts are remembered
MAX_CARDS = 64  # calls shown for one message (more come only from a hostile transcript)
ARGS_FOLD_CHARS = 600  # pretty arguments longer than this are folded
ARGS_FOLD_LINES = 12
PRETTY_LIMIT = 100_000  # longer arguments are shown as they came, not re-indented
RESULT_PREVIEW = 2_000  # characters of an opened result before "Show all"
SHOWN_LIMIT = 200_000  # characters of a result the view draws at all (Copy has them all)
TEXT_LIMIT = 1_000_000  # characters of any one field read from a message
STATE_TEXT = {
    "ask": "Waiting for your approval",
    "running": "Running…",
    "done": "Done",
    "error": "Failed",
    "denied": "Denied",
    "timeout": "Timed out",
    "cancelled": "Cancelled",
}
ERROR_STATES = ("error", "denied", "timeout")
CHOICES: tuple[tuple[Decision, str], ...] = (
    ("once", "Allow once"),
    ("always_tool", "Always for this tool"),
    ("always_server", "Always for this server"),
    ("deny", "Deny"),
)
# Verbs a card's links carry; the first ones go to the session, the rest stay in the view.
DECISIONS: dict[str, Decision] = {c: c for c, _ in CHOICES}
SESSION_VERBS = (*DECISIONS, "edit", "stop")
VIEW_VERBS = ("args", "result", "all", "copy")
LINK_STYLE = "color:#6b7a90; text-decoration:none"
ACTION_STYLE = "color:#2f6feb; text-decoration:none"


@dataclass(frozen=True)
class CardCall:
    """One call as its card shows it; ``result`` None until there is one."""

    id: str
    name: str
    server: str = ""
    arguments: str = "{}"
    state: str = "ask"
    ms: float = 0.0
    result: str | None = None
    is_error: bool = False


@dataclass
class CardState:
    """What the reader opened on a card, and when the view first saw it running."""

    args_open: bool = False
    result_open: bool = False
    result_all: bool = False
    started: float = field(default_factory=time.monotonic)


def _text(value: object, limit: int = TEXT_LIMIT) -> str:
    return value[:limit] if isinstance(value, str) else ""


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    return float(value) if 0 <= value < 1e12 else 0.0


def calls_of(message: Message, messages: Sequence[Message]) -> list[CardCall]:
    """The calls of assistant ``message``, each with its result from ``messages`` (the
    tool messages that answer it), read defensively: a transcript may be hostile."""
    raw_calls = getattr(message, "tool_calls", None)
    if not isinstance(raw_calls, list | tuple):
        return []
    results: dict[str, Message] = {}
    for m in messages:
        call_id = getattr(m, "tool_call_id", "")
        if m.role == "tool" and isinstance(call_id, str) and call_id:
            results.setdefault(call_id, m)
    calls = []
    for raw in raw_calls[:MAX_CARDS]:
        if not isinstance(raw, Mapping):
            continue
        call_id = _text(raw.get("id"), 200)
        state = _text(raw.get("state"), 20)
        found = results.get(call_id) if call_id else None
        calls.append(
            CardCall(
                id=call_id,
                name=_text(raw.get("name"), 200) or "(unnamed tool)",
                server=_text(raw.get("server"), 200),
                arguments=_text(raw.get("arguments")) or "{}",
                state=state if state in STATE_TEXT else "error",
                ms=_number(raw.get("ms")),
                result=None if found is None else _text(found.content),
                is_error=bool(getattr(found, "is_error", False)) if found else False,
            )
        )
    return calls


def pretty_arguments(text: str) -> str:
    """``text`` (a JSON object, as the model wrote it) indented for reading; as it came
    when it is not JSON or too long to re-indent."""
    if len(text) > PRETTY_LIMIT:
        return text
    try:
        value = json.loads(text)
        return json.dumps(value, indent=2, ensure_ascii=False)
    except (ValueError, RecursionError):
        return text


def _folded(text: str) -> tuple[str, bool]:
    """``text`` cut to what a folded block shows, and whether anything was cut."""
    lines = text.splitlines()
    if len(text) <= ARGS_FOLD_CHARS and len(lines) <= ARGS_FOLD_LINES:
        return text, False
    return "\n".join(lines[:ARGS_FOLD_LINES])[:ARGS_FOLD_CHARS] + "\n…", True


def duration_text(ms: float) -> str:
    seconds = ms / 1000
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s"


def summary_text(call: CardCall) -> str:
    """The one line of an ended call: ``Done in 1.2 s · 345 characters``."""
    parts = [STATE_TEXT.get(call.state, "Failed")]
    if call.ms and call.state in ("done", "error"):
        parts[0] += f" in {duration_text(call.ms)}"
    if call.result is not None:
        first = call.result.strip().splitlines()[0][:120] if call.result.strip() else ""
        if call.is_error and first:
            parts.append(first)
        else:
            n = len(call.result)
            parts.append(f"{n:,} character{'s' * (n != 1)}")
    return " · ".join(parts)


def accessible_text(call: CardCall) -> str:
    """The card in words, for a screen reader and the card's tooltip."""
    where = f" of server {call.server}" if call.server else ""
    state = STATE_TEXT.get(call.state, "Failed")
    if call.state not in ("ask", "running"):
        state = summary_text(call)
    return f"Tool call: {call.name}{where}. {state}."


def _pre(text: str, dark: bool) -> str:
    bg = "#1b1f24" if dark else "#ffffff"
    return (
        f"<p style='white-space:pre-wrap; font-family:monospace; background:{bg}; "
        f"margin-top:4px; margin-bottom:4px'>{html.escape(breakable(text))}</p>"
    )


def _link(href: str, label: str, style: str = LINK_STYLE) -> str:
    return f"<a href='{href}' style='{style}'>{html.escape(label)}</a>"


def _error_colour(dark: bool) -> str:
    return "#ff7b72" if dark else "#d1242f"


def _head_html(call: CardCall, state_line: str, dark: bool) -> str:
    colour = _error_colour(dark) if call.state in ERROR_STATES else "#888888"
    server = (
        f" <span style='color:#888888'><small>· {html.escape(call.server)}</small></span>"
        if call.server
        else ""
    )
    return (
        f"<p style='margin:0'><b>⚙ {html.escape(call.name)}</b>{server}&nbsp;&nbsp;"
        f"<span style='color:{colour}'><small>{html.escape(state_line)}</small></span></p>"
    )


def _args_html(call: CardCall, view: CardState, href: Callable[[str], str], dark: bool) -> str:
    pretty = pretty_arguments(call.arguments)
    folded, long = _folded(pretty)
    out = _pre(pretty if view.args_open else folded, dark)
    if long:
        label = "Fold arguments" if view.args_open else "Show all arguments"
        out += f"<p style='margin:0'><small>{_link(href('args'), label)}</small></p>"
    return out


def _result_html(call: CardCall, view: CardState, href: Callable[[str], str], dark: bool) -> str:
    colour = _error_colour(dark) if call.state in ERROR_STATES or call.is_error else "#888888"
    line = html.escape(summary_text(call))
    if call.result is None:
        return f"<p style='margin:0; color:{colour}'><small>{line}</small></p>"
    arrow = "▾" if view.result_open else "▸"
    toggle = _link(href("result"), f"{arrow} Result")
    copy = _link(href("copy"), "Copy result")
    out = (
        f"<p style='margin:0'><small>{toggle}&nbsp;&nbsp;<span style='color:{colour}'>{line}"
        f"</span>&nbsp;&nbsp;&nbsp;{copy}</small></p>"
    )
    if view.result_open:
        limit = SHOWN_LIMIT if view.result_all else RESULT_PREVIEW
        out += _pre(call.result[:limit] or "(empty result)", dark)
        if len(call.result) > limit:
            more = (
                f"Show all ({len(call.result):,} characters)"
                if not view.result_all
                else f"Only the first {SHOWN_LIMIT:,} characters are shown: Copy result has "
                "them all"
            )
            link = _link(href("all"), more) if not view.result_all else html.escape(more)
            out += f"<p style='margin:0'><small>{link}</small></p>"
    return out


def card_html(
    call: CardCall, view: CardState, href: Callable[[str], str], dark: bool, now: float
) -> str:
    """The card of ``call``; ``href(verb)`` is the link of one of its actions."""
    if call.state == "running":
        elapsed = duration_text(max(0.0, now - view.started) * 1000)
        head = _head_html(call, f"Running… {elapsed}", dark)
        body = _args_html(call, view, href, dark)
        stop = _link(href("stop"), "■ Stop", ACTION_STYLE)
        return f"{head}{body}<p style='margin:0'>{stop}</p>"
    if call.state == "ask":
        head = _head_html(call, STATE_TEXT["ask"], dark)
        links = [_link(href(verb), label, ACTION_STYLE) for verb, label in CHOICES]
        links.append(_link(href("edit"), "Edit arguments…", ACTION_STYLE))
        return (
            f"{head}{_args_html(call, view, href, dark)}<p style='margin:0'>{' · '.join(links)}</p>"
        )
    head = _head_html(call, STATE_TEXT.get(call.state, "Failed"), dark)
    return f"{head}{_args_html(call, view, href, dark)}{_result_html(call, view, href, dark)}"


def frame_format(call_id: str, dark: bool) -> QTextFrameFormat:
    fmt = QTextFrameFormat()
    fmt.setProperty(MARK, call_id or "-")
    fmt.setPadding(8)
    fmt.setTopMargin(4)
    fmt.setBottomMargin(4)
    fmt.setBorder(1)
    fmt.setBorderBrush(QBrush(QColor("#3d444d" if dark else "#d0d7de")))
    fmt.setBorderStyle(QTextFrameFormat.BorderStyle.BorderStyle_Solid)
    fmt.setBackground(QColor("#22272e" if dark else "#f6f8fa"))
    return fmt


def card_frames(message: QTextFrame) -> list[QTextFrame]:
    """The card frames of a message's frame, in order."""
    return [f for f in message.childFrames() if f.frameFormat().property(MARK)]


def _fill_frame(frame: QTextFrame, content: str) -> None:
    cursor = QTextCursor(frame.document())
    cursor.setPosition(frame.firstPosition())
    cursor.setPosition(frame.lastPosition(), QTextCursor.MoveMode.KeepAnchor)
    cursor.insertHtml(content)


class ToolCards(QObject):
    """The cards of a transcript: drawn into its message frames, redrawn on a change, and
    ticking once a second while a call runs.

    ``copied("tool result")`` is called when a result went to the clipboard.

    Signals:
        requested(str, str): a verb from ``SESSION_VERBS`` and the call's id.
    """

    requested = Signal(str, str)

    def __init__(
        self,
        parent: QObject,
        link_base: str,
        dark: Callable[[], bool],
        copied: Callable[[str], None],
    ) -> None:
        super().__init__(parent)
        self._base = link_base  # "lamplight://<key>": a card's links go under it
        self._dark = dark
        self._copied = copied
        self._calls: dict[int, list[CardCall]] = {}  # message index -> its calls
        self._frames: dict[int, QTextFrame] = {}  # message index -> its frame
        self._states: dict[str, CardState] = {}  # call id -> what the reader opened
        self._timer = QTimer(self)
        self._timer.setInterval(1000)
        self._timer.timeout.connect(self._on_tick)

    def clear(self) -> None:
        """Forget the frames (the view was cleared); what the reader opened stays, so a
        redraw between rounds keeps it, unless it grew long."""
        self._calls.clear()
        self._frames.clear()
        self._timer.stop()
        if len(self._states) > MAX_STATES:
            self._states.clear()

    def calls(self, index: int) -> list[CardCall]:
        return list(self._calls.get(index, ()))

    def show_message(
        self, index: int, frame: QTextFrame, message: Message, messages: Sequence[Message]
    ) -> None:
        """Draw message ``index``'s cards (none: remove any), results from ``messages``."""
        calls = calls_of(message, messages)
        if calls or index in self._calls:
            self.show(index, frame, calls)

    def show(self, index: int, frame: QTextFrame, calls: list[CardCall]) -> None:
        """Draw (or redraw) message ``index``'s cards at the end of its ``frame``."""
        self._frames[index] = frame
        old = self._calls.get(index, [])
        self._calls[index] = calls
        for call in calls:
            state = self._states.setdefault(call.id, CardState())
            was = next((c.state for c in old if c.id == call.id), "")
            if call.state == "running" and was != "running":
                state.started = time.monotonic()
        existing = card_frames(frame)
        if len(existing) != len(calls):
            self._rebuild(frame, existing, calls, index)
        else:
            for pos, (card, call) in enumerate(zip(existing, calls, strict=True)):
                _fill_frame(card, self._html(call, index, pos))
        self._sync_timer()

    def _rebuild(
        self, frame: QTextFrame, existing: list[QTextFrame], calls: list[CardCall], index: int
    ) -> None:
        for card in reversed(existing):
            cursor = QTextCursor(card.document())
            cursor.setPosition(card.firstPosition() - 1)
            cursor.setPosition(card.lastPosition() + 1, QTextCursor.MoveMode.KeepAnchor)
            cursor.removeSelectedText()
        dark = self._dark()
        for pos, call in enumerate(calls):
            cursor = frame.lastCursorPosition()
            if cursor.block().length() > 1:  # never inside the body's last line
                cursor.insertBlock(QTextBlockFormat(), QTextCharFormat())
            card = cursor.insertFrame(frame_format(call.id, dark))
            _fill_frame(card, self._html(call, index, pos))

    def _html(self, call: CardCall, index: int, pos: int) -> str:
        state = self._states.setdefault(call.id, CardState())

        def href(verb: str) -> str:
            return f"{self._base}/tool-{verb}/{index}/{pos}"

        return card_html(call, state, href, self._dark(), time.monotonic())

    def redraw(self, index: int) -> None:
        frame = self._frames.get(index)
        if frame is not None and index in self._calls:
            self.show(index, frame, self._calls[index])

    def _sync_timer(self) -> None:
        running = any(c.state == "running" for cs in self._calls.values() for c in cs)
        if running and not self._timer.isActive():
            self._timer.start()
        elif not running:
            self._timer.stop()

    def _on_tick(self) -> None:
        for index, calls in list(self._calls.items()):
            frame = self._frames.get(index)
            if frame is None:
                continue
            cards = card_frames(frame)
            for pos, call in enumerate(calls):
                if call.state == "running" and pos < len(cards):
                    _fill_frame(cards[pos], self._html(call, index, pos))

    def activate(self, verb: str, index: int, pos: int) -> bool:
        """A card's link was clicked; False when it names no card."""
        calls = self._calls.get(index, [])
        if not 0 <= pos < len(calls):
            return False
        call = calls[pos]
        if verb in SESSION_VERBS:
            self.requested.emit(verb, call.id)
            return True
        state = self._states.setdefault(call.id, CardState())
        if verb == "args":
            state.args_open = not state.args_open
        elif verb == "result":
            state.result_open = not state.result_open
        elif verb == "all":
            state.result_all = True
        elif verb == "copy":
            QGuiApplication.clipboard().setText(call.result or "")
            self._copied("tool result")
            return True
        else:
            return False
        self.redraw(index)
        return True

    def call_at(self, call_id: str) -> tuple[int, int] | None:
        """Where the card of ``call_id`` is: (message index, call position)."""
        for index, calls in self._calls.items():
            for pos, call in enumerate(calls):
                if call.id == call_id:
                    return index, pos
        return None

    def waiting(self) -> list[CardCall]:
        """The calls waiting for the user's choice, in the order shown."""
        return [c for i in sorted(self._calls) for c in self._calls[i] if c.state == "ask"]

    def running(self) -> bool:
        return self._timer.isActive()


def parse_arguments(text: str, limit: int = 256 * 1024) -> tuple[dict[str, Any] | None, str]:
    """Edited arguments checked as the session will read them: a JSON object, or why not."""
    if len(text) > limit:
        return None, f"The arguments are too long (over {limit // 1024} KiB)."
    try:
        value = json.loads(text)
    except RecursionError:
        return None, "The arguments are nested too deeply."
    except ValueError as exc:
        return None, f"The arguments are not valid JSON: {exc}."
    if not isinstance(value, dict):
        return None, "The arguments must be a JSON object ({…})."
    return value, ""
