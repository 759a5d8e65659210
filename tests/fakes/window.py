"""The main window over a worker that drives a ``FakeEngine``, for the widget tests:
``fake_window`` makes one; ``WindowFactory`` (the tiers' ``make_window`` fixture) makes
them for a test and closes them after it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.chat.store import ConversationStore
from app.config.paths import DataDirs, data_dirs
from app.config.settings import AppSettings
from app.models.downloader import FileFetcher
from app.models.downloads import DownloadQueue
from app.models.hub import HubClient
from app.models.library import Library
from tests.fakes.engine import FakeEngine
from ui.engine.worker import EngineClient
from ui.models.hub_workers import HubServices
from ui.window.main_window import MainWindow

LAPTOP = (1366, 768)  # a laptop's screen: the offscreen one is smaller


def hub_services(dirs: DataDirs) -> HubServices:
    """Real Hub services that never reach the network (the library scan is local)."""
    return HubServices(
        HubClient(),
        Library(dirs.models, dirs.root / "library.json", hf_cache=False),
        DownloadQueue(dirs.models, dirs.root / "downloads.json", FileFetcher(read_timeout=5)),
    )


def settle() -> None:
    """Let resizes and layouts catch up (posted events only: no timers)."""
    for _ in range(3):
        QApplication.sendPostedEvents()
        QApplication.processEvents()


def fake_window(
    qtbot: QtBot,
    tmp_path: Path,
    fake: FakeEngine | None = None,
    *,
    dirs: DataDirs | None = None,
    settings: AppSettings | None = None,
    services: bool = False,
    shown: bool = True,
    size: tuple[int, int] | None = None,
    loaded: bool = True,
    model: Path | None = None,
) -> MainWindow:
    """A window whose engine is ``fake`` (a fresh ``FakeEngine`` if None), on ``dirs``
    (``tmp_path/data`` if None) with ``settings`` (the defaults if None) and, with
    ``services``, the Hub services. ``shown``: shown and exposed, then resized to ``size``
    if given. ``loaded``: shown, with ``model`` loaded (a stand-in file
    ``tmp_path/model.gguf`` if None). qtbot closes the window after the test."""
    dirs = dirs or data_dirs(tmp_path / "data")
    engine = fake or FakeEngine()
    store = ConversationStore(dirs.root)
    client = EngineClient(dirs.models, engine_factory=lambda: engine, store=store)
    hub = hub_services(dirs) if services else None
    win = MainWindow(client, settings if settings is not None else AppSettings(), dirs, store, hub)
    qtbot.addWidget(win)
    if not (shown or loaded):
        return win
    win.show()
    qtbot.waitExposed(win)
    if size is not None:
        win.resize(*size)
        settle()
    if loaded:
        if model is None:
            model = tmp_path / "model.gguf"
            model.write_bytes(b"fake model")  # the snapshot header fingerprints it
        with qtbot.waitSignal(win.modelReady, timeout=5000):
            win.load_model(model)
    return win


def send(qtbot: QtBot, win: MainWindow, text: str) -> None:
    """Type ``text`` into the message box and press Return, as a person sends it."""
    QTest.keyClicks(win.chat_input, text)
    QTest.keyClick(win.chat_input, Qt.Key.Key_Return)


def close_window(qtbot: QtBot, win: MainWindow) -> None:
    """Close ``win`` (put off while a reply settles, at most 5 s) and check that its
    engine thread ended."""
    if not win.closed:
        win.close()
    qtbot.waitUntil(lambda: win.closed, timeout=15_000)
    assert not win.client.engine_thread.isRunning()


class WindowFactory:
    """``fake_window`` with the test's qtbot and tmp_path (the same options); ``close_all``
    closes every window it made."""

    def __init__(self, qtbot: QtBot, tmp_path: Path) -> None:
        self._qtbot = qtbot
        self._tmp_path = tmp_path
        self._made: list[MainWindow] = []

    def __call__(self, fake: FakeEngine | None = None, **options: Any) -> MainWindow:
        win = fake_window(self._qtbot, self._tmp_path, fake, **options)
        self._made.append(win)
        return win

    def close_all(self) -> None:
        for win in self._made:
            close_window(self._qtbot, win)


def window_factory(qtbot: QtBot, tmp_path: Path) -> Iterator[WindowFactory]:
    """The body of the tiers' ``make_window`` fixture."""
    factory = WindowFactory(qtbot, tmp_path)
    yield factory
    factory.close_all()
