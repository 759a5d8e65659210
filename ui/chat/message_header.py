"""A transcript message's header line: who wrote it, when, its versions and its actions;
``MessageHeaders`` keeps each message's and redraws it in place when that changes."""

from __future__ import annotations

import html
import time
from collections.abc import Callable, Sequence

from PySide6.QtGui import QTextCursor, QTextFrame

from app.chat.compaction import summarised_before
from app.chat.conversation import Message

ACTION_SCHEME = "lamplight"
FORGOTTEN = "not in the model's memory"
SUMMARISED = "summarised: the model reads it in the summary below"
VERSION_TIPS = {"prev-version": "Previous version", "next-version": "Next version"}
# A lone "‹" in small type was a 5 px target: the arrows are drawn larger, and the link
# takes in the no-break spaces around them, so the clickable part is about 24 px wide.
ARROW_PAD = "&nbsp;&nbsp;"
ARROW_SIZE = "text-decoration:none; font-size:large; font-weight:bold"


def summary_head(messages: Sequence[Message], index: int) -> str:
    """A summary card's fold line: "Summary of 14 earlier messages"."""
    n = summarised_before(messages, index)
    return f"Summary of {n} earlier message{'s' * (n != 1)}"


def stamp_text(created: float, now: float | None = None) -> str:
    """A message's time as its header shows it: "14:32" today, "Nov 21, 14:32" this
    year, "2025-11-21 14:32" before."""
    try:
        at = time.localtime(created)
        today = time.localtime(now)
    except (OverflowError, OSError, ValueError):
        return ""
    if at[:3] == today[:3]:
        return time.strftime("%H:%M", at)
    if at.tm_year == today.tm_year:
        return time.strftime("%b %d, %H:%M", at)
    return time.strftime("%Y-%m-%d %H:%M", at)


def header_html(
    key: str,
    role: str,
    index: int,
    actions: tuple[str, ...],
    note: str = "",
    created: float | None = None,
    names: dict[str, str] | None = None,
    version: tuple[int, int] = (1, 1),
) -> str:
    name = (names or {}).get(role) or ("You" if role == "user" else "Assistant")
    position, count = version
    switch = ""
    if count > 1:
        # "‹ 2/3 ›": the other versions regenerate and edit kept (links only where there is one).
        def arrow(sign: str, action: str, live: bool) -> str:
            padded = f"{ARROW_PAD}{sign}{ARROW_PAD}"
            if not live:  # as wide as a live one: the header does not shift between versions
                return f"<span style='color:#c0c0c0; {ARROW_SIZE}'>{padded}</span>"
            href = f"{ACTION_SCHEME}://{key}/{action}/{index}"
            style = f"color:#6b7a90; {ARROW_SIZE}"
            return f'<a href="{href}" title="{VERSION_TIPS[action]}" style="{style}">{padded}</a>'

        switch = (
            f"&nbsp;{arrow('‹', 'prev-version', position > 1)}<small>{position}/{count}</small>"
            f"{arrow('›', 'next-version', position < count)}"
        )
    # A finished message (one with actions) can always be copied.
    shown = (*actions, "copy") if actions else ()
    links = " · ".join(
        f'<a href="{ACTION_SCHEME}://{key}/{a}/{index}" style="color:#6b7a90">{a.capitalize()}</a>'
        for a in shown
    )
    when = stamp_text(created) if created is not None else ""
    stamp = f"&nbsp;&nbsp;<small>{html.escape(when)}</small>" if when else ""
    sep = "&nbsp;&nbsp;&nbsp;" if links else ""
    aside = f"&nbsp;&nbsp;<small><i>· {html.escape(note)}</i></small>" if note else ""
    return (
        f"<span style='color:#888888'><b>{name}</b>{stamp}{switch}{sep}<small>{links}</small>"
        f"{aside}</span>"
    )


class MessageHeaders:
    """The header line of each message of a transcript: drawn with its frame, redrawn in
    place when its versions, its actions (only the last reply offers Regenerate) or the
    senders' names change. ``frame(index)``: the message's frame (None: none)."""

    def __init__(self, key: str, frame: Callable[[int], QTextFrame | None]) -> None:
        self._key = key
        self._frame = frame
        self.times: dict[int, float] = {}  # message index -> when it was written
        self.versions: dict[int, tuple[int, int]] = {}  # message index -> (position, count)
        self._heads: dict[int, tuple[str, tuple[str, ...], str]] = {}  # role, actions, note
        self.last_reply = -1
        # Header names by role instead of You/Assistant (continue-the-text mode's).
        self.role_names: dict[str, str] = {}

    def clear(self) -> None:
        self.times, self.versions, self._heads = {}, {}, {}
        self.last_reply = -1

    def html(self, role: str, index: int, actions: tuple[str, ...], note: str) -> str:
        """Message ``index``'s header, remembered for a redraw."""
        self._heads[index] = (role, actions, note)  # for rename_roles
        return header_html(
            self._key,
            role,
            index,
            actions,
            note,
            self.times.get(index),
            self.role_names,
            self.versions.get(index, (1, 1)),
        )

    def redraw(self, index: int, role: str, actions: tuple[str, ...], note: str = "") -> None:
        frame = self._frame(index)
        if role == "tool" or frame is None:  # a result has no frame
            return
        cursor = frame.firstCursorPosition()
        cursor.movePosition(QTextCursor.MoveOperation.EndOfBlock, QTextCursor.MoveMode.KeepAnchor)
        cursor.insertHtml(self.html(role, index, actions, note))

    def rename_roles(self, names: dict[str, str]) -> None:
        """Name the senders ``names`` (continue-the-text mode's; {}: You and Assistant),
        in the headers drawn so far too: redrawn in place, the app's notes kept."""
        self.role_names = names
        for index, (role, actions, note) in list(self._heads.items()):
            self.redraw(index, role, actions, note)

    def set_versions(
        self, messages: Sequence[Message], versions: Sequence[tuple[int, int]]
    ) -> None:
        """Show each message's "‹ 2/3 ›" where it changed (after a reply replaced one)."""
        for i, v in enumerate(versions):
            if self.versions.get(i, (1, 1)) == v or i >= len(messages):
                continue
            self.versions[i] = v
            m = messages[i]
            if m.role == "user":
                actions: tuple[str, ...] = ("edit", "fork")
            else:
                actions = ("regenerate", "fork") if i == self.last_reply else ("fork",)
            self.redraw(i, m.role, actions, FORGOTTEN if m.forgotten else "")

    def mark_forgotten(self, messages: Sequence[Message]) -> None:
        """Say on each forgotten message's header that the model no longer sees it."""
        for i, m in enumerate(messages):
            if m.forgotten and i != self.last_reply:
                actions = ("edit", "fork") if m.role == "user" else ("fork",)
                self.redraw(i, m.role, actions, FORGOTTEN)

    def set_last_reply(self, index: int) -> None:
        """Only the last reply offers Regenerate."""
        if self.last_reply >= 0 and self.last_reply != index:
            self.redraw(self.last_reply, "assistant", ("fork",))
        self.last_reply = index
        if index >= 0:
            self.redraw(index, "assistant", ("regenerate", "fork"))
