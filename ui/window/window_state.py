"""The main window remembers itself: geometry, maximized state, docks, toolbars, splitters.

Qt's own ``saveGeometry`` / ``saveState`` / ``QSplitter.saveState`` blobs, base64 in
``settings.json`` (``AppSettings.window_layout``). Each is checked by
``ui.window.layout_format`` before Qt reads it (Qt crashes on damaged ones), and the
geometry is moved onto a screen that exists now and shrunk to fit it, so a layout
saved on a bigger or a second monitor opens where it can be seen.

The conversation stays the biggest thing in the window: panels saved by an older
layout version (which put the charts under the chat) are replaced by today's default,
and so are panels that left the central area less than ``MIN_CENTRAL_SHARE`` of the
room (with a note in the status bar).
"""

from __future__ import annotations

import base64
import binascii
import logging
from dataclasses import dataclass, replace

from PySide6.QtCore import QByteArray, QRect
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QMainWindow, QSplitter

from app.util.datafiles import DataFileError
from ui.window.layout_format import (
    Rect,
    SavedGeometry,
    central_share,
    read_geometry,
    read_main_window_state,
    read_splitter_state,
    saved_version,
    write_geometry,
)

log = logging.getLogger(__name__)

# Bump when the docks change so much that old layouts mislead. 2: the charts start closed
# and the conversation keeps the room (issue 27).
STATE_VERSION = 2
MIN_CENTRAL_SHARE = (0.35, 0.45)  # across, down: less than this of the room is "squeezed"
GEOMETRY_KEY = "geometry"
STATE_KEY = "state"
SPLITTER_PREFIX = "splitter:"
DEFAULT_SIZE = (1280, 860)
DEFAULT_FILL = 0.95  # of the screen, at most, for a first start (a laptop's: nearly all)
MIN_VISIBLE = 120  # px of the window that must be on a screen, across and down


def capture(win: QMainWindow) -> dict[str, str]:
    """The layout to save: geometry, dock and toolbar state, each named splitter."""
    layout = {
        GEOMETRY_KEY: _b64(win.saveGeometry()),
        STATE_KEY: _b64(win.saveState(STATE_VERSION)),
    }
    for splitter in win.findChildren(QSplitter):
        name = splitter.objectName()
        if name and splitter.window() is win:
            layout[SPLITTER_PREFIX + name] = _b64(splitter.saveState())
    return layout


def restore(win: QMainWindow, layout: dict[str, str]) -> list[str]:
    """Apply a saved layout to ``win`` (before it is first shown); the default size,
    fitted to the screen, when there is none. Returns what could not be used, one
    line each (the rest is applied)."""
    problems: list[str] = []
    screens = available_screens()
    geometry = _decoded(layout, GEOMETRY_KEY, problems)
    applied = False
    if geometry is not None:
        try:
            saved = read_geometry(geometry)
        except DataFileError as exc:
            problems.append(f"window size and place: {exc}")
        else:
            applied = win.restoreGeometry(QByteArray(write_geometry(fit_geometry(saved, screens))))
    if not applied:
        win.setGeometry(QRect(*default_rect(screens)))
    state = _decoded(layout, STATE_KEY, problems)
    if state is not None:
        _restore_panels(win, state, problems)
    for splitter in win.findChildren(QSplitter):
        name = SPLITTER_PREFIX + splitter.objectName()
        data = _decoded(layout, name, problems) if splitter.objectName() else None
        if data is None:
            continue
        try:
            read_splitter_state(data, splitter.count(), splitter.orientation().value)
        except DataFileError as exc:
            problems.append(f"{splitter.objectName()}: {exc}")
        else:
            splitter.restoreState(QByteArray(data))
    for line in problems:
        log.warning("window layout not restored: %s", line)
    return problems


def _restore_panels(win: QMainWindow, state: bytes, problems: list[str]) -> None:
    """Docks and toolbars from ``state``, unless it is damaged, older, or squeezes the
    conversation (the default panels stay)."""
    version = saved_version(state)
    if version is not None and 0 < version < STATE_VERSION:
        log.info("window panels saved by layout version %d: today's default is used", version)
        return
    try:
        saved = read_main_window_state(state, STATE_VERSION)
    except DataFileError as exc:
        problems.append(f"panels: {exc}")
        return
    across, down = central_share(saved)
    if across < MIN_CENTRAL_SHARE[0] or down < MIN_CENTRAL_SHARE[1]:
        problems.append(
            f"panels: they left the conversation {across:.0%} of the width and "
            f"{down:.0%} of the height"
        )
        return
    if not win.restoreState(QByteArray(state), STATE_VERSION):
        problems.append("panels: Qt did not accept the saved panel layout")


def _decoded(layout: dict[str, str], key: str, problems: list[str]) -> bytes | None:
    text = layout.get(key)
    if text is None:
        return None
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        problems.append(f"{key}: not base64")
        return None


def _b64(data: QByteArray) -> str:
    return base64.b64encode(data.data()).decode("ascii")


# -- screens ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Screen:
    """A screen as the fitting needs it."""

    index: int  # in QGuiApplication.screens(), as saveGeometry counts
    area: Rect  # available geometry: without panels and docks
    width: int  # the whole screen's width (restoreGeometry compares it)


def available_screens() -> list[Screen]:
    """The screens there are now, the primary one first."""
    screens = QGuiApplication.screens()
    primary = QGuiApplication.primaryScreen()
    found = []
    for i, screen in enumerate(screens):
        r = screen.availableGeometry()
        if r.width() > 0 and r.height() > 0:
            found.append(Screen(i, (r.x(), r.y(), r.width(), r.height()), screen.size().width()))
    found.sort(key=lambda s: screens[s.index] is not primary)
    return found or [Screen(0, (0, 0, *DEFAULT_SIZE), DEFAULT_SIZE[0])]


def default_rect(screens: list[Screen]) -> Rect:
    """A first start: the usual size, at most ``DEFAULT_FILL`` of the primary screen, centred."""
    sx, sy, sw, sh = screens[0].area
    w = min(DEFAULT_SIZE[0], int(sw * DEFAULT_FILL))
    h = min(DEFAULT_SIZE[1], int(sh * DEFAULT_FILL))
    return sx + (sw - w) // 2, sy + (sh - h) // 2, w, h


def best_screen(rect: Rect, screens: list[Screen]) -> Screen | None:
    """The screen ``rect`` overlaps most, if it shows at least ``MIN_VISIBLE`` px of it
    each way (or all of a smaller window); None when it is on none (a monitor that is gone)."""
    w, h = rect[2], rect[3]
    best, best_area = None, 0
    for screen in screens:
        ox, oy = _overlap(rect, screen.area)
        if ox >= min(MIN_VISIBLE, w) and oy >= min(MIN_VISIBLE, h) and ox * oy > best_area:
            best, best_area = screen, ox * oy
    return best


def fit_rect(rect: Rect, screens: list[Screen]) -> Rect:
    """``rect`` moved and shrunk so that it lies on the screen it overlaps most; in the
    middle of the primary screen when it is on none. A window larger than its screen is
    shrunk to it."""
    x, y, w, h = rect
    screen = best_screen(rect, screens)
    if screen is None:
        sx, sy, sw, sh = screens[0].area
        w, h = min(w, sw), min(h, sh)
        return sx + (sw - w) // 2, sy + (sh - h) // 2, w, h
    sx, sy, sw, sh = screen.area
    w, h = min(w, sw), min(h, sh)
    return min(max(x, sx), sx + sw - w), min(max(y, sy), sy + sh - h), w, h


def fit_geometry(saved: SavedGeometry, screens: list[Screen]) -> SavedGeometry:
    """``saved`` fitted to ``screens``: the frame by ``fit_rect``, the window inside it
    moved and shrunk by as much, the size to return to from maximized fitted too, and
    the screen it lands on recorded (``restoreGeometry`` ignores a blob saved on a screen
    of another width, which would lose the maximized state)."""
    fx, fy, fw, fh = saved.frame
    frame = fit_rect(saved.frame, screens)
    dx, dy, dw, dh = frame[0] - fx, frame[1] - fy, frame[2] - fw, frame[3] - fh
    gx, gy, gw, gh = saved.geometry
    geometry = (gx + dx, gy + dy, max(1, gw + dw), max(1, gh + dh))
    target = best_screen(frame, screens) or screens[0]
    return replace(
        saved,
        frame=frame,
        geometry=geometry,
        normal=fit_rect(saved.normal, screens),
        screen=target.index,
        screen_width=target.width,
    )


def _overlap(a: Rect, b: Rect) -> tuple[int, int]:
    ax, ay, aw, ah = a
    bx, by, bw, bh = b
    return (
        max(0, min(ax + aw, bx + bw) - max(ax, bx)),
        max(0, min(ay + ah, by + bh) - max(ay, by)),
    )
