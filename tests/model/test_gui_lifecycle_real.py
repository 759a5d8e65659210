"""Nothing is lost on the real engine: the click orders that used to lose a turn or a cache."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox
from pytestqt.qtbot import QtBot

from app.config.setting_records import SamplingParams
from app.config.settings import AppSettings
from tests import real_window
from tests.conftest import TEST_LOAD
from tests.fakes.window import close_window
from ui.window.main_window import MainWindow

LONG = SamplingParams.greedy(400)  # long enough to act while it streams


def open_window(qtbot: QtBot, data: Path, model: Path) -> MainWindow:
    """A window in chat turns with long replies, on the data dir ``data``."""
    settings = AppSettings(load=TEST_LOAD, sampling=LONG)
    return real_window.open_window(qtbot, data, model, settings, turns_saved=True)


@pytest.fixture()
def window(qtbot: QtBot, tmp_path: Path, model_path: Path) -> Iterator[MainWindow]:
    win = open_window(qtbot, tmp_path / "data", model_path)
    yield win
    close_window(qtbot, win)


def start_streaming(qtbot: QtBot, win: MainWindow, text: str) -> None:
    """Send ``text`` and wait until the reply has visibly started."""
    qtbot.keyClicks(win.chat_input, text)
    qtbot.keyClick(win.chat_input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: win.session.reply_started, timeout=60_000)


def test_first_conversation_survives_ctrl_n_mid_reply_and_a_restart(
    qtbot: QtBot, tmp_path: Path, model_path: Path
) -> None:
    data = tmp_path / "data"
    win = open_window(qtbot, data, model_path)
    start_streaming(qtbot, win, "Write a long story about a lighthouse.")
    first = win.conversation.id
    with qtbot.waitSignal(win.replyEnded, timeout=30_000) as ended:
        qtbot.keyClick(win.chat_input, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert ended.args == ["cancelled"]
    assert win.conversation.id != first and not win.conversation.messages
    saved = win.store.load(first)
    assert [m.role for m in saved.messages] == ["user", "assistant"]
    assert saved.messages[1].content.strip()  # the partial reply, as it was shown
    qtbot.waitUntil(lambda: win.store.snapshot_bytes(first) > 0, timeout=30_000)
    win.close()

    again = open_window(qtbot, data, model_path)
    try:
        with qtbot.waitSignal(again.conversationOpened, timeout=30_000) as opened:
            again.open_conversation(first)
        assert opened.args[0].restored  # its cache too
        assert [m.content for m in again.conversation.messages] == [
            m.content for m in saved.messages
        ]
    finally:
        again.close()


def test_snapshot_survives_a_setting_change_mid_reply(qtbot: QtBot, window: MainWindow) -> None:
    with qtbot.waitSignal(window.snapshotSaved, timeout=60_000):
        window.session.send("Name three colours.", SamplingParams.greedy(16))
    conv = window.conversation.id
    before = window.store.snapshot_bytes(conv)
    assert before > 0
    start_streaming(qtbot, window, "And three more.")
    with qtbot.waitSignal(window.modelReady, timeout=60_000):
        # The panel's reload: another batch size, applied while the reply streams.
        window._on_reload_requested(replace(window.settings.load, n_batch=256))
    assert window.store.snapshot_bytes(conv) >= before  # written, never deleted
    saved = window.store.load(conv)
    assert [m.role for m in saved.messages] == ["user", "assistant"] * 2
    with qtbot.waitSignal(window.conversationOpened, timeout=30_000) as opened:
        pass  # the reload restores the conversation's cache
    assert opened.args[0].restored, opened.args[0].note


def test_a_failed_regenerate_leaves_the_old_reply(
    qtbot: QtBot, window: MainWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(QMessageBox, "warning", lambda *a, **k: QMessageBox.StandardButton.Ok)
    with qtbot.waitSignal(window.snapshotSaved, timeout=60_000):
        window.session.send("Say something.", SamplingParams.greedy(12))
    old = [(m.role, m.content) for m in window.conversation.messages]
    # Passes the app's own checks (it has a root rule) but llama.cpp refuses it.
    bad = replace(SamplingParams.greedy(12), output_format="gbnf", grammar="root ::= (")
    window.settings.sampling = bad
    with qtbot.waitSignal(window.replyEnded, timeout=30_000) as ended:
        window.regenerate()
    assert ended.args == ["failed"]
    assert [(m.role, m.content) for m in window.conversation.messages] == old
    on_disk = window.store.load(window.conversation.id)
    assert [(m.role, m.content) for m in on_disk.messages] == old
    shown = " ".join(window.transcript.toPlainText().split())
    assert " ".join(old[-1][1].split()) in shown  # the old reply is still on screen
    assert not window.chat_input.toPlainText()  # a regenerate gives nothing back


def test_stop_before_the_first_token_keeps_roles_alternating(
    qtbot: QtBot, window: MainWindow
) -> None:
    long_prompt = "Read this carefully. " * 150  # prefill takes a moment
    with qtbot.waitSignal(window.replyEnded, timeout=30_000) as ended:
        window.session.send(long_prompt, LONG)
        window.stop()
    assert ended.args == ["cancelled"]
    assert [m.role for m in window.conversation.messages] == ["user", "assistant"]
    with qtbot.waitSignal(window.replyEnded, timeout=60_000) as ended:
        window.session.send("Hello?", SamplingParams.greedy(8))
    assert ended.args == ["finished"]
    roles = [m.role for m in window.store.load(window.conversation.id).messages]
    assert roles == ["user", "assistant", "user", "assistant"]


def test_a_failed_load_keeps_the_working_model(
    qtbot: QtBot, window: MainWindow, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(QMessageBox, "warning", lambda *a, **k: QMessageBox.StandardButton.Ok)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    with qtbot.waitSignal(window.modelFailed, timeout=30_000):
        window.load_model(bad)
    assert "(still loaded)" in window.status_model.text()
    with qtbot.waitSignal(window.replyEnded, timeout=60_000) as ended:
        window.session.send("Still there?", SamplingParams.greedy(8))
    assert ended.args == ["finished"]
