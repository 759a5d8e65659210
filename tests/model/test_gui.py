"""Widget behaviour with a fake engine (fast); test_gui_real.py repeats it on the real model."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.engine.chat_message import ChatMessage
from tests.fakes.engine import FakeEngine, overflow
from tests.fakes.window import WindowFactory, send
from ui.window.main_window import MainWindow

LONG_REPLY = " ".join(f"w{i}" for i in range(2000))


@pytest.fixture()
def fake() -> FakeEngine:
    return FakeEngine()


@pytest.fixture()
def window(make_window: WindowFactory, fake: FakeEngine) -> MainWindow:
    return make_window(fake)


def test_object_names_are_stable(window: MainWindow) -> None:
    from PySide6.QtWidgets import QWidget

    for name in (
        "chatInput",
        "sendButton",
        "stopButton",
        "newChatButton",
        "transcriptView",
        "statusModel",
        "statusSpeed",
    ):
        assert window.findChild(QWidget, name) is not None, name


def test_type_send_and_reply_streams_in(qtbot: QtBot, window: MainWindow) -> None:
    assert not window.send_button.isEnabled()  # nothing typed yet
    with qtbot.waitSignal(window.replyEnded, timeout=5000) as blocker:
        send(qtbot, window, "Hi there")
    assert blocker.args == ["finished"]
    text = window.transcript.toPlainText()
    assert "Hi there" in text and "Hello there, friend." in text  # Markdown rendered
    assert window.messages == [
        ChatMessage("user", "Hi there"),
        ChatMessage("assistant", "Hello there, **friend**."),
    ]
    assert window.chat_input.toPlainText() == ""
    assert "tok/s" in window.status_speed.text()
    assert "Fake model" in window.status_model.text()


def test_shift_enter_adds_a_line_without_sending(
    qtbot: QtBot, window: MainWindow, fake: FakeEngine
) -> None:
    qtbot.keyClicks(window.chat_input, "line one")
    qtbot.keyClick(window.chat_input, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(window.chat_input, "line two")
    assert window.chat_input.toPlainText() == "line one\nline two"
    assert not window.busy and fake.requests == []


def test_tokens_appear_while_streaming(qtbot: QtBot, window: MainWindow, fake: FakeEngine) -> None:
    fake.reply, fake.delay = LONG_REPLY, 0.002
    send(qtbot, window, "Go")
    qtbot.waitUntil(lambda: "w50" in window.transcript.toPlainText(), timeout=5000)
    assert window.busy and window.stop_button.isEnabled() and not window.send_button.isEnabled()
    with qtbot.waitSignal(window.replyEnded, timeout=10000):
        window.stop()


@pytest.mark.parametrize("how", ["button", "escape"])
def test_stop_ends_the_reply(qtbot: QtBot, window: MainWindow, fake: FakeEngine, how: str) -> None:
    fake.reply, fake.delay = LONG_REPLY, 0.01
    send(qtbot, window, "Go")
    qtbot.waitUntil(lambda: "w5" in window.transcript.toPlainText(), timeout=5000)
    with qtbot.waitSignal(window.replyEnded, timeout=1000) as blocker:
        if how == "button":
            qtbot.mouseClick(window.stop_button, Qt.MouseButton.LeftButton)
        else:
            qtbot.keyClick(window.chat_input, Qt.Key.Key_Escape)
    assert blocker.args == ["cancelled"]
    assert "w1999" not in window.transcript.toPlainText()
    assert window.messages[-1].role == "assistant"  # the partial reply is kept
    assert not window.busy and window.send_button.isEnabled() is False  # input is empty
    qtbot.keyClicks(window.chat_input, "again")
    assert window.send_button.isEnabled()


def test_new_chat_clears(qtbot: QtBot, window: MainWindow, fake: FakeEngine) -> None:
    with qtbot.waitSignal(window.replyEnded, timeout=5000):
        send(qtbot, window, "First")
    qtbot.mouseClick(window.new_chat_button, Qt.MouseButton.LeftButton)
    assert window.messages == []
    assert "First" not in window.transcript.toPlainText()
    qtbot.waitUntil(lambda: fake.resets == 1, timeout=2000)


def test_new_chat_during_a_reply_stops_it_first(
    qtbot: QtBot, window: MainWindow, fake: FakeEngine
) -> None:
    fake.reply, fake.delay = LONG_REPLY, 0.01
    send(qtbot, window, "Go")
    qtbot.waitUntil(lambda: "w3" in window.transcript.toPlainText(), timeout=5000)
    with qtbot.waitSignal(window.replyEnded, timeout=2000):
        window.new_chat_action.trigger()
    assert window.messages == [] and "w3" not in window.transcript.toPlainText()


def test_failure_shows_the_message_and_keeps_it_unanswered(
    qtbot: QtBot, window: MainWindow, fake: FakeEngine
) -> None:
    """A failed reply leaves the message in the transcript (and the file), marked not
    answered with an Answer link; what the user typed meanwhile stays in the box."""
    fake.fail_with = overflow()
    fake.prefill_delay = 0.3
    with qtbot.waitSignal(window.replyEnded, timeout=5000) as blocker:
        send(qtbot, window, "A very long message")
        qtbot.keyClicks(window.chat_input, "typed while waiting")
    assert blocker.args == ["failed"]
    shown = window.transcript.toPlainText()
    assert "context holds 2048" in shown
    assert "A very long message" in shown and "not answered yet" in shown
    assert window.chat_input.toPlainText() == "typed while waiting"
    assert [(m.role, m.content) for m in window.messages] == [("user", "A very long message")]
    saved = window.store.load(window.conversation.id)
    assert [m.content for m in saved.messages] == ["A very long message"]
    fake.fail_with = None
    with qtbot.waitSignal(window.replyEnded, timeout=5000) as blocker:
        window._on_message_action("answer", 0)
    assert blocker.args == ["finished"]
    assert [m.role for m in window.messages] == ["user", "assistant"]
    assert window.chat_input.toPlainText() == "typed while waiting"


def test_html_in_messages_is_shown_as_text(
    qtbot: QtBot, window: MainWindow, fake: FakeEngine
) -> None:
    fake.reply = '<img src="http://example.com/x.png"> <script>alert(1)</script>'
    with qtbot.waitSignal(window.replyEnded, timeout=5000):
        send(qtbot, window, "<b>not bold</b>")
    plain = window.transcript.toPlainText()
    assert "<b>not bold</b>" in plain
    assert "<script>alert(1)</script>" in plain
    assert "<img" not in window.transcript.toHtml().replace("&lt;img", "")


def test_streamed_text_is_appended_at_the_end_only(qtbot: QtBot, window: MainWindow) -> None:
    """Appending does not touch what is already there, so its cost cannot grow with it."""
    view = window.transcript
    for i in range(30):
        view.add_user_message(f"message {i} " + "text " * 50)
    view.begin_reply()
    changes: list[tuple[int, int, int]] = []
    view.document().contentsChange.connect(lambda p, r, a: changes.append((p, r, a)))
    for _ in range(200):
        before = view.document().characterCount()
        view.append_stream("token ")
        pos, removed, added = changes[-1]
        assert removed == 0 and added == len("token ")
        assert pos >= before - 3  # at the very end of the document
    view.end_reply("done")


def test_bad_model_file_keeps_the_app_running(
    qtbot: QtBot, window: MainWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    from PySide6.QtWidgets import QMessageBox

    monkeypatch.setattr(QMessageBox, "warning", lambda *a, **k: QMessageBox.StandardButton.Ok)
    with qtbot.waitSignal(window.modelFailed, timeout=5000):
        window.load_model("/nowhere/missing.gguf")
    assert "not found" in window.transcript.toPlainText()
    assert "still loaded" in window.status_model.text()
    with qtbot.waitSignal(window.replyEnded, timeout=5000):
        send(qtbot, window, "still works")


def test_close_during_a_reply_joins_the_thread(qtbot: QtBot, make_window: WindowFactory) -> None:
    fake = FakeEngine(LONG_REPLY, delay=0.01)
    win = make_window(fake)
    client = win.client
    send(qtbot, win, "Go")
    qtbot.waitUntil(lambda: "w3" in win.transcript.toPlainText(), timeout=5000)
    assert not win.close()  # put off until the stopped reply is recorded and saved
    qtbot.waitUntil(lambda: win.closed, timeout=5000)
    assert not client.engine_thread.isRunning()
    assert fake.model is None  # unloaded on its own thread before the join


def test_switching_models_keeps_the_conversation(
    qtbot: QtBot, window: MainWindow, tmp_path: Path
) -> None:
    with qtbot.waitSignal(window.replyEnded, timeout=5000):
        send(qtbot, window, "Remember me")
    other = tmp_path / "other.gguf"
    other.write_bytes(b"another fake model")
    with qtbot.waitSignal(window.conversationOpened, timeout=5000):
        window.load_model(other)
    assert window.messages[0].content == "Remember me"
    assert "saved with another model (model.gguf)" in window.transcript.toPlainText()


def test_a_model_llama_cpp_refuses_keeps_the_working_model(
    qtbot: QtBot, window: MainWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    from PySide6.QtWidgets import QMessageBox

    monkeypatch.setattr(QMessageBox, "warning", lambda *a, **k: QMessageBox.StandardButton.Ok)
    with qtbot.waitSignal(window.modelFailed, timeout=5000):
        window.load_model("/models/broken.gguf")
    assert "Fake model (still loaded)" in window.status_model.text()
    with qtbot.waitSignal(window.replyEnded, timeout=5000) as blocker:
        send(qtbot, window, "hello")
    assert blocker.args == ["finished"]
