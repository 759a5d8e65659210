"""Compaction in the window (issue 45) on the fake engine: Chat → Compact chat… says
what it frees and costs, then the transcript shows the summarised messages marked and
the summary as a folded card; Undo compaction brings the chat back; the "compact"
policy compacts a chat past three quarters of its context; a chat too short says so."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
from PySide6.QtWidgets import QInputDialog, QMessageBox
from pytestqt.qtbot import QtBot

from app.chat.compaction import DEFAULT_PROMPT
from app.engine.backend import Capabilities
from tests.fakes.engine import FakeEngine
from tests.fakes.window import WindowFactory, send
from ui.window import compaction_wiring
from ui.window.main_window import MainWindow


@pytest.fixture()
def window(make_window: WindowFactory, fake: FakeEngine) -> Iterator[MainWindow]:
    yield make_window(fake)


def chat(qtbot: QtBot, win: MainWindow, turns: int) -> None:
    for i in range(turns):
        with qtbot.waitSignal(win.replyEnded, timeout=5000):
            send(qtbot, win, f"Tell me about port {i}")


def test_compact_then_undo_from_the_chat_menu(
    qtbot: QtBot, window: MainWindow, fake: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    chat(qtbot, window, 4)
    asked: list[str] = []

    def question(_parent: object, _title: str, text: str, *_a: object) -> object:
        asked.append(text)
        return QMessageBox.StandardButton.Yes

    monkeypatch.setattr(QMessageBox, "question", question)
    fake.reply = "They asked about ports 0 and 1."
    before = [m.id for m in window.conversation.messages]
    with qtbot.waitSignal(window.replyEnded, timeout=5000):
        window.compaction.compact_action.trigger()
    assert asked and asked[0].startswith("Summarise 4 earlier messages?")
    conv = window.conversation
    summary = conv.active_summary()
    assert summary is not None and summary.content == "They asked about ports 0 and 1."
    assert fake.requests[-1][-1].content == DEFAULT_PROMPT.replace("{kept}", "4")
    html = window.transcript.toHtml()
    assert "Summary of 4 earlier messages" in html and "summarised: the model reads" in html
    assert "They asked about ports 0 and 1." not in window.transcript.toPlainText()  # folded
    assert "Copy summary" in window.transcript.toPlainText()
    assert window.compaction.undo_action.isEnabled() or window.session.can_undo_compaction()
    window.compaction.undo_action.trigger()
    assert [m.id for m in window.conversation.messages] == before
    assert window.conversation.active_summary() is None
    assert "Summary of" not in window.transcript.toHtml()


def test_a_short_chat_is_not_compacted(
    qtbot: QtBot, window: MainWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    chat(qtbot, window, 2)
    n = len(window.conversation.messages)
    window.compaction.compact_action.trigger()
    assert len(window.conversation.messages) == n
    assert "not enough to compact yet" in window.transcript.toPlainText()


def test_the_compact_policy_compacts_a_nearly_full_chat(
    qtbot: QtBot, window: MainWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    params = replace(window.sampling_panel.params(), overflow="compact")
    window.sampling_panel.set_params(params)
    chat(qtbot, window, 3)
    assert window.conversation.active_summary() is None  # far from full
    monkeypatch.setattr(compaction_wiring, "NEARLY_FULL", 0.0)  # as a long chat would be
    with qtbot.waitSignal(window.replyEnded, timeout=5000):
        send(qtbot, window, "One more about port 9")
    qtbot.waitUntil(lambda: window.conversation.active_summary() is not None, timeout=5000)
    assert "Compacted: 4 earlier messages" in window.transcript.toPlainText()


def test_the_prompt_is_seen_and_edited(window: MainWindow, monkeypatch: pytest.MonkeyPatch) -> None:
    shown: list[str] = []

    def edit(_p: object, _t: str, _label: str, text: str) -> tuple[str, bool]:
        shown.append(text)
        return ("Summarise briefly, keeping {kept} messages out.", True)

    monkeypatch.setattr(QInputDialog, "getMultiLineText", edit)
    window.compaction.prompt_action.trigger()
    assert shown == [DEFAULT_PROMPT]
    assert window.compaction.prompt() == "Summarise briefly, keeping {kept} messages out."


def test_the_question_says_what_undo_costs_on_the_model_in_use(window: MainWindow) -> None:
    info = window.loaded_model.info
    assert info is not None
    assert compaction_wiring._undo_cost(info) == "without reading it again"
    remote = replace(info, server="http://127.0.0.1:1", capabilities=Capabilities())
    assert "reads it again" in compaction_wiring._undo_cost(remote)
    slots = replace(remote, capabilities=Capabilities(snapshots=True))  # llama-server's
    assert compaction_wiring._undo_cost(slots) == "without reading it again"
