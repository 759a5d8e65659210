"""The window with a model on a real llama-server: connect, chat, what is disabled and
why, a connection lost mid-reply (text kept, automatic reconnect), and a restart that
reconnects to the server in use."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QWidget
from pytestqt.qtbot import QtBot

from app.chat.store import ConversationStore
from app.config.paths import DataDirs, data_dirs
from app.config.setting_records import SamplingParams
from app.config.settings import AppSettings
from app.remote.connection import Connection
from app.remote.connection_store import ConnectionStore
from tests.fakes.engine import FakeEngine
from tests.server_fixture import RunningServer, free_port, running_llama_server
from ui.engine.worker import EngineClient
from ui.window.main_window import MainWindow


def open_window(qtbot: QtBot, dirs: DataDirs, max_tokens: int = 24) -> MainWindow:
    store = ConversationStore(dirs.root)
    settings = AppSettings(sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0))
    client = EngineClient(dirs.models, engine_factory=FakeEngine, store=store)
    win = MainWindow(client, settings, dirs, store)
    qtbot.addWidget(win)
    win.show()
    return win


def connect(qtbot: QtBot, win: MainWindow, conn: Connection) -> None:
    win.remote.store.put(conn)
    with qtbot.waitSignal(win.modelReady, timeout=30_000):
        win.remote.connect_to(conn)


def send(qtbot: QtBot, win: MainWindow, text: str, timeout: int = 30_000) -> str:
    with qtbot.waitSignal(win.replyEnded, timeout=timeout) as blocker:
        qtbot.keyClicks(win.chat_input, text)
        qtbot.keyClick(win.chat_input, Qt.Key.Key_Return)
    return str(blocker.args[0])


@pytest.fixture()
def dirs(tmp_path: Path) -> DataDirs:
    return data_dirs(tmp_path / "data")


@pytest.fixture()
def window(qtbot: QtBot, dirs: DataDirs) -> Iterator[MainWindow]:
    win = open_window(qtbot, dirs)
    yield win
    win.close()  # put off while a reply settles (at most 5 s)
    qtbot.waitUntil(lambda: win.closed, timeout=15_000)
    assert not win.client.engine_thread.isRunning()


def test_chat_on_a_server_and_what_it_cannot_do(
    qtbot: QtBot, window: MainWindow, llama_server: RunningServer, dirs: DataDirs
) -> None:
    conn = Connection("srv1", "Test box", "llama-server", llama_server.url)
    connect(qtbot, window, conn)
    info = window.session.model
    assert info is not None and info.server == llama_server.url
    label = window.findChild(QWidget, "statusConnection")
    assert label is not None and label.isVisible() and label.text() == "● connected"
    assert "llama-server at 127.0.0.1" in label.toolTip()
    assert send(qtbot, window, "Hello there") == "finished"
    assert window.messages[-1].role == "assistant" and window.messages[-1].content
    # Settings the server's command line owns are disabled, with the reason as tooltip.
    n_ctx = window.sampling_panel.findChild(QWidget, "field_n_ctx")
    assert n_ctx is not None and not n_ctx.isEnabled()
    assert "command line" in n_ctx.toolTip()
    drafting = window.sampling_panel.findChild(QWidget, "field_speculative")
    assert drafting is not None and not drafting.isEnabled() and drafting.toolTip()
    # The LoRA panel offers the server's adapters only.
    names = [a.text() for a in window.lora_panel.add_menu.actions()]
    assert "test-lora.gguf" in names and "From file…" not in names
    assert not window.compact_cache_action.isEnabled()
    # The model in use is the server's: a restart reconnects, never opening its path here.
    assert ConnectionStore.in_dir(dirs.root).active == "srv1"
    assert not window.settings.model_path


def test_back_to_this_computer(
    qtbot: QtBot, window: MainWindow, llama_server: RunningServer, tmp_path: Path
) -> None:
    connect(qtbot, window, Connection("srv2", "Box", "llama-server", llama_server.url))
    model = tmp_path / "local.gguf"
    model.write_bytes(b"fake model")
    with qtbot.waitSignal(window.modelReady, timeout=10_000):
        window.load_model(model)
    label = window.findChild(QWidget, "statusConnection")
    assert label is not None and not label.isVisible()
    assert window.remote.store.active == ""
    n_ctx = window.sampling_panel.findChild(QWidget, "field_n_ctx")
    assert n_ctx is not None and n_ctx.isEnabled()
    assert "From file…" in [a.text() for a in window.lora_panel.add_menu.actions()]


def test_a_lost_connection_keeps_the_text_and_reconnects(
    qtbot: QtBot, dirs: DataDirs, model_path: Path, tmp_path: Path
) -> None:
    window = open_window(qtbot, dirs, max_tokens=1000)
    port = free_port()
    conn = Connection("srv3", "Flaky", "llama-server", f"http://127.0.0.1:{port}")
    with running_llama_server(model_path, tmp_path / "a", n_ctx=1024, port=port) as server:
        connect(qtbot, window, conn)
        before = len(window.transcript.toPlainText())
        with qtbot.waitSignal(window.replyEnded, timeout=60_000) as ended:
            qtbot.keyClicks(window.chat_input, "Tell me a long story.")
            qtbot.keyClick(window.chat_input, Qt.Key.Key_Return)
            qtbot.waitUntil(
                lambda: len(window.transcript.toPlainText()) > before + 60, timeout=30_000
            )
            server.process.kill()
    assert ended.args == ["finished"]
    reply = window.messages[-1]
    assert reply.role == "assistant" and len(reply.content) > 20  # the partial text is kept
    assert "incomplete" in window.transcript.toPlainText()
    label = window.findChild(QWidget, "statusConnection")
    assert label is not None
    qtbot.waitUntil(lambda: "Connection lost" in label.text(), timeout=10_000)
    # The server comes back on the same address: the app notices by itself.
    with running_llama_server(model_path, tmp_path / "b", n_ctx=1024, port=port):
        qtbot.waitUntil(lambda: window.remote.status.state == "connected", timeout=40_000)
        # A short reply: a 1000-token one takes longer than the wait on a loaded machine.
        window.settings.sampling = replace(window.settings.sampling, max_tokens=16)
        assert send(qtbot, window, "Are you back?") == "finished"
    window.close()


def test_a_restart_reconnects_to_the_server_in_use(
    qtbot: QtBot, llama_server: RunningServer, dirs: DataDirs
) -> None:
    first = open_window(qtbot, dirs)
    connect(qtbot, first, Connection("srv4", "Box", "llama-server", llama_server.url))
    assert send(qtbot, first, "Remember me") == "finished"
    first.close()
    second = open_window(qtbot, dirs)
    with qtbot.waitSignal(second.modelReady, timeout=30_000) as ready:
        second.start_engine(None)
    assert ready.args[0].server == llama_server.url
    second.close()
