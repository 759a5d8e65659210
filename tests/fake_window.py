"""The main window over a worker that drives a ``FakeEngine``, for the widget tests."""

from __future__ import annotations

from pytestqt.qtbot import QtBot

from app.chat.store import ConversationStore
from app.config.paths import DataDirs
from app.config.settings import AppSettings
from tests.fakes import FakeEngine
from ui.engine.worker import EngineClient
from ui.window.main_window import MainWindow


def fake_window(
    qtbot: QtBot, dirs: DataDirs, fake: FakeEngine, settings: AppSettings | None = None
) -> tuple[MainWindow, EngineClient]:
    """A window on ``dirs`` whose engine is ``fake`` (not shown, no model loaded), and its
    client; qtbot closes the window after the test."""
    store = ConversationStore(dirs.root)
    client = EngineClient(dirs.models, engine_factory=lambda: fake, store=store)
    win = MainWindow(client, settings if settings is not None else AppSettings(), dirs, store)
    qtbot.addWidget(win)
    return win, client
