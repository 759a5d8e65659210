"""Tool calls in the window: the approval card in the transcript, editing arguments, the
worker's plumbing, and the whole round trip with a fake engine and a fake MCP host."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PySide6.QtCore import Qt, QUrl
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.chat.conversation import Message
from app.config.paths import data_dirs
from tests.fakes.engine import FakeEngine
from tests.fakes.mcp import CALL, FakeMcpHost, calc_host
from tests.fakes.window import WindowFactory, close_window
from tests.hypothesis_budget import examples
from ui.chat import tool_card
from ui.chat.tool_args_dialog import ToolArgsDialog
from ui.chat.tool_card import CardCall, CardState, calls_of, card_html, parse_arguments
from ui.chat.transcript import TranscriptView
from ui.tools import mcp_control
from ui.window.main_window import MainWindow
from ui.window.reply_events import call_progress_text


def call_dict(state: str = "ask", call_id: str = "call_1", **extra: Any) -> dict[str, Any]:
    return {
        "id": call_id,
        "name": "add",
        "arguments": '{"a": 2, "b": 3}',
        "server": "calc",
        "state": state,
        **extra,
    }


def chat(
    *calls: dict[str, Any], results: dict[str, tuple[str, bool]] | None = None
) -> list[Message]:
    msgs = [Message("user", "What is 2 + 3?"), Message("assistant", "", tool_calls=list(calls))]
    for call_id, (text, error) in (results or {}).items():
        msgs.append(Message("tool", text, tool_call_id=call_id, name="add", is_error=error))
    return msgs


def links(view: TranscriptView) -> dict[str, str]:
    """Each link's text -> its href, in the order drawn (the last one wins a clash)."""
    found: dict[str, str] = {}
    doc = view.document()
    block = doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            frag = it.fragment()
            href = frag.charFormat().anchorHref()
            if href:
                found[frag.text()] = href
            it += 1
        block = block.next()
    return found


def click(view: TranscriptView, label: str) -> None:
    found = links(view)
    match = [text for text in found if label in text]
    assert match, f"no link {label!r} in {sorted(found)}"
    view.anchorClicked.emit(QUrl(found[match[0]]))


def shown(messages: list[Message], qtbot: QtBot) -> TranscriptView:
    view = TranscriptView()
    qtbot.addWidget(view)
    view.show_messages(messages)
    return view


# -- the card, on its own -----------------------------------------------------------------


def test_a_call_waiting_shows_its_tool_server_arguments_and_the_four_choices(
    qtbot: QtBot,
) -> None:
    view = shown(chat(call_dict("ask")), qtbot)
    text = view.toPlainText()
    assert "add" in text and "calc" in text and "Waiting for your approval" in text
    assert '"a": 2' in text  # pretty JSON
    for label in ("Allow once", "Always for this tool", "Always for this server", "Deny"):
        assert label in links(view)
    assert "Edit arguments…" in links(view)
    seen: list[tuple[str, str]] = []
    view.cards.requested.connect(lambda verb, call_id: seen.append((verb, call_id)))
    for label, verb in (
        ("Allow once", "once"),
        ("Always for this tool", "always_tool"),
        ("Always for this server", "always_server"),
        ("Deny", "deny"),
        ("Edit arguments", "edit"),
    ):
        click(view, label)
        assert seen[-1] == (verb, "call_1")


def test_tool_results_are_not_bubbles_but_the_card_result_folded(qtbot: QtBot) -> None:
    result = "The sum is five." + " x" * 3000
    msgs = chat(call_dict("done", ms=1234.0), results={"call_1": (result, False)})
    msgs.append(Message("assistant", "2 + 3 = 5."))
    view = shown(msgs, qtbot)
    text = view.toPlainText()
    assert "Done in 1.2 s" in text and f"{len(result):,} characters" in text
    assert "The sum is five." not in text  # folded
    assert text.count("Assistant") == 2 and "Tool" not in text.split("add")[0]
    click(view, "Result")
    text = view.toPlainText()
    assert "The sum is five." in text and len(text) < len(result)  # the first 2,000 only
    click(view, "Show all")
    assert view.toPlainText().count(" x") >= 3000
    with qtbot.waitSignal(view.copied):
        click(view, "Copy result")
    assert QApplication.clipboard().text() == result
    click(view, "Result")  # folded again
    assert "The sum is five." not in view.toPlainText()
    assert view.show_message(2)  # a search hit in a result: the card's message
    assert view.textCursor().position() < view._frames[3].firstPosition()


def test_an_error_result_is_in_the_error_colour(qtbot: QtBot) -> None:
    msgs = chat(call_dict("denied"), results={"call_1": ("The user denied this call.", True)})
    view = shown(msgs, qtbot)
    assert "Denied" in view.toPlainText() and "The user denied this call." in view.toPlainText()
    assert "#d1242f" in view.toHtml().lower()


def test_a_running_call_ticks_and_offers_stop(qtbot: QtBot) -> None:
    view = shown(chat(call_dict("running")), qtbot)
    assert "Running… 0.0 s" in view.toPlainText() and view.cards.running()
    seen: list[str] = []
    view.cards.requested.connect(lambda verb, _id: seen.append(verb))
    click(view, "Stop")
    assert seen == ["stop"]
    view.cards._states["call_1"].started -= 3  # as if it had run for 3 s
    qtbot.waitUntil(
        lambda: bool(re.search(r"Running… [3-9]\.\d s", view.toPlainText())), timeout=3000
    )
    msgs = chat(call_dict("done", ms=3100.0), results={"call_1": ("5", False)})
    view.show_tool_calls(1, msgs[1], msgs)
    assert not view.cards.running() and "Done in 3.1 s" in view.toPlainText()
    assert "Running" not in view.toPlainText()


def test_cards_redraw_in_place_keeping_the_message_text(qtbot: QtBot) -> None:
    msgs = chat(call_dict("ask"), call_dict("ask", call_id="call_2"))
    msgs[1].content = "Let me add them."
    view = shown(msgs, qtbot)
    assert view.toPlainText().count("Waiting for your approval") == 2
    msgs[1].tool_calls[0]["state"] = "running"
    view.show_tool_calls(1, msgs[1], msgs)
    text = view.toPlainText()
    assert text.count("Waiting for your approval") == 1 and "Running…" in text
    assert text.count("Let me add them.") == 1 and text.count("calc") == 2
    assert len(tool_card.card_frames(view._frames[1])) == 2


def test_long_arguments_are_folded(qtbot: QtBot) -> None:
    args = json.dumps({f"k{i}": "v" * 20 for i in range(40)})
    view = shown(chat(call_dict("ask", arguments=args)), qtbot)
    assert "k39" not in view.toPlainText()
    click(view, "Show all arguments")
    assert "k39" in view.toPlainText()
    click(view, "Fold arguments")
    assert "k39" not in view.toPlainText()


def test_hostile_text_on_a_card_is_text_and_its_links_need_the_key(qtbot: QtBot) -> None:
    evil = "<a href='lamplight://x/tool-once/1/0'>Allow once</a><img src='http://e/x'>"
    msgs = chat(call_dict("done", name=evil, server=evil), results={"call_1": (evil, False)})
    view = shown(msgs, qtbot)
    assert evil in view.toPlainText()
    assert all(view._key in href for href in links(view).values())
    seen: list[str] = []
    view.cards.requested.connect(lambda verb, _id: seen.append(verb))
    for bad in ("lamplight://x/tool-once/1/0", f"lamplight://{view._key}/tool-once/1/9"):
        view.anchorClicked.emit(QUrl(bad))
    assert seen == []


@settings(max_examples=examples(150), deadline=None)
@given(
    raw=st.lists(
        st.one_of(
            st.dictionaries(
                st.sampled_from(["id", "name", "arguments", "server", "state", "ms", "x"]),
                st.one_of(
                    st.text(max_size=30),
                    st.integers(),
                    st.floats(),
                    st.none(),
                    st.booleans(),
                    st.lists(st.integers(), max_size=3),
                ),
            ),
            st.integers(),
            st.text(max_size=5),
        ),
        max_size=6,
    ),
    result=st.text(max_size=50),
)
def test_any_stored_calls_make_cards_that_escape_their_text(raw: list[Any], result: str) -> None:
    msgs = [Message("assistant", "", tool_calls=raw), Message("tool", result, tool_call_id="a")]
    for call in calls_of(msgs[0], msgs):
        assert call.state in tool_card.STATE_TEXT
        for opened in (False, True):
            state = CardState(args_open=opened, result_open=opened, result_all=opened)
            page = card_html(call, state, lambda verb: f"lamplight://k/{verb}", False, 0.0)
            assert "<script" not in page.lower() and "<img" not in page.lower()


@given(st.text(max_size=200))
def test_edited_arguments_are_a_json_object_or_a_reason(text: str) -> None:
    value, why = parse_arguments(text)
    assert (value is None) == bool(why)
    assert value is None or isinstance(value, dict)


def test_edited_arguments_limits() -> None:
    assert parse_arguments("[" * 100_000 + "]" * 100_000)[1]
    assert "too long" in parse_arguments("{" + " " * 300_000 + "}")[1]
    assert "JSON object" in parse_arguments("[1, 2]")[1]
    assert "not valid JSON" in parse_arguments("{a: 1}")[1]
    assert parse_arguments('{"a": 1}') == ({"a": 1}, "")


def test_summary_lines() -> None:
    assert tool_card.summary_text(CardCall("c", "t", state="done", ms=812, result="abc")) == (
        "Done in 0.8 s · 3 characters"
    )
    failed = CardCall("c", "t", state="error", result="Boom: it broke\nmore", is_error=True)
    assert tool_card.summary_text(failed) == "Failed · Boom: it broke"
    assert tool_card.summary_text(CardCall("c", "t", state="timeout")) == "Timed out"
    assert "wait" not in tool_card.accessible_text(CardCall("c", "t", state="timeout"))
    assert "calc" in tool_card.accessible_text(CardCall("c", "t", server="calc"))


# -- the arguments dialog -------------------------------------------------------------------


def test_edit_arguments_refuses_what_is_not_a_json_object_and_shows_why(qtbot: QtBot) -> None:
    asked: list[str] = []
    answer = ["The session says no."]

    def submit(text: str) -> str:
        asked.append(text)
        return answer[0]

    dialog = ToolArgsDialog("add", "calc", '{"a":2}', submit)
    qtbot.addWidget(dialog)
    dialog.show()
    assert '"a": 2' in dialog.editor.toPlainText()  # pretty
    dialog.editor.setPlainText("{not json")
    dialog.run_button.click()
    assert dialog.isVisible() and not asked
    assert "not valid JSON" in dialog.error.text() and dialog.error.isVisibleTo(dialog)
    dialog.editor.setPlainText("[1]")
    dialog.run_button.click()
    assert "JSON object" in dialog.error.text() and not asked
    dialog.editor.setPlainText('{"a": 7}')
    dialog.run_button.click()
    assert asked == ['{"a": 7}'] and dialog.isVisible()
    assert dialog.error.text() == "The session says no."
    answer[0] = ""
    with qtbot.waitSignal(dialog.accepted, timeout=1000):
        dialog.run_button.click()
    assert not dialog.isVisible()


# -- the round trip in the window (fake engine, fake MCP host) ----------------------------


@pytest.fixture()
def host(monkeypatch: pytest.MonkeyPatch) -> FakeMcpHost:
    fake_host = calc_host()
    monkeypatch.setattr(mcp_control, "HOST_FACTORY", lambda _dir: fake_host)
    return fake_host


@pytest.fixture()
def fake() -> FakeEngine:
    engine = FakeEngine(reply="The answer is 5.")
    engine.tool_calls = (CALL,)
    return engine


@pytest.fixture()
def window(
    qtbot: QtBot, tmp_path: Path, make_window: WindowFactory, fake: FakeEngine, host: FakeMcpHost
) -> Iterator[MainWindow]:
    dirs = data_dirs(tmp_path / "data")
    (dirs.root / "mcp.json").write_text('{"mcpServers": {}}', encoding="utf-8")
    win = make_window(fake, dirs=dirs)
    yield win
    host.release.set()
    close_window(qtbot, win)


def ask(qtbot: QtBot, win: MainWindow, text: str = "What is 2 + 3?") -> None:
    """Send ``text`` and wait for the card to ask."""
    qtbot.keyClicks(win.chat_input, text)
    qtbot.keyClick(win.chat_input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: "Allow once" in links(win.transcript), timeout=10_000)


def settled(qtbot: QtBot, win: MainWindow) -> None:
    qtbot.waitUntil(lambda: not win.session.busy, timeout=10_000)


def test_allow_once_runs_the_tool_and_the_reply_goes_on(
    qtbot: QtBot, window: MainWindow, fake: FakeEngine, host: FakeMcpHost
) -> None:
    ask(qtbot, window)
    offered = fake.tools[0]
    assert offered is not None and [t.name for t in offered.tools] == ["add"]
    assert window.session.busy and window.stop_button.isEnabled()
    assert "1 tool call(s) wait" in window.transcript.accessibleDescription()
    click(window.transcript, "Allow once")
    settled(qtbot, window)
    assert host.calls == [("add", {"a": 2, "b": 3})]
    last = fake.requests[-1]
    assert [m.role for m in last[-2:]] == ["assistant", "tool"] and last[-1].content == "5"
    assert last[-2].tool_calls == (CALL,)
    text = window.transcript.toPlainText()
    assert "Done" in text and "The answer is 5." in text and "Allow once" not in text
    assert "wait" not in window.transcript.accessibleDescription()
    roles = [m.role for m in window.conversation.messages]
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert not host.calls[1:] and len(fake.requests) == 2


def test_deny_sends_the_model_an_error_result(
    qtbot: QtBot, window: MainWindow, fake: FakeEngine, host: FakeMcpHost
) -> None:
    ask(qtbot, window)
    click(window.transcript, "Deny")
    settled(qtbot, window)
    assert host.calls == []
    result = fake.requests[-1][-1]
    assert result.role == "tool" and "denied" in result.content
    assert "Denied" in window.transcript.toPlainText()


def test_edit_arguments_refuses_invalid_json_then_runs_the_edit(
    qtbot: QtBot, window: MainWindow, fake: FakeEngine, host: FakeMcpHost
) -> None:
    ask(qtbot, window)
    click(window.transcript, "Edit arguments")
    dialog = window.session_view.args_dialog
    assert dialog is not None and dialog.isVisible()
    dialog.editor.setPlainText('{"a": 2,')
    dialog.run_button.click()
    assert dialog.isVisible() and "not valid JSON" in dialog.error.text() and not host.calls
    dialog.editor.setPlainText('{"a": 40, "b": 2}')
    dialog.run_button.click()
    settled(qtbot, window)
    assert host.calls == [("add", {"a": 40, "b": 2})]
    assert window.session_view.args_dialog is None
    assert '"a": 40' in window.transcript.toPlainText()


def test_stop_while_a_call_runs_cancels_it(
    qtbot: QtBot, window: MainWindow, fake: FakeEngine, host: FakeMcpHost
) -> None:
    host.held.add("add")
    ask(qtbot, window)
    click(window.transcript, "Allow once")
    assert host.started.wait(5)
    qtbot.waitUntil(lambda: "Running…" in window.transcript.toPlainText(), timeout=5000)
    click(window.transcript, "Stop")
    settled(qtbot, window)
    qtbot.waitUntil(lambda: host.cancelled == 1, timeout=5000)
    assert len(fake.requests) == 1  # no next round
    assert "Cancelled" in window.transcript.toPlainText()
    assert not window.transcript.cards.running()


def test_a_reopened_chat_shows_its_calls(
    qtbot: QtBot, window: MainWindow, fake: FakeEngine, host: FakeMcpHost
) -> None:
    ask(qtbot, window)
    click(window.transcript, "Allow once")
    settled(qtbot, window)
    conv_id = window.conversation.id
    window.new_chat()
    assert "calc" not in window.transcript.toPlainText()
    window.open_conversation(conv_id)
    qtbot.waitUntil(lambda: "Done" in window.transcript.toPlainText(), timeout=5000)
    text = window.transcript.toPlainText()
    assert "calc" in text and "The answer is 5." in text and "Result" in text
    click(window.transcript, "Result")
    assert "5" in window.transcript.toPlainText().split("Result")[-1]


def test_always_for_this_tool_asks_no_more(
    qtbot: QtBot, window: MainWindow, fake: FakeEngine, host: FakeMcpHost
) -> None:
    ask(qtbot, window)
    click(window.transcript, "Always for this tool")
    settled(qtbot, window)
    qtbot.keyClicks(window.chat_input, "And again?")
    qtbot.keyClick(window.chat_input, Qt.Key.Key_Return)
    settled(qtbot, window)
    qtbot.waitUntil(lambda: len(host.calls) == 2, timeout=5000)
    assert "Allow once" not in links(window.transcript)
    assert len(fake.requests) == 4


def test_the_menu_answer_and_a_chat_left_mid_call_reopens_cancelled(
    qtbot: QtBot, window: MainWindow, fake: FakeEngine, host: FakeMcpHost
) -> None:
    assert not window.session_view.decide_waiting("once")  # nothing waits
    ask(qtbot, window)
    conv_id = window.conversation.id
    window.new_chat()  # stops the reply: the call is never run
    settled(qtbot, window)
    window.open_conversation(conv_id)
    qtbot.waitUntil(lambda: "Cancelled" in window.transcript.toPlainText(), timeout=5000)
    assert "Allow once" not in links(window.transcript) and host.calls == []
    ask(qtbot, window, "Try again")
    allow = window.actions_by_name["allow_tool"]  # Chat → Allow tool call
    assert allow.shortcut().toString() == "Ctrl+Shift+A"
    allow.trigger()
    settled(qtbot, window)
    assert host.calls == [("add", {"a": 2, "b": 3})]


def test_stop_while_the_tools_are_listed_ends_the_reply_at_once(
    qtbot: QtBot, window: MainWindow, fake: FakeEngine, host: FakeMcpHost
) -> None:
    host.listing.clear()  # the servers are still starting
    qtbot.keyClicks(window.chat_input, "What is 2 + 3?")
    qtbot.keyClick(window.chat_input, Qt.Key.Key_Return)
    assert window.busy
    with qtbot.waitSignal(window.replyEnded, timeout=1000) as ended:
        window.stop()
    assert ended.args == ["cancelled"] and not window.busy
    host.listing.set()  # the late list changes nothing
    qtbot.wait(100)
    assert fake.requests == [] and not window.busy
    assert [m.role for m in window.conversation.messages] == ["user", "assistant"]


def test_a_call_being_written_shows_its_progress(
    qtbot: QtBot, window: MainWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the status bar said "writing the reply…" and nothing more while a call was
    written (a small model forced to call wrote one for 15 minutes); now the call's
    tokens and characters count up, from the engine's ``CallProgress`` events."""
    seen: list[str] = []
    label = window.status_speed
    set_text = label.setText
    monkeypatch.setattr(label, "setText", lambda text: (seen.append(text), set_text(text)))
    ask(qtbot, window)
    progress = [t for t in seen if t.startswith("writing a tool call…")]
    assert progress and progress[0].startswith("writing a tool call… 1 token, 16 characters")
    assert call_progress_text(2, 1, 0.0) == "writing a tool call… 2 tokens, 1 character"
    assert call_progress_text(3000, 12000, 10.0).endswith(
        "3,000 tokens, 12,000 characters · 300.0 tok/s"
    )


def test_a_chat_with_a_call_compacts_with_its_tools_described(
    qtbot: QtBot, window: MainWindow, fake: FakeEngine, host: FakeMcpHost
) -> None:
    """The summary of a chat offered tools is asked with them, none callable (the cache
    was read with them described), over the call and its result."""
    ask(qtbot, window)
    click(window.transcript, "Allow once")
    settled(qtbot, window)
    fake.tool_calls = ()
    for i in range(3):
        with qtbot.waitSignal(window.replyEnded, timeout=10_000):
            qtbot.keyClicks(window.chat_input, f"And port {i}?")
            qtbot.keyClick(window.chat_input, Qt.Key.Key_Return)
    offered = fake.tools[-1]
    assert offered is not None and offered.choice == "auto"
    fake.reply = "We added 2 and 3 with the add tool: 5."
    with qtbot.waitSignal(window.replyEnded, timeout=10_000):
        assert window.session.compact(window.sampling_panel.params()) == ""
    described = fake.tools[-1]
    assert described is not None and described.choice == "none"
    assert described.tools == offered.tools
    asked = fake.requests[-1]
    assert [m.role for m in asked[:4]] == ["user", "assistant", "tool", "assistant"]
    assert window.conversation.active_summary() is not None
