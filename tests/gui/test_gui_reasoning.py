"""A reasoning reply in the window (fake engine): the thinking block, the Think button,
Stop thinking and the status line."""

from __future__ import annotations

from dataclasses import replace

import pytest
from PySide6.QtCore import Qt, QUrl
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.chat.conversation import Message
from app.chat.metrics_record import metrics_to_dict
from app.engine.backend import Capabilities
from app.engine.metrics import MessageMetrics
from app.engine.reasoning.format import ReasoningFormat
from tests.fakes.engine import FAKE_CAPABILITIES, FakeEngine
from tests.fakes.window import WindowFactory
from ui.chat import thinking_block
from ui.chat.transcript import TranscriptView
from ui.window import capabilities
from ui.window.main_window import MainWindow
from ui.window.session_view import speed_text

THINK = ReasoningFormat("<think>", "</think>", switch="enable_thinking")
THOUGHT = "Let me see: the user greets me, so I greet back."


@pytest.fixture()
def fake() -> FakeEngine:
    fake = FakeEngine()
    fake.reasoning = THOUGHT
    fake.reasoning_format = THINK
    return fake


def send(qtbot: QtBot, win: MainWindow, text: str, timeout: int = 10_000) -> list[object]:
    with qtbot.waitSignal(win.replyEnded, timeout=timeout) as ended:
        qtbot.keyClicks(win.chat_input, text)
        qtbot.keyClick(win.chat_input, Qt.Key.Key_Return)
    return list(ended.args or [])


def test_thinking_streams_live_then_folds_at_the_answer(
    qtbot: QtBot, window: MainWindow, fake: FakeEngine
) -> None:
    fake.reasoning = " ".join(f"t{i}" for i in range(60))
    fake.delay = 0.02
    seen: list[str] = []
    window.chat.thoughtsFlushed.connect(
        lambda _n: seen.append(window.transcript.toPlainText() + window.status_speed.text())
    )
    assert send(qtbot, window, "Hi") == ["finished"]
    # While it streamed: the block was open and live, with the thinking in it.
    assert any("Thinking…" in s and "t5" in s and "thinking…" in s for s in seen)
    text = window.transcript.toPlainText()
    assert "Thought for" in text and "60 tokens" in text
    assert "t5" not in text  # folded once the answer came
    assert "Hello there, friend." in text
    last = window.conversation.messages[-1]
    assert last.reasoning == fake.reasoning and last.content == fake.reply
    status = window.status_speed.text()
    assert "first answer" in status and "thought 60 tokens" in status
    assert not window.chat.stop_thinking_button.isVisible()

    # A click on the toggle line opens it; another folds it.
    index = len(window.conversation.messages) - 1
    window.transcript._on_anchor_clicked(QUrl(window.transcript._action_href("thinking", index)))
    assert window.transcript.thinking_open(index)
    assert "t5" in window.transcript.toPlainText()
    assert "Hello there, friend." in window.transcript.toPlainText()
    window.transcript.toggle_thinking(index)
    assert "t5" not in window.transcript.toPlainText()


def test_reopened_chat_shows_saved_thinking_folded(
    qtbot: QtBot, window: MainWindow, fake: FakeEngine
) -> None:
    send(qtbot, window, "Hi")
    conv_id = window.conversation.id
    window.new_chat()
    assert "Thought for" not in window.transcript.toPlainText()
    with qtbot.waitSignal(window.conversationOpened, timeout=5000):
        window.open_conversation(conv_id)
    text = window.transcript.toPlainText()
    assert "Thought for" in text and THOUGHT not in text
    index = len(window.conversation.messages) - 1
    assert window.transcript.toggle_thinking(index)
    assert THOUGHT in window.transcript.toPlainText()


def test_copy_thinking_and_copy_answer(qtbot: QtBot, window: MainWindow) -> None:
    send(qtbot, window, "Hi")
    index = len(window.conversation.messages) - 1
    copied: list[str] = []
    window.transcript.copied.connect(copied.append)
    window.transcript._on_anchor_clicked(
        QUrl(window.transcript._action_href("copy-thinking", index))
    )
    assert QApplication.clipboard().text() == THOUGHT
    assert window.transcript.copy_message(index)
    assert QApplication.clipboard().text() == "Hello there, **friend**."
    assert copied == ["thinking", "message"]


def test_think_button_sets_the_next_requests_params(
    qtbot: QtBot, window: MainWindow, fake: FakeEngine
) -> None:
    button = window.thinking.button
    assert button.isEnabled()
    assert "enable_thinking" in button.toolTip()
    button.modes["off"].trigger()
    assert window.settings.sampling.thinking == "off"
    assert window.sampling_panel.params().thinking == "off"  # both views agree
    assert button.text() == "Think: off"
    send(qtbot, window, "Hi")
    assert fake.params[-1].thinking == "off"
    assert window.conversation.messages[-1].reasoning == ""  # the fake thought nothing
    assert "Thought for" not in window.transcript.toPlainText()
    # The panel's change shows on the button too.
    window.sampling_panel.set_params(replace(window.settings.sampling, thinking="on"))
    window.sampling_panel.samplingChanged.emit(window.sampling_panel.params())
    assert button.modes["on"].isChecked()


def test_stop_thinking_ends_the_block_and_the_model_answers(
    qtbot: QtBot, window: MainWindow, fake: FakeEngine
) -> None:
    fake.reasoning = " ".join(f"t{i}" for i in range(2000))
    fake.delay = 0.005
    with qtbot.waitSignal(window.replyEnded, timeout=20_000) as ended:
        qtbot.keyClicks(window.chat_input, "Hi")
        qtbot.keyClick(window.chat_input, Qt.Key.Key_Return)
        qtbot.waitUntil(lambda: window.chat.stop_thinking_button.isVisible(), timeout=5000)
        assert window.chat.stop_thinking_button.isEnabled()
        assert window.thinking.stop_action.isEnabled()
        qtbot.waitUntil(lambda: window.chat.thought_tokens > 5, timeout=5000)
        window.thinking.stop_action.trigger()
    assert ended.args == ["finished"]
    last = window.conversation.messages[-1]
    assert last.content == fake.reply and 0 < len(last.reasoning.split()) < 2000
    text = window.transcript.toPlainText()
    assert "stopped by you" in text and "Hello there, friend." in text
    assert "stopped by you" in window.status_speed.text()
    assert not window.thinking.stop_action.isEnabled()


def test_a_reply_that_only_thought_shows_the_block_open_with_a_note(
    qtbot: QtBot, window: MainWindow, fake: FakeEngine
) -> None:
    window.settings_store.update(sampling=replace(window.settings.sampling, max_tokens=5))
    send(qtbot, window, "Hi")
    text = window.transcript.toPlainText()
    assert "did not answer" in text
    assert "Let me see: the user" in text  # open: its thinking is shown
    assert window.conversation.messages[-1].content == ""


def test_disabled_without_thinking_control_or_reasoning(
    qtbot: QtBot, make_window: WindowFactory, fake: FakeEngine
) -> None:
    fake.caps = replace(
        FAKE_CAPABILITIES,
        thinking_control=False,
        why_not={**FAKE_CAPABILITIES.why_not, "thinking_control": "the server decides"},
    )
    fake.reasoning_format = None
    fake.delay = 0.01
    win = make_window(fake)
    assert not win.thinking.button.isEnabled()
    assert "no sign of thinking" in win.thinking.button.toolTip()
    with qtbot.waitSignal(win.replyEnded, timeout=10_000):
        qtbot.keyClicks(win.chat_input, "Hi")
        qtbot.keyClick(win.chat_input, Qt.Key.Key_Return)
        qtbot.waitUntil(lambda: win.chat.stop_thinking_button.isVisible(), timeout=5000)
        assert not win.chat.stop_thinking_button.isEnabled()
        assert "the server decides" in win.chat.stop_thinking_button.toolTip()
        assert not win.thinking.stop_action.isEnabled()


def test_transcript_renders_saved_reasoning_escaped(qtbot: QtBot) -> None:
    view = TranscriptView()
    qtbot.addWidget(view)
    metrics = MessageMetrics(
        reasoning_tokens=512, thinking_cut="budget", token_times_ms=[10.0, 4010.0]
    )
    metrics.first_answer_ms = 4010.0
    reply = Message("assistant", "The answer.", reasoning="<b>not bold</b> & more")
    reply.metrics = metrics_to_dict(metrics)
    view.show_messages([Message("user", "Q"), reply])
    assert "512 tokens · stopped at the budget" in view.toPlainText()
    assert "not bold" not in view.toPlainText()  # folded
    assert view.toggle_thinking(1)
    text = view.toPlainText()
    assert "<b>not bold</b> & more" in text  # shown as text, never as HTML
    assert "The answer." in text
    assert not view.toggle_thinking(0)  # the user's message has no thinking


def test_summary_texts() -> None:
    assert thinking_block.live_text(14.2, 380) == "Thinking… 14 s, 380 tokens"
    assert thinking_block.summary_text(4.23, 1) == "Thought for 4.2 s · 1 token"
    assert (
        thinking_block.summary_text(75, 512, "budget", 512)
        == "Thought for 1 min 15 s · 512 tokens · stopped at the budget of 512 tokens"
    )
    assert thinking_block.summary_text(3, 9, "user").endswith("stopped by you")
    m = MessageMetrics(reasoning_tokens=380, token_times_ms=[100.0, 4300.0])
    m.first_answer_ms = 4300.0
    assert "first answer 4.3 s · thought 380 tokens" in speed_text(m)
    assert capabilities.thinking_text(None) == ""


def test_thinking_text_for_the_status_line(window: MainWindow) -> None:
    assert "thinks (<think> tags, switchable)" in window.status_model.text()
    assert capabilities.thinking_text(window.loaded_model.info) == (
        "thinks (<think> tags, switchable)"
    )
    assert Capabilities().thinking_control is False
