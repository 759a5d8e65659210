"""The conversation sidebar and message actions (fake engine), and resume on the real one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox
from pytestqt.qtbot import QtBot

from app.chat.store import ConversationStore
from app.config.setting_records import SamplingParams
from app.config.settings import AppSettings
from tests.conftest import TEST_LOAD
from tests.fakes.engine import FakeEngine
from tests.fakes.window import WindowFactory, send
from tests.model.test_gui import LONG_REPLY
from tests.real_window import open_window
from ui.window.main_window import MainWindow


@pytest.fixture()
def fake() -> FakeEngine:
    return FakeEngine()


@pytest.fixture()
def window(make_window: WindowFactory, fake: FakeEngine) -> MainWindow:
    return make_window(fake)


def chat(qtbot: QtBot, win: MainWindow, text: str) -> None:
    """Send ``text`` and wait until the reply and its snapshot are saved."""
    with qtbot.waitSignal(win.snapshotSaved, timeout=60_000):
        win.chat_input.setPlainText(text)
        qtbot.keyClick(win.chat_input, Qt.Key.Key_Return)


def test_replies_are_saved_and_listed(qtbot: QtBot, window: MainWindow) -> None:
    chat(qtbot, window, "What is a lighthouse?")
    store = window.store
    rows = store.list()
    assert [r.title for r in rows] == ["What is a lighthouse?"]
    assert rows[0].n_messages == 2 and rows[0].snapshot_bytes > 0
    assert window.sidebar.ids() == [window.conversation.id]
    item = window.sidebar.item_for(window.conversation.id)
    assert item is not None and "What is a lighthouse?" in item.text() and "cache" in item.text()
    assert "Saved caches:" in window.sidebar.usage.text()
    saved = store.load(window.conversation.id)
    # The fake counts a word as a token: "user What is a lighthouse?" is the prompt.
    assert saved.messages[1].metrics is not None and saved.messages[1].token_offset == 5


def test_open_switches_conversations(qtbot: QtBot, window: MainWindow) -> None:
    chat(qtbot, window, "First chat")
    first = window.conversation.id
    window.new_chat()
    chat(qtbot, window, "Second chat")
    assert len(window.sidebar.ids()) == 2
    with qtbot.waitSignal(window.conversationOpened, timeout=5000) as blocker:
        window.sidebar.openRequested.emit(first)
    assert window.conversation.id == first
    assert blocker.args[0].restored
    text = window.transcript.toPlainText()
    assert "First chat" in text and "Second chat" not in text


def test_search_filters_by_title(qtbot: QtBot, window: MainWindow) -> None:
    chat(qtbot, window, "Apples")
    window.new_chat()
    chat(qtbot, window, "Bananas")
    window.sidebar.search.setText("app")
    assert len(window.sidebar.visible_ids()) == 1
    window.sidebar.search.clear()
    assert len(window.sidebar.visible_ids()) == 2


def test_rename_in_the_list(qtbot: QtBot, window: MainWindow) -> None:
    chat(qtbot, window, "Untitled thoughts")
    conv_id = window.conversation.id
    item = window.sidebar.item_for(conv_id)
    assert item is not None
    item.setText("My trip plans")  # what an inline edit does
    assert window.store.load(conv_id).title == "My trip plans"
    assert window.conversation.title == "My trip plans"
    chat(qtbot, window, "More")  # a custom title is kept
    assert window.store.load(conv_id).title == "My trip plans"


def test_delete_asks_first(
    qtbot: QtBot, window: MainWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    chat(qtbot, window, "Delete me")
    conv_id = window.conversation.id
    answers = [QMessageBox.StandardButton.No, QMessageBox.StandardButton.Yes]
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: answers.pop(0))
    window.sidebar.deleteRequested.emit(conv_id)
    assert window.store.list() != []
    window.sidebar.deleteRequested.emit(conv_id)
    assert window.store.list() == []
    # The worker drops the snapshot in its queue, after the save the reply queued.
    snapshot = window.store.snapshot_path(conv_id)
    qtbot.waitUntil(lambda: not snapshot.exists(), timeout=5000)
    assert window.conversation.id != conv_id and window.messages == []


def test_fork_from_a_message(qtbot: QtBot, window: MainWindow) -> None:
    chat(qtbot, window, "Start")
    chat(qtbot, window, "Middle")
    original = window.conversation.id
    with qtbot.waitSignal(window.conversationOpened, timeout=5000):
        window.transcript.actionRequested.emit("fork", 1)  # after the first reply
    fork = window.conversation
    assert fork.id != original and fork.forked_from == original
    assert [m.content for m in fork.messages] == ["Start", "Hello there, **friend**."]
    assert len(window.store.load(original).messages) == 4
    chat(qtbot, window, "Another way")
    assert len(window.store.load(fork.id).messages) == 4


def test_edit_replaces_the_message_and_what_follows(
    qtbot: QtBot, window: MainWindow, fake: FakeEngine
) -> None:
    chat(qtbot, window, "Frist question")
    chat(qtbot, window, "Second question")
    window.transcript.actionRequested.emit("edit", 0)
    assert window.chat_input.toPlainText() == "Frist question"
    assert window.edit_banner.isVisible()
    window.chat_input.selectAll()
    with qtbot.waitSignal(window.snapshotSaved, timeout=5000):
        qtbot.keyClicks(window.chat_input, "First question")
        qtbot.keyClick(window.chat_input, Qt.Key.Key_Return)
    assert [m.content for m in window.conversation.messages] == [
        "First question",
        "Hello there, **friend**.",
    ]
    assert fake.requests[-1][-1].content == "First question"
    assert not window.edit_banner.isVisible()


def test_escape_cancels_an_edit(qtbot: QtBot, window: MainWindow) -> None:
    chat(qtbot, window, "Keep me")
    window.edit_message(0)
    qtbot.keyClick(window.chat_input, Qt.Key.Key_Escape)
    assert not window.edit_banner.isVisible() and window.chat_input.toPlainText() == ""
    assert len(window.conversation.messages) == 2


def test_regenerate_replaces_the_last_reply(
    qtbot: QtBot, window: MainWindow, fake: FakeEngine
) -> None:
    chat(qtbot, window, "Tell me a joke")
    fake.reply = "A different joke."
    with qtbot.waitSignal(window.snapshotSaved, timeout=5000):
        qtbot.keyClick(window.chat_input, Qt.Key.Key_R, Qt.KeyboardModifier.ControlModifier)
    contents = [m.content for m in window.conversation.messages]
    assert contents == ["Tell me a joke", "A different joke."]
    assert "Hello there" not in window.transcript.toPlainText()


def test_export_and_import(qtbot: QtBot, window: MainWindow, tmp_path: Path) -> None:
    chat(qtbot, window, "Export this")
    window.export_conversation(window.conversation, tmp_path / "c.md", "markdown")
    window.export_conversation(window.conversation, tmp_path / "c.json", "json")
    assert "Export this" in (tmp_path / "c.md").read_text()
    imported = window.store.import_json((tmp_path / "c.json").read_text())
    assert imported.id != window.conversation.id
    assert [m.content for m in imported.messages] == [
        m.content for m in window.conversation.messages
    ]


def test_a_damaged_transcript_does_not_hide_the_others(
    qtbot: QtBot, window: MainWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    chat(qtbot, window, "Healthy chat")
    bad = window.store.conversations_dir / "deadbeef.json"
    bad.write_text("{ not json")
    warnings: list[str] = []
    monkeypatch.setattr(QMessageBox, "warning", lambda _p, _t, msg, *a: warnings.append(msg))
    window.open_conversation("deadbeef")  # opened before any listing saw it
    assert warnings and "deadbeef.json: damaged" in warnings[0]
    window.refresh_sidebar()  # a listing sets it aside, with a note; the others stay
    assert window.sidebar.ids() == [window.conversation.id]
    assert bad.with_name("deadbeef.json.bad").read_text() == "{ not json"
    [note] = window.store.take_notes()
    assert "deadbeef.json: damaged" in note
    assert "Healthy chat" in window.transcript.toPlainText()


def test_closing_mid_reply_saves_the_partial_reply(
    qtbot: QtBot, tmp_path: Path, make_window: WindowFactory
) -> None:
    fake = FakeEngine(LONG_REPLY, delay=0.01)
    win = make_window(fake)
    send(qtbot, win, "Go")
    qtbot.waitUntil(lambda: "w3" in win.transcript.toPlainText(), timeout=5000)
    conv_id = win.conversation.id
    assert not win.close()  # put off until the stopped reply is recorded and saved
    qtbot.waitUntil(lambda: win.closed, timeout=5000)
    store = ConversationStore(tmp_path / "data")
    saved = store.load(conv_id)
    assert saved.messages[1].role == "assistant" and saved.messages[1].content.startswith("w0")
    assert store.snapshot_path(conv_id).exists()
    settings = json.loads((tmp_path / "data" / "settings.json").read_text())
    assert settings["last_conversation"] == conv_id


def real_window(qtbot: QtBot, data: Path, model_path: Path) -> MainWindow:
    settings = AppSettings(load=TEST_LOAD, sampling=SamplingParams.greedy(16))
    return open_window(qtbot, data, model_path, settings, turns_saved=True)


def test_resume_after_relaunch_evaluates_no_old_tokens(
    qtbot: QtBot, tmp_path: Path, model_path: Path
) -> None:
    first = real_window(qtbot, tmp_path / "data", model_path)
    chat(qtbot, first, "Tell me about lighthouses. " + "Waves and rocks. " * 20)
    chat(qtbot, first, "And about ships?")
    conv_id = first.conversation.id
    saved_tokens = first.conversation.n_tokens
    first.close()

    second = real_window(qtbot, tmp_path / "data", model_path)
    with qtbot.waitSignal(second.conversationOpened, timeout=30_000) as blocker:
        second.open_conversation(conv_id)
    restored = blocker.args[0]
    assert restored.restored, restored.note
    # The reply's context, plus the next turn's opening tokens evaluated ahead of time.
    assert saved_tokens < restored.n_tokens < saved_tokens + 10
    assert "resumed" in second.status_speed.text()
    chat(qtbot, second, "Thanks!")
    m = second.reply_metrics[-1]
    assert m.cached_tokens == restored.n_tokens  # nothing of the old conversation re-evaluated
    assert m.evaluated_tokens < 15
    second.close()


def test_a_snapshot_from_another_setting_rebuilds_with_a_note(
    qtbot: QtBot, tmp_path: Path, model_path: Path
) -> None:
    first = real_window(qtbot, tmp_path / "data", model_path)
    chat(qtbot, first, "Remember the number seven.")
    conv_id = first.conversation.id
    first.close()
    snap = ConversationStore(tmp_path / "data").snapshot_path(conv_id)
    snap.write_bytes(snap.read_bytes()[:1000])  # truncated, as by a full disk

    second = real_window(qtbot, tmp_path / "data", model_path)
    with qtbot.waitSignal(second.conversationOpened, timeout=30_000) as blocker:
        second.open_conversation(conv_id)
    assert not blocker.args[0].restored
    assert "Saved cache not used" in second.transcript.toPlainText()
    assert "Remember the number seven." in second.transcript.toPlainText()
    chat(qtbot, second, "Which number?")
    assert second.reply_metrics[-1].cached_tokens == 0  # rebuilt from the transcript
    second.close()


def test_a_conversation_reopens_with_its_settings(
    qtbot: QtBot, window: MainWindow, fake: FakeEngine
) -> None:
    from dataclasses import replace

    from PySide6.QtWidgets import QDoubleSpinBox

    spin = window.sampling_panel.findChild(QDoubleSpinBox, "field_temperature")
    assert spin is not None
    spin.setValue(0.3)
    spin.editingFinished.emit()
    assert window.settings.sampling.temperature == pytest.approx(0.3)
    chat(qtbot, window, "Careful answer please")
    first = window.conversation.id
    window._on_sampling_changed(replace(window.settings.sampling, temperature=1.4))
    window.new_chat()
    chat(qtbot, window, "Wild answer please")
    with qtbot.waitSignal(window.conversationOpened, timeout=5000):
        window.open_conversation(first)
    assert window.settings.sampling.temperature == pytest.approx(0.3)
    assert spin.value() == pytest.approx(0.3)
