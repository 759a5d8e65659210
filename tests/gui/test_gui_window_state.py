"""The window remembers itself: geometry, maximized state, docks, splitters; restored
sanely on a smaller screen, and a damaged saved layout is never handed to Qt (Qt crashes
on one: see ``ui/window/layout_format.py``). The layout does not involve the model, so the
fake engine is used."""

from __future__ import annotations

import base64
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from PySide6.QtCore import QByteArray, QRect, Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QApplication, QDockWidget, QSplitter
from pytestqt.qtbot import QtBot

from app.chat.store import ConversationStore
from app.config.paths import DataDirs, data_dirs
from app.config.settings import AppSettings
from app.util.datafiles import DataFileError
from tests.fakes.engine import FakeEngine
from tests.fakes.window import WindowFactory
from tests.hypothesis_budget import examples
from ui.engine.worker import EngineClient
from ui.window import layout_format, window_state
from ui.window.layout_format import read_geometry, read_main_window_state, read_splitter_state
from ui.window.main_window import MainWindow
from ui.window.window_state import Screen, fit_rect

SCREEN = Screen(0, (0, 0, 1920, 1040), 1920)
LEFT = Screen(1, (-1280, 0, 1280, 1024), 1280)


def open_window(make_window: WindowFactory, dirs: DataDirs) -> MainWindow:
    """A window on ``dirs`` with the settings saved there, shown (no model: not needed)."""
    return make_window(dirs=dirs, settings=AppSettings.load_from(dirs.settings_file), loaded=False)


@pytest.fixture()
def dirs(tmp_path: Path) -> DataDirs:
    return data_dirs(tmp_path / "data")


@pytest.fixture()
def window(make_window: WindowFactory, dirs: DataDirs) -> MainWindow:
    return open_window(make_window, dirs)


def main_splitter(win: MainWindow) -> QSplitter:
    splitter = win.centralWidget()
    assert isinstance(splitter, QSplitter)
    return splitter


def settle(win: MainWindow) -> None:
    """Let the layout catch up with what was just changed (no timers involved)."""
    QApplication.sendPostedEvents()
    layout = win.layout()
    assert layout is not None
    layout.activate()


def screen_area() -> QRect:
    screen = QGuiApplication.primaryScreen()
    assert screen is not None
    return screen.availableGeometry()


def save_layout(dirs: DataDirs, **entries: bytes) -> None:
    """Put these blobs (geometry=..., state=...) in the saved settings."""
    s = AppSettings.load_from(dirs.settings_file)
    s.window_layout = {k: base64.b64encode(v).decode() for k, v in entries.items()}
    s.save(dirs.settings_file)


# -- restart ------------------------------------------------------------------------------


def test_restart_restores_geometry_docks_and_splitter(
    qtbot: QtBot, make_window: WindowFactory, dirs: DataDirs
) -> None:
    win = open_window(make_window, dirs)
    assert win.tabifiedDockWidgets(win.sampling_panel) == [win.lora_panel]  # the default
    win.addDockWidget(Qt.DockWidgetArea.LeftDockWidgetArea, win.lora_panel)  # untabbed
    assert not win.perf_panel.isVisible()  # the charts start closed
    win.perf_panel.toggleViewAction().trigger()  # opened
    win.sampling_panel.toggleViewAction().trigger()  # closed
    settle(win)  # the docks laid out as they now are (the closed one took room until then)
    win.setGeometry(QRect(20, 30, 770, 600))
    splitter = main_splitter(win)
    settle(win)
    splitter.setSizes([200, splitter.width() - 200])
    settle(win)
    before = (win.geometry(), splitter.sizes())
    assert before[0] == QRect(20, 30, 770, 600) and before[1][0] == 200
    win.close()

    again = open_window(make_window, dirs)
    try:
        assert (again.geometry(), main_splitter(again).sizes()) == before
        assert again.dockWidgetArea(again.lora_panel) == Qt.DockWidgetArea.LeftDockWidgetArea
        assert again.tabifiedDockWidgets(again.sampling_panel) == []
        assert again.lora_panel.isVisible()
        assert again.perf_panel.isVisible() and again.perf_panel.toggleViewAction().isChecked()
        closed = again.sampling_panel
        assert not closed.isVisible()
        assert not closed.toggleViewAction().isChecked()
        again.sampling_panel.toggleViewAction().trigger()  # opens where it was
        assert again.dockWidgetArea(again.sampling_panel) == Qt.DockWidgetArea.RightDockWidgetArea
    finally:
        again.close()


def test_restart_restores_maximized_and_floating(
    qtbot: QtBot, make_window: WindowFactory, dirs: DataDirs
) -> None:
    win = open_window(make_window, dirs)
    win.setGeometry(QRect(20, 30, 700, 560))
    win.perf_panel.show()
    win.perf_panel.setFloating(True)
    win.perf_panel.setGeometry(QRect(60, 500, 640, 260))
    win.showMaximized()
    qtbot.waitUntil(win.isMaximized)
    win.close()

    again = open_window(make_window, dirs)
    try:
        qtbot.waitUntil(again.isMaximized)
        assert again.normalGeometry() == QRect(20, 30, 700, 560)  # where un-maximizing goes
        assert again.perf_panel.isFloating() and again.perf_panel.isVisible()
        assert screen_area().contains(again.perf_panel.geometry())
    finally:
        again.close()


def test_first_start_fits_the_screen(window: MainWindow) -> None:
    area = screen_area()
    assert area.contains(window.frameGeometry())
    assert window.width() <= 1280 and window.height() <= 860


# -- smaller screens ----------------------------------------------------------------------


def real_geometry(window: MainWindow) -> layout_format.SavedGeometry:
    return read_geometry(bytes(window.saveGeometry().data()))


def moved(g: layout_format.SavedGeometry, rect: layout_format.Rect) -> bytes:
    """``g`` as if the window's frame had been at ``rect`` (on a screen like this one)."""
    left, top = g.geometry[0] - g.frame[0], g.geometry[1] - g.frame[1]
    right = g.frame[2] - g.geometry[2] - left
    bottom = g.frame[3] - g.geometry[3] - top
    x, y, w, h = rect
    inner = (x + left, y + top, w - left - right, h - top - bottom)
    return layout_format.write_geometry(replace(g, frame=rect, normal=inner, geometry=inner))


@pytest.mark.parametrize(
    "saved",
    [
        (5000, 4000, 700, 560),  # a monitor that is gone
        (-3000, 200, 700, 560),  # ... on the left
        (0, 0, 4000, 3000),  # a bigger screen than this one
        (600, 650, 700, 560),  # mostly off the bottom right
    ],
)
def test_saved_geometry_is_fitted_to_the_screen(
    qtbot: QtBot, make_window: WindowFactory, dirs: DataDirs, saved: layout_format.Rect
) -> None:
    win = open_window(make_window, dirs)
    g = real_geometry(win)
    win.close()
    save_layout(dirs, geometry=moved(g, saved))
    again = open_window(make_window, dirs)
    try:
        area = screen_area()
        # The window on the screen (the offscreen platform's 1 px frame may touch the edge).
        assert area.contains(again.geometry()), (again.geometry(), area)
        assert area.adjusted(-2, -2, 2, 2).contains(again.frameGeometry())
        assert again.width() >= min(saved[2], area.width()) - 10  # shrunk only to fit
    finally:
        again.close()


def test_fit_rect_cases() -> None:
    screens = [SCREEN, LEFT]
    assert fit_rect((100, 100, 800, 600), screens) == (100, 100, 800, 600)  # fine as it is
    assert fit_rect((-1000, 50, 800, 600), screens) == (-1000, 50, 800, 600)  # left monitor
    # The left monitor was unplugged: centred on the primary one.
    assert fit_rect((-1000, 50, 800, 600), [SCREEN]) == (560, 220, 800, 600)
    assert fit_rect((0, 0, 3000, 2000), [SCREEN]) == (0, 0, 1920, 1040)  # shrunk to fit
    assert fit_rect((1800, 900, 800, 600), [SCREEN]) == (1120, 440, 800, 600)  # moved in
    # A sliver of it on the screen is not enough to find it by.
    assert fit_rect((1900, 1020, 800, 600), [SCREEN]) == (560, 220, 800, 600)


def test_fit_geometry_keeps_the_window_inside_its_frame() -> None:
    g = layout_format.SavedGeometry(
        frame=(3000, 100, 2100, 1200),
        normal=(3002, 130, 2096, 1168),
        screen=2,
        maximized=0,
        full_screen=0,
        screen_width=2560,
        geometry=(3002, 130, 2096, 1168),
    )
    fitted = window_state.fit_geometry(g, [SCREEN])
    assert fitted.frame == (0, 0, 1920, 1040)
    assert fitted.geometry == (2, 30, 1916, 1008)  # the frame's margins kept
    assert (fitted.screen, fitted.screen_width) == (0, 1920)  # else Qt ignores it all
    assert read_geometry(layout_format.write_geometry(fitted)) == fitted


# -- damaged layouts ----------------------------------------------------------------------


def test_damaged_saved_layout_gives_the_default_with_a_note(
    qtbot: QtBot, make_window: WindowFactory, dirs: DataDirs, window: MainWindow
) -> None:
    state = bytearray(window.saveState(window_state.STATE_VERSION).data())
    window.close()
    assert state[8] == layout_format.DOCK_STATE and state[16] in range(4)
    state[16] = 9  # the first dock area: 9 of 4 (this crashed Qt's own restoreState)
    save_layout(dirs, state=bytes(state), geometry=b"\x00" * 66)
    again = open_window(make_window, dirs)
    try:
        assert "window layout" in again.statusBar().currentMessage()
        assert again.tabifiedDockWidgets(again.sampling_panel) == [again.lora_panel]
        assert screen_area().contains(again.frameGeometry())
    finally:
        again.close()


def test_panels_of_an_older_layout_give_todays_default_quietly(
    qtbot: QtBot, make_window: WindowFactory, dirs: DataDirs
) -> None:
    """Layout version 1 opened the charts under the chat: not brought back (issue 27)."""
    win = open_window(make_window, dirs)
    assert not win.perf_panel.isVisible()  # closed on a first start
    win.perf_panel.show()
    settle(win)
    old = bytes(win.saveState(1).data())
    geometry = bytes(win.saveGeometry().data())
    win.close()
    assert read_main_window_state(old, 1).docks  # a well-formed state, only older
    save_layout(dirs, state=old, geometry=geometry)
    again = open_window(make_window, dirs)
    try:
        assert not again.perf_panel.isVisible()
        assert again.tabifiedDockWidgets(again.sampling_panel) == [again.lora_panel]
        assert again.statusBar().currentMessage() == ""  # an upgrade, not a fault
        assert again.geometry().size() == QRect(*real_geometry(again).geometry).size()
    finally:
        again.close()


def test_panels_that_squeeze_the_conversation_are_not_restored(
    qtbot: QtBot, make_window: WindowFactory, dirs: DataDirs
) -> None:
    win = open_window(make_window, dirs)
    win.setGeometry(QRect(20, 30, 760, 560))
    win.perf_panel.show()
    settle(win)
    win.resizeDocks([win.perf_panel], [400], Qt.Orientation.Vertical)
    settle(win)
    state = read_main_window_state(
        bytes(win.saveState(window_state.STATE_VERSION).data()), window_state.STATE_VERSION
    )
    across, down = layout_format.central_share(state)
    assert down < window_state.MIN_CENTRAL_SHARE[1], (across, down)
    assert across >= window_state.MIN_CENTRAL_SHARE[0]  # the height alone squeezes it
    win.close()

    again = open_window(make_window, dirs)
    try:
        assert "window layout" in again.statusBar().currentMessage()
        assert not again.perf_panel.isVisible()  # the default panels
        assert again.geometry() == QRect(20, 30, 760, 560)  # the rest is restored
        settle(again)
        assert again.transcript.height() >= again.height() // 2
    finally:
        again.close()


def test_central_share_of_a_saved_state() -> None:
    state = layout_format.MainWindowState(
        central=(600, 300),
        areas={layout_format.RIGHT: (400, 500), layout_format.BOTTOM: (1000, 300)},
    )
    assert layout_format.central_share(state) == (0.6, 0.5)
    assert layout_format.central_share(layout_format.MainWindowState()) == (1.0, 1.0)
    assert layout_format.saved_version(b"\x00\x00\x00\xff\x00\x00\x00\x02") == 2
    assert layout_format.saved_version(b"\x00\x00\x00\xfe\x00\x00\x00\x02") is None
    assert layout_format.saved_version(b"") is None


def test_every_panel_and_toolbar_has_a_stable_name(window: MainWindow) -> None:
    """``restoreState`` finds docks and toolbars by objectName (Qt warns, and forgets
    them, when one has none)."""
    from PySide6.QtWidgets import QToolBar

    for kind in (QDockWidget, QToolBar):
        names = [w.objectName() for w in window.findChildren(kind)]
        assert all(names) and len(set(names)) == len(names), names


def test_real_blobs_pass_the_checks(window: MainWindow) -> None:
    window.perf_panel.setFloating(True)
    state = read_main_window_state(
        bytes(window.saveState(window_state.STATE_VERSION).data()), window_state.STATE_VERSION
    )
    assert {d.name for d in state.docks} == {"samplingPanel", "perfPanel", "loraPanel"}
    assert [d.floating for d in state.docks if d.name == "perfPanel"] == [True]
    assert "mainToolbar" in state.toolbars
    g = real_geometry(window)
    assert layout_format.write_geometry(g) == window.saveGeometry().data()
    splitter = main_splitter(window)
    sizes = read_splitter_state(
        bytes(splitter.saveState().data()), 2, Qt.Orientation.Horizontal.value
    )
    assert len(sizes) == 2 and min(sizes) > 0  # the sizes it asks for (``setSizes``)
    with pytest.raises(DataFileError):  # another splitter's state
        read_splitter_state(bytes(splitter.saveState().data()), 3, Qt.Orientation.Horizontal.value)


INTS = [-1, 0, 1, 2, 3, 4, 5, 8, 9, 255, 99_999, 100_000, 1 << 24, 1 << 26, -(1 << 31)]
BYTES = [0, 1, 2, 3, 4, 8, 9, 15, 16, 0xF9, 0xFA, 0xFB, 0xFC, 0xFD, 0xFE, 0xFF]


def mutated(original: bytes, fields: list[tuple[int, int]]) -> st.SearchStrategy[bytes]:
    """``original`` with a few edits: mostly one of its numbers (``fields``, found by the
    checker) set to a value that reaches Qt's unchecked indexes, sizes and markers; also
    bytes changed, cut or inserted anywhere."""
    field = st.tuples(
        st.just("field"), st.integers(0, len(fields) - 1), st.integers(0, len(INTS) - 1)
    )
    edit = st.one_of(
        field,
        field,
        st.tuples(st.just("set"), st.integers(0, len(original) - 1), st.integers(0, 255)),
        st.tuples(st.just("cut"), st.integers(0, len(original) - 1), st.just(0)),
        st.tuples(st.just("insert"), st.integers(0, len(original)), st.integers(0, 255)),
    )

    def apply(edits: list[tuple[str, int, int]]) -> bytes:
        b = bytearray(original)
        for kind, at, value in edits:
            if kind == "field":
                pos, size = fields[at]
                if pos + size <= len(b):
                    number = INTS[value] if size == 4 else BYTES[value % len(BYTES)]
                    b[pos : pos + size] = (number % (1 << (8 * size))).to_bytes(size, "big")
                continue
            at = min(at, max(0, len(b) - 1))
            if kind == "set" and b:
                b[at] = value
            elif kind == "cut":
                del b[at:]
            else:
                b.insert(at, value)
        return bytes(b)

    return st.lists(edit, min_size=1, max_size=3).map(apply)


@pytest.fixture(scope="module")
def real_layout(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, tuple[bytes, list[tuple[int, int]]]]:
    """The blobs a real window saves (floating perf panel, tabbed sampling/LoRA), each
    with where its numbers are."""
    dirs = data_dirs(tmp_path_factory.mktemp("layout") / "data")
    store = ConversationStore(dirs.root)
    fake = FakeEngine()
    client = EngineClient(dirs.models, engine_factory=lambda: fake, store=store)
    win = MainWindow(client, AppSettings(), dirs, store)
    win.show()
    win.perf_panel.setFloating(True)
    blobs = {
        "geometry": bytes(win.saveGeometry().data()),
        "state": bytes(win.saveState(window_state.STATE_VERSION).data()),
        "splitter:mainSplitter": bytes(main_splitter(win).saveState().data()),
    }
    win.close()
    win.deleteLater()
    fields: dict[str, list[tuple[int, int]]] = {key: [] for key in blobs}
    read_geometry(blobs["geometry"], fields["geometry"])
    read_main_window_state(blobs["state"], window_state.STATE_VERSION, fields["state"])
    horizontal = Qt.Orientation.Horizontal.value
    read_splitter_state(
        blobs["splitter:mainSplitter"], 2, horizontal, fields["splitter:mainSplitter"]
    )
    return {key: (blob, fields[key]) for key, blob in blobs.items()}


FUZZ = settings(
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@FUZZ
@given(data=st.data())
def test_fuzz_saved_layout_never_crashes(
    window: MainWindow,
    real_layout: dict[str, tuple[bytes, list[tuple[int, int]]]],
    data: st.DataObject,
) -> None:
    """Mutations of real saved blobs: each is refused by the checks (with a reason) or
    restored by Qt, and the window still has its three panels, on the screen. (Before
    the checks, 1 in 20 to 1 in 150 such mutants of a state crashed the process.)"""
    key = data.draw(st.sampled_from(sorted(real_layout)))
    original, fields = real_layout[key]
    blob = data.draw(mutated(original, fields))
    layout = {key: base64.b64encode(blob).decode()}
    problems = window_state.restore(window, layout)
    event(f"{key}: {'refused' if problems else 'restored'}")
    assert len(problems) <= 1
    for line in problems:
        assert "\n" not in line and len(line) < 300
    docks = {d.objectName() for d in window.findChildren(QDockWidget)}
    assert {"samplingPanel", "perfPanel", "loraPanel"} <= docks
    assert screen_area().intersects(window.frameGeometry())
    window.restoreState(QByteArray(real_layout["state"][0]), window_state.STATE_VERSION)


def test_settings_keep_only_well_formed_layout_entries(dirs: DataDirs) -> None:
    good = base64.b64encode(b"\x00\x00\x00\xff").decode()
    raw = {
        "window_layout": {
            "geometry": good,
            "state": "not base64!",
            "bad key!": good,
            "splitter:mainSplitter": "A" * 20_000,
        },
        "recent_models": ["/a.gguf", "/a.gguf", 7, "/b.gguf"],
        "theme": "sepia",
    }
    notes: list[str] = []
    s = AppSettings.from_dict(raw, notes)
    assert s.window_layout == {"geometry": good}
    assert s.recent_models == ["/a.gguf", "/b.gguf"]
    assert s.theme == "system"
    assert len(notes) == 3
    again: list[str] = []
    assert AppSettings.from_dict(json_round_trip(s), again) == s and again == []


def json_round_trip(s: AppSettings) -> dict[str, object]:
    import json

    data = json.loads(s.to_json())
    assert isinstance(data, dict)
    return data
