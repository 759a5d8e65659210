"""On the real engine: switching versions reuses the cached prefix (issue 26)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from pytestqt.qtbot import QtBot

from app.config.setting_records import SamplingParams
from app.engine.metrics import MessageMetrics
from tests.model.test_gui_lifecycle_real import open_window
from ui.window.main_window import MainWindow

SHORT = SamplingParams.greedy(8)


def reply(qtbot: QtBot, win: MainWindow, action: str = "", text: str = "") -> None:
    with qtbot.waitSignal(win.replyEnded, timeout=60_000) as ended:
        if action == "regenerate":
            win.regenerate()
        else:
            win.chat_input.setPlainText(text)
            win.send()
    assert ended.args == ["finished"]


def last_metrics(win: MainWindow) -> MessageMetrics:
    metrics = win.conversation.messages[-1].message_metrics()
    assert metrics is not None
    return metrics


def test_switching_versions_reads_only_what_differs_also_after_a_restart(
    qtbot: QtBot, tmp_path: Path, model_path: Path
) -> None:
    data = tmp_path / "data"
    win = open_window(qtbot, data, model_path)
    win.settings.sampling = SHORT
    reply(qtbot, win, text="Name three colours.")
    first_turn = last_metrics(win).prompt_tokens  # the prompt up to the first reply
    win.settings.sampling = replace(SHORT, temperature=1.5, seed=7)
    reply(qtbot, win, "regenerate")
    assert win.conversation.version_of(1) == (2, 2)
    # Back to the first reply, then go on: the cache keeps the first turn.
    assert win.session.switch_version(1, -1)
    win.settings.sampling = SHORT
    reply(qtbot, win, text="And three more.")
    m = last_metrics(win)
    assert first_turn <= m.cached_tokens < m.prompt_tokens
    assert m.evaluated_tokens == m.prompt_tokens - m.cached_tokens
    conv_id = win.conversation.id
    qtbot.waitUntil(lambda: win.store.snapshot_bytes(conv_id) > 0, timeout=30_000)
    win.close()

    again = open_window(qtbot, data, model_path)
    try:
        again.settings.sampling = SHORT
        with qtbot.waitSignal(again.conversationOpened, timeout=30_000) as opened:
            again.open_conversation(conv_id)
        assert opened.args[0].restored
        assert again.conversation.version_of(1) == (1, 2)
        assert again.session.switch_version(1, 1)  # the regenerated reply, from the file
        assert len(again.conversation.messages) == 2
        reply(qtbot, again, text="Why?")
        m = last_metrics(again)
        assert first_turn <= m.cached_tokens < m.prompt_tokens
    finally:
        again.close()
