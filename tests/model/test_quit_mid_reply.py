"""Ctrl+Q while a reply streams keeps the reply as far as it was shown (issue 26)."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.chat.store import ConversationStore
from app.config.paths import data_dirs
from tests.model.test_gui_lifecycle_real import open_window, start_streaming


def test_ctrl_q_mid_reply_keeps_the_reply_so_far(
    qtbot: QtBot, tmp_path: Path, model_path: Path
) -> None:
    data = tmp_path / "data"
    win = open_window(qtbot, data, model_path)
    start_streaming(qtbot, win, "Write a long story about a lighthouse.")
    qtbot.waitUntil(lambda: len(win.session._reply.request.parts) > 3, timeout=30_000)  # type: ignore[union-attr]
    conv_id = win.conversation.id
    qtbot.keyClick(win.chat_input, Qt.Key.Key_Q, Qt.KeyboardModifier.ControlModifier)
    # The close waits (no nested event loop) for the stopped reply to be recorded.
    qtbot.waitUntil(lambda: not win.isVisible(), timeout=10_000)
    saved = ConversationStore(data_dirs(data).root).load(conv_id)
    assert [m.role for m in saved.messages] == ["user", "assistant"]
    assert saved.messages[1].content.strip()
