"""The main window over a worker that drives a ``FakeEngine``, for the widget tests."""

from __future__ import annotations

from pathlib import Path

from pytestqt.qtbot import QtBot

from app.chat.store import ConversationStore
from app.config.paths import DataDirs, data_dirs
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


def loaded_fake_window(qtbot: QtBot, tmp_path: Path, fake: FakeEngine) -> MainWindow:
    """A shown window on ``tmp_path/data`` with a stand-in model file loaded by ``fake``."""
    win, _client = fake_window(qtbot, data_dirs(tmp_path / "data"), fake)
    win.show()
    model = tmp_path / "model.gguf"
    model.write_bytes(b"fake model")
    with qtbot.waitSignal(win.modelReady, timeout=5000):
        win.load_model(model)
    return win
