"""Qt's saved window layouts, read strictly before Qt sees them.

``QMainWindow.restoreState`` trusts its input: a damaged state crashes the process
(found by mutating real saved states: a dock-area index outside 0..3 indexes an array
of four, and other fields are used unchecked), and ``QSplitter.restoreState`` takes any
handle width (a mutated one crashed the first layout). The layout is kept in
``settings.json``, which may be damaged or edited, so each blob is parsed here first,
field by field, exactly as Qt writes it (``QMainWindow::saveState`` and
``QDockAreaLayout``, ``QToolBarAreaLayout``, ``QWidget::saveGeometry`` and
``QSplitter::saveState`` in qtbase), with every count, index, enum and coordinate
in range and nothing left over. Only a blob that passes reaches Qt.

Qt-free on purpose (plain ``struct``): the checks are unit-tested on real and mutated
blobs without a window.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field

from app.util.datafiles import DataFileError

COORD = 100_000  # px: beyond any arrangement of screens
SIZE_LIMIT = 1 << 26  # Qt writes QWIDGETSIZE_MAX (2^24 - 1) plus a tab bar as "maximum"
MAX_DEPTH = 6  # nested dock splits
MAX_ITEMS = 64  # docks and splits in one state
MAX_TOOLBARS = 16
NAME_BYTES = 256  # an objectName, UTF-16
NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.:-]{0,99}")

# QMainWindow / QDockAreaLayout / QToolBarAreaLayout markers (qtbase, private headers).
VERSION_MARKER = 0xFF
DOCK_STATE = 0xFD
FLOATING_TABS = 0xF9
TOOLBAR_STATE_EX = 0xFC
SEQUENCE = 0xFC
TAB = 0xFA
WIDGET = 0xFB
FLAG_VISIBLE, FLAG_FLOATING = 1, 2
FLAG_BITS = 0x0F  # Qt 6 also writes 8 for a dock closed by the user; other bits are not Qt's
DOCK_AREAS = (1, 2, 4, 8)  # Qt::DockWidgetArea values a corner may name
ORIENTATIONS = (1, 2)  # Qt::Horizontal, Qt::Vertical

GEOMETRY_MAGIC = 0x1D9D0CB
GEOMETRY_VERSION = (3, 0)  # what Qt 6 writes
SPLITTER_MAGIC = 0xFF
SPLITTER_VERSION = 1

Rect = tuple[int, int, int, int]  # x, y, width, height


@dataclass(frozen=True)
class DockEntry:
    """One dock widget (or a placeholder Qt keeps for one) named in a saved state."""

    name: str
    visible: bool
    floating: bool
    rect: Rect | None = None  # where it floats


@dataclass
class MainWindowState:
    """What a ``QMainWindow.saveState`` blob holds, as far as it matters here."""

    docks: list[DockEntry] = field(default_factory=list)
    toolbars: list[str] = field(default_factory=list)
    items: int = 0
    central: tuple[int, int] = (0, 0)  # the central widget's size (-1: not laid out)
    areas: dict[int, tuple[int, int]] = field(default_factory=dict)  # dock area -> size


@dataclass(frozen=True)
class SavedGeometry:
    """A ``QWidget.saveGeometry`` blob (format 3.0)."""

    frame: Rect
    normal: Rect
    screen: int
    maximized: int  # Qt writes windowState() & WindowMaximized: 0 or 2
    full_screen: int  # ... & WindowFullScreen: 0 or 4
    screen_width: int
    geometry: Rect


def _bad(what: str) -> DataFileError:
    return DataFileError(f"the saved window layout is damaged ({what})", damaged=True)


Fields = list[tuple[int, int]]  # (offset, size) of each number read, for the tests' fuzzer


class _Reader:
    """Big-endian reads (QDataStream's default) that refuse to run past the end."""

    def __init__(self, data: bytes, fields: Fields | None = None) -> None:
        self.data = data
        self.pos = 0
        self.fields = fields

    def take(self, n: int, what: str) -> bytes:
        if self.pos + n > len(self.data):
            raise _bad(f"it ends inside {what}")
        if self.fields is not None and n <= 4:
            self.fields.append((self.pos, n))
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def u8(self, what: str) -> int:
        return self.take(1, what)[0]

    def u16(self, what: str) -> int:
        return int(struct.unpack(">H", self.take(2, what))[0])

    def i32(self, what: str) -> int:
        return int(struct.unpack(">i", self.take(4, what))[0])

    def u32(self, what: str) -> int:
        return int(struct.unpack(">I", self.take(4, what))[0])

    def int_in(self, lo: int, hi: int, what: str) -> int:
        value = self.i32(what)
        if not lo <= value <= hi:
            raise _bad(f"{what} {value} is outside {lo}..{hi}")
        return value

    def one_of(self, allowed: tuple[int, ...], what: str, wide: bool = False) -> int:
        value = self.i32(what) if wide else self.u8(what)
        if value not in allowed:
            raise _bad(f"{what} {value} is not one of {allowed}")
        return value

    def name(self, what: str) -> str:
        """A QString: its byte length (0xFFFFFFFF for a null string), then UTF-16BE."""
        n = self.u32(what)
        if n == 0xFFFFFFFF or n == 0:
            return ""
        if n % 2 or n > NAME_BYTES:
            raise _bad(f"{what} has a length of {n} bytes")
        try:
            text = self.take(n, what).decode("utf-16-be")
        except UnicodeDecodeError as exc:
            raise _bad(f"{what} is not text") from exc
        if not NAME.fullmatch(text):
            raise _bad(f"{what} {text!r} is not an object name")
        return text

    def rect(self, what: str) -> Rect:
        """A QRect as QDataStream writes it: left, top, right, bottom."""
        x1, y1, x2, y2 = (self.int_in(-COORD, COORD, what) for _ in range(4))
        w, h = x2 - x1 + 1, y2 - y1 + 1
        if not (0 <= w <= COORD and 0 <= h <= COORD):
            raise _bad(f"{what} is {w}x{h}")
        return x1, y1, w, h

    def size(self, what: str) -> tuple[int, int]:
        return self.int_in(-1, COORD, f"{what} width"), self.int_in(-1, COORD, f"{what} height")

    def done(self) -> None:
        if self.pos != len(self.data):
            raise _bad(f"{len(self.data) - self.pos} bytes follow its end")


# -- QMainWindow.saveState ------------------------------------------------------------------

LEFT, RIGHT, TOP, BOTTOM = range(4)  # dock area numbers in a saved state (QInternal)


def saved_version(data: bytes) -> int | None:
    """The layout version a ``saveState`` blob was written with (None: not one)."""
    if len(data) < 8:
        return None
    marker, version = struct.unpack(">ii", data[:8])
    return int(version) if marker == VERSION_MARKER else None


def central_share(state: MainWindowState) -> tuple[float, float]:
    """How much of the room across and down the central widget had beside the docks
    when the state was saved (1.0: no docks there, or a size Qt did not record)."""

    def share(centre: int, sides: tuple[int, int], axis: int) -> float:
        # An area of closed docks keeps its last extent but is 0 px the other way.
        shown = [state.areas.get(a, (0, 0)) for a in sides]
        docks = sum(size[axis] for size in shown if min(size) > 0)
        return centre / (centre + docks) if centre > 0 else 1.0

    width, height = state.central
    return share(width, (LEFT, RIGHT), 0), share(height, (TOP, BOTTOM), 1)


def read_main_window_state(
    data: bytes, version: int, fields: Fields | None = None
) -> MainWindowState:
    """Check a ``QMainWindow.saveState(version)`` blob (``fields`` collects where each
    number is).

    Raises:
        DataFileError: anything Qt would not have written itself.
    """
    r = _Reader(data, fields)
    if r.i32("the version marker") != VERSION_MARKER:
        raise _bad("no version marker")
    saved = r.i32("the version")
    if saved != version:
        raise _bad(f"layout version {saved}, not {version}")
    state = MainWindowState()
    sections: set[int] = set()
    while r.pos < len(data):
        marker = r.u8("a section marker")
        if marker in sections and marker != FLOATING_TABS:
            raise _bad(f"section {marker:#x} twice")
        sections.add(marker)
        if marker == DOCK_STATE:
            _dock_areas(r, state)
        elif marker == FLOATING_TABS:
            r.rect("a floating tab group")
            _area(r, state, 1)
        elif marker == TOOLBAR_STATE_EX:
            _toolbars(r, state)
        else:
            raise _bad(f"unknown section {marker:#x}")
    names = [d.name for d in state.docks if d.name]
    if len(set(names)) != len(names):
        raise _bad("a dock is named twice")
    return state


def _dock_areas(r: _Reader, state: MainWindowState) -> None:
    areas: set[int] = set()
    for _ in range(r.int_in(0, 4, "the number of dock areas")):
        area = r.int_in(0, 3, "a dock area")
        if area in areas:
            raise _bad(f"dock area {area} twice")
        areas.add(area)
        state.areas[area] = r.size("a dock area")
        _area(r, state, 0)
    state.central = r.size("the central widget")
    for _ in range(4):
        r.one_of(DOCK_AREAS, "a corner", wide=True)


def _area(r: _Reader, state: MainWindowState, depth: int) -> None:
    """One ``QDockAreaLayoutInfo``: a sequence or tab group of docks and nested splits."""
    if depth > MAX_DEPTH:
        raise _bad("docks nested too deeply")
    marker = r.one_of((SEQUENCE, TAB), "a dock group marker")
    current = r.i32("the current tab") if marker == TAB else -1
    r.one_of(ORIENTATIONS, "an orientation")
    count = r.int_in(0, MAX_ITEMS, "the number of docks in a group")
    if not -1 <= current < max(count, 0):
        raise _bad(f"current tab {current} of {count}")
    state.items += count
    if state.items > MAX_ITEMS:
        raise _bad("too many docks")
    for _ in range(count):
        kind = r.one_of((WIDGET, SEQUENCE), "a dock item marker")
        if kind == SEQUENCE:
            _extent(r)
            _area(r, state, depth + 1)
            continue
        name = r.name("a dock name")
        flags = r.u8("dock flags")
        if flags & ~FLAG_BITS:
            raise _bad(f"dock flags {flags}")
        if flags & FLAG_FLOATING and name:
            x = r.int_in(-COORD, COORD, "a floating dock's x")
            y = r.int_in(-COORD, COORD, "a floating dock's y")
            w = r.int_in(0, COORD, "a floating dock's width")
            h = r.int_in(0, COORD, "a floating dock's height")
            state.docks.append(DockEntry(name, bool(flags & FLAG_VISIBLE), True, (x, y, w, h)))
        else:
            _extent(r)
            if name:
                state.docks.append(DockEntry(name, bool(flags & FLAG_VISIBLE), False))


def _extent(r: _Reader) -> None:
    """pos, size, minimum and maximum of a docked item (the last two are not read back)."""
    r.int_in(-COORD, COORD, "a dock position")
    r.int_in(-1, COORD, "a dock size")
    r.int_in(-1, SIZE_LIMIT, "a dock's minimum size")
    r.int_in(-1, SIZE_LIMIT, "a dock's maximum size")


def _toolbars(r: _Reader, state: MainWindowState) -> None:
    lines = r.int_in(0, MAX_TOOLBARS, "the number of toolbar lines")
    for _ in range(lines):
        r.int_in(0, 3, "a toolbar area")
        for _ in range(r.int_in(0, MAX_TOOLBARS, "the number of toolbars in a line")):
            state.toolbars.append(r.name("a toolbar name"))
            if r.u8("toolbar flags") > 3:
                raise _bad("toolbar flags")
            r.int_in(-COORD, COORD, "a toolbar position")
            r.int_in(-1, COORD, "a toolbar size")
            r.u32("a floating toolbar's geometry")
            r.u32("a floating toolbar's geometry")
    if len(state.toolbars) > MAX_TOOLBARS:
        raise _bad("too many toolbars")


# -- QWidget.saveGeometry -------------------------------------------------------------------

_GEOMETRY = struct.Struct(">IHH4i4iiBBi4i")


def read_geometry(data: bytes, fields: Fields | None = None) -> SavedGeometry:
    """Check a ``QWidget.saveGeometry`` blob (format 3.0, 66 bytes).

    Raises:
        DataFileError: another format, or rectangles no screen could show.
    """
    r = _Reader(data, fields)
    if r.u32("the geometry marker") != GEOMETRY_MAGIC:
        raise _bad("not a window geometry")
    major, minor = r.u16("the geometry version"), r.u16("the geometry version")
    if (major, minor) != GEOMETRY_VERSION:
        raise _bad(f"geometry format {major}.{minor}")
    frame = r.rect("the window frame")
    normal = r.rect("the window's normal geometry")
    screen = r.int_in(0, 64, "the screen number")
    maximized = r.u8("the maximized flag")
    full_screen = r.u8("the full-screen flag")
    screen_width = r.int_in(0, COORD, "the screen width")
    geometry = r.rect("the window geometry")
    r.done()
    return SavedGeometry(frame, normal, screen, maximized, full_screen, screen_width, geometry)


def write_geometry(g: SavedGeometry) -> bytes:
    """The blob ``read_geometry`` reads (used after moving the window onto a screen)."""

    def corners(rect: Rect) -> tuple[int, int, int, int]:
        x, y, w, h = rect
        return x, y, x + w - 1, y + h - 1

    return _GEOMETRY.pack(
        GEOMETRY_MAGIC,
        *GEOMETRY_VERSION,
        *corners(g.frame),
        *corners(g.normal),
        g.screen,
        g.maximized,
        g.full_screen,
        g.screen_width,
        *corners(g.geometry),
    )


# -- QSplitter.saveState --------------------------------------------------------------------


def read_splitter_state(
    data: bytes, count: int, orientation: int, fields: Fields | None = None
) -> list[int]:
    """Check a ``QSplitter.saveState`` blob for a splitter of ``count`` widgets laid out
    in ``orientation``; returns the saved sizes.

    Raises:
        DataFileError: another splitter's state, or values Qt would not write.
    """
    r = _Reader(data, fields)
    if r.i32("the splitter marker") != SPLITTER_MAGIC:
        raise _bad("not a splitter state")
    if r.i32("the splitter version") != SPLITTER_VERSION:
        raise _bad("another splitter format")
    n = r.u32("the number of panes")
    if n != count:
        raise _bad(f"{n} panes, not {count}")
    sizes = [r.int_in(0, COORD, "a pane size") for _ in range(n)]
    r.one_of((0, 1), "the collapsible flag")
    r.int_in(-1, 64, "the handle width")  # -1: the style's
    r.one_of((0, 1), "the opaque-resize flag")
    if r.i32("the orientation") != orientation:
        raise _bad("another orientation")
    r.one_of((0, 1), "the opaque-resize flag")
    r.done()
    return sizes
