"""The main window on the real engine and the real default model: the one builder the
model and e2e tiers use (the gui tier's, on fake engines, is ``tests/fakes/window.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.chat.store import ConversationStore
from app.config.paths import data_dirs
from app.config.setting_records import SamplingParams
from app.config.settings import AppSettings
from app.engine.local.engine import Engine
from tests.conftest import ONE_THREAD, TEST_LOAD
from tests.conftest import chat_turns as save_chat_turns
from tests.fakes.window import close_window
from ui.engine.worker import EngineClient
from ui.models.hub_workers import HubServices
from ui.window.main_window import MainWindow


def open_window(
    qtbot: QtBot,
    root: Path,
    model_path: Path | None,
    settings: AppSettings | None = None,
    *,
    max_tokens: int = 4,
    chat_turns: bool = False,
    turns_saved: bool = False,
    services: HubServices | None = None,
    size: tuple[int, int] | None = None,
) -> MainWindow:
    """A shown window on a data dir at ``root`` with ``model_path`` loaded (None: no model)
    and greedy replies of ``max_tokens`` unless ``settings`` says; ``services``: the Hub's.
    The default model is a base model, opened in continue-the-text mode; ``turns_saved``
    opens it in chat turns (the choice saved in the data dir first), ``chat_turns``
    switches to them in the window."""
    dirs = data_dirs(root)
    if settings is None:
        settings = AppSettings(load=ONE_THREAD, sampling=SamplingParams.greedy(max_tokens))
    if turns_saved:
        assert model_path is not None
        save_chat_turns(dirs.root, model_path)
    store = ConversationStore(dirs.root)
    win = MainWindow(EngineClient(dirs.models, store=store), settings, dirs, store, services)
    qtbot.addWidget(win)
    if size is not None:
        win.resize(*size)
    win.show()
    if model_path is None:
        return win
    with qtbot.waitSignal(win.modelReady, timeout=60_000):
        win.load_model(model_path)
    if chat_turns:
        win.prompt_controls.set_completion(False)
        qtbot.waitUntil(lambda: "template gemma" in win.status_model.text(), timeout=10_000)
    return win


@contextmanager
def real_window(
    qtbot: QtBot, tmp_path: Path, model_path: Path, sampling: SamplingParams
) -> Iterator[MainWindow]:
    """A window in chat turns on ``tmp_path/data``, replying with ``sampling``; closed after."""
    settings = AppSettings(load=TEST_LOAD, sampling=sampling)
    win = open_window(qtbot, tmp_path / "data", model_path, settings, turns_saved=True)
    yield win
    close_window(qtbot, win)


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
