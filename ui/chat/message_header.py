"""A transcript message's header line: who wrote it, when, its versions and its actions."""

from __future__ import annotations

import html
import time

ACTION_SCHEME = "lamplight"
VERSION_TIPS = {"prev-version": "Previous version", "next-version": "Next version"}
# A lone "‹" in small type was a 5 px target: the arrows are drawn larger, and the link
# takes in the no-break spaces around them, so the clickable part is about 24 px wide.
ARROW_PAD = "&nbsp;&nbsp;"
ARROW_SIZE = "text-decoration:none; font-size:large; font-weight:bold"


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
