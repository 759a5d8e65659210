"""The main window on the real default model, for the prompt and template tests."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.chat.store import ConversationStore
from app.config.paths import data_dirs
from app.config.setting_records import SamplingParams
from app.config.settings import AppSettings
from app.engine.local.engine import Engine
from tests.conftest import ONE_THREAD
from ui.engine.worker import EngineClient
from ui.window.main_window import MainWindow


def open_window(
    qtbot: QtBot,
    root: Path,
    model_path: Path,
    settings: AppSettings | None = None,
    *,
    max_tokens: int = 4,
    chat_turns: bool = False,
) -> MainWindow:
    """A window on a data dir at ``root`` with the default model loaded; ``chat_turns``
    switches the base model out of continue-the-text mode (saved for it)."""
    dirs = data_dirs(root)
    if settings is None:
        settings = AppSettings(load=ONE_THREAD, sampling=SamplingParams.greedy(max_tokens))
    store = ConversationStore(dirs.root)
    win = MainWindow(EngineClient(dirs.models, store=store), settings, dirs, store)
    qtbot.addWidget(win)
    win.show()
    with qtbot.waitSignal(win.modelReady, timeout=60_000):
        win.load_model(model_path)
    if chat_turns:
        win.prompt_controls.set_completion(False)
        qtbot.waitUntil(lambda: "template gemma" in win.status_model.text(), timeout=10_000)
    return win


def close(win: MainWindow) -> None:
    client = win.client
    win.close()
    assert not client.engine_thread.isRunning()


def send(qtbot: QtBot, win: MainWindow, text: str) -> None:
    with qtbot.waitSignal(win.replyEnded, timeout=60_000):
        qtbot.keyClicks(win.chat_input, text)
        qtbot.keyClick(win.chat_input, Qt.Key.Key_Return)
    win.client.drain()  # the worker's after-reply work is done: its engine is idle


def evaluated(win: MainWindow) -> str:
    """The text the engine's KV cache holds."""
    engine = win.client.host.engine
    assert isinstance(engine, Engine)
    return engine.context_text
