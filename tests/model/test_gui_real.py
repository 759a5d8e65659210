"""The window on the real engine and the real default model, offscreen."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.config.setting_records import SamplingParams
from app.engine.metrics import MessageMetrics
from tests.real_window import real_window
from ui.window.main_window import MainWindow


@pytest.fixture()
def window(qtbot: QtBot, tmp_path: Path, model_path: Path) -> Iterator[MainWindow]:
    with real_window(qtbot, tmp_path, model_path, SamplingParams.greedy(32)) as win:
        yield win


def send(qtbot: QtBot, win: MainWindow, text: str) -> None:
    qtbot.keyClicks(win.chat_input, text)
    qtbot.keyClick(win.chat_input, Qt.Key.Key_Return)


def reopen_and_send(qtbot: QtBot, win: MainWindow, text: str) -> MessageMetrics:
    """Reopen the current chat from its snapshot (once saved), send ``text``, and return
    the reply's figures."""
    conv_id = win.session.conversation.id
    qtbot.waitUntil(lambda: win.store.snapshot_bytes(conv_id) > 0, timeout=30_000)
    win.new_chat()
    with qtbot.waitSignal(win.conversationOpened, timeout=30_000) as opened:
        win.open_conversation(conv_id)
    assert opened.args[0].restored
    with qtbot.waitSignal(win.replyEnded, timeout=120_000):
        send(qtbot, win, text)
    metrics = win.session.conversation.messages[-1].message_metrics()
    assert metrics is not None
    return metrics


def test_chat_streams_and_second_turn_reuses_the_cache(qtbot: QtBot, window: MainWindow) -> None:
    assert "Gemma 3 270m" in window.status_model.text()
    assert "gemma (for gemma3)" in window.status_model.text()
    assert window.status_backend.text() == "CPU"
    with qtbot.waitSignal(window.replyEnded, timeout=60_000) as blocker:
        send(qtbot, window, "Hello! Who are you?")
    assert blocker.args == ["finished"]
    reply = window.messages[-1]
    assert reply.role == "assistant" and reply.content.strip()
    assert "tok/s" in window.status_speed.text()
    with qtbot.waitSignal(window.replyEnded, timeout=60_000):
        send(qtbot, window, "Tell me more.")
    first, second = window.reply_metrics
    assert second.cached_tokens >= first.prompt_tokens
    assert second.evaluated_tokens < 20


def test_stop_and_new_chat_on_the_real_engine(qtbot: QtBot, window: MainWindow) -> None:
    window.settings.sampling = replace(window.settings.sampling, max_tokens=2000)
    send(qtbot, window, "Count from one to a thousand.")
    qtbot.waitUntil(  # streaming: the reply's own text is on screen
        lambda: window.session.reply_started and len(window.transcript.toPlainText()) > 100,
        timeout=30_000,
    )
    assert window.busy
    with qtbot.waitSignal(window.replyEnded, timeout=2000) as blocker:
        qtbot.mouseClick(window.stop_button, Qt.MouseButton.LeftButton)
    assert blocker.args == ["cancelled"]
    qtbot.mouseClick(window.new_chat_button, Qt.MouseButton.LeftButton)
    assert window.messages == []
    window.settings.sampling = replace(window.settings.sampling, max_tokens=8)
    with qtbot.waitSignal(window.replyEnded, timeout=60_000) as blocker:
        send(qtbot, window, "Hi")
    assert blocker.args == ["finished"]


def test_close_mid_generation_joins_the_engine_thread(qtbot: QtBot, window: MainWindow) -> None:
    window.settings.sampling = replace(window.settings.sampling, max_tokens=2000)
    send(qtbot, window, "Write a long story.")
    qtbot.waitUntil(lambda: len(window.transcript.toPlainText()) > 60, timeout=30_000)
    client = window.client
    assert not window.close()  # put off until the stopped reply is recorded and saved
    qtbot.waitUntil(lambda: window.closed, timeout=10_000)
    assert not client.engine_thread.isRunning()
