"""A reasoning reply in the window on the real engine (issue 28): the default model with
an R1-shaped template (the prompt opens the thinking block), a thinking budget, Stop
thinking, and a second turn that reads only the new message."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.config.setting_records import SamplingParams
from app.engine.templates.override import TemplateOverride
from tests.real_window import real_window
from tests.reasoning_templates import R1
from ui.window.main_window import MainWindow

PARAMS = replace(SamplingParams.greedy(40), thinking_budget=10, budget_message="I will answer now.")


@pytest.fixture()
def window(qtbot: QtBot, tmp_path: Path, model_path: Path) -> Iterator[MainWindow]:
    with real_window(qtbot, tmp_path, model_path, PARAMS) as win:
        client = win.ctx.client
        with qtbot.waitSignal(client.worker.templateApplied, timeout=30_000):
            client.set_template(TemplateOverride("custom", source=R1))
        yield win


def send(qtbot: QtBot, win: MainWindow, text: str) -> None:
    with qtbot.waitSignal(win.replyEnded, timeout=120_000):
        qtbot.keyClicks(win.chat_input, text)
        qtbot.keyClick(win.chat_input, Qt.Key.Key_Return)


def test_budget_thinking_block_and_a_second_turn_on_the_real_engine(
    qtbot: QtBot, window: MainWindow
) -> None:
    send(qtbot, window, "Hello!")
    reply = window.messages[-1]
    assert reply.reasoning.endswith("I will answer now.")
    assert reply.content.strip() and "</think>" not in reply.content
    metrics = window.reply_metrics[-1]
    assert metrics.reasoning_tokens == 10 and metrics.thinking_cut == "budget"
    text = window.transcript.toPlainText()
    assert "Thought for" in text and "budget" in text
    assert "I will answer now." not in text  # folded once the answer came
    assert "thought" in window.status_speed.text()
    send(qtbot, window, "Thanks.")
    second = window.reply_metrics[-1]
    # The template drops the first reply's thinking; the cache was reworked after it.
    assert second.evaluated_tokens < 16, second


def test_stop_thinking_from_the_window(qtbot: QtBot, window: MainWindow) -> None:
    params = replace(PARAMS, thinking_budget=0)
    window.ctx.settings.update(sampling=params)
    window.sampling_panel.set_params(params)
    fired: list[int] = []

    def stop_soon(_request: int, _text: str) -> None:
        action = window.thinking.stop_action
        if not fired and action.isEnabled():
            fired.append(1)
            action.trigger()

    window.ctx.client.worker.thoughts.connect(stop_soon)
    send(qtbot, window, "Count to ten.")
    assert fired
    metrics = window.reply_metrics[-1]
    assert metrics.thinking_cut == "user"
    assert window.messages[-1].content.strip()
