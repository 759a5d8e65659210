"""A 25 MB message, pasted or in a reopened transcript, never freezes the window (issue 40).

The transcript laid out the whole text (33 s for 25 MB), and the message box, a
``QPlainTextEdit``, laid out a pasted paragraph whole (an unbroken 400,000-character
line took 11 s). The bounds are checked on what is laid out (the documents' character
counts), not on wall time; the messages themselves stay whole.
"""

from __future__ import annotations

import re
import tracemalloc
from pathlib import Path
from unittest.mock import patch

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PySide6.QtCore import QMimeData, QUrl
from PySide6.QtWidgets import QApplication, QWidget
from pytestqt.qtbot import QtBot

from app.chat.conversation import TITLE_MAX, Conversation, Message
from app.chat.store import ConversationSummary
from app.config.setting_records import SamplingParams
from tests.fakes.engine import FakeEngine
from tests.fakes.window import WindowFactory
from tests.hypothesis_budget import examples
from tests.real_window import real_window
from ui.chat import long_text
from ui.chat.chat_pane import ChatPane
from ui.chat.conversation_list import ConversationList
from ui.chat.long_text import PASTE_CHARS, SHOWN_CHARS, LongTextViewer
from ui.chat.system_prompt_bar import SystemPromptBar
from ui.chat.transcript import UNANSWERED, TranscriptView
from ui.window.main_window import MainWindow

BIG = 25_000_000
# What a drawn message may add to its cut text: header, the "Show all" line, the
# break opportunities in unbroken runs (one per 500 characters).
SLACK = SHOWN_CHARS // 100 + 2_000


def big_texts() -> dict[str, str]:
    """25 MB three ways: many lines, one paragraph of words, one unbroken run."""
    return {
        "lines": (("word " * 15 + "\n") * (BIG // 76 + 1))[:BIG],
        "paragraph": ("word " * (BIG // 5))[:BIG],
        "unbroken": "x" * BIG,
    }


def paste(widget: ChatPane, text: str) -> None:
    data = QMimeData()
    data.setText(text)
    widget.chat_input.insertFromMimeData(data)


def drawn(view: TranscriptView) -> int:
    return view.document().characterCount()


def show_all_link(view: TranscriptView) -> QUrl:
    cursor = view.document().find("Show all (")
    assert not cursor.isNull()
    return QUrl(cursor.charFormat().anchorHref())


@pytest.mark.parametrize("kind", ["lines", "paragraph", "unbroken"])
def test_a_25_mb_message_is_drawn_in_part_and_kept_whole(qtbot: QtBot, kind: str) -> None:
    text = big_texts()[kind]
    view = TranscriptView()
    qtbot.addWidget(view)
    view.add_user_message(text, 0)
    assert drawn(view) <= SHOWN_CHARS + SLACK
    shown = view.toPlainText()
    assert "Show all (25.0 MB)…" in shown and f"{BIG - SHOWN_CHARS:,} more characters" in shown
    assert view.copy_message(0)
    assert len(QApplication.clipboard().text()) == BIG  # Copy copies all of it
    QApplication.clipboard().clear()
    # Reopened (or imported): the user's message and a reply just as long.
    view.show_messages([Message("user", text), Message("assistant", text)])
    assert drawn(view) <= 2 * (SHOWN_CHARS + SLACK)
    assert view.toPlainText().count("Show all (25.0 MB)…") == 2
    view.anchorClicked.emit(show_all_link(view))  # the user's message's link
    viewer = view.findChild(LongTextViewer)
    assert viewer is not None and viewer.isVisible() and viewer.text == text
    assert viewer.view.document().characterCount() <= SHOWN_CHARS + SLACK


def test_a_25_mb_thinking_is_drawn_in_part_and_copied_whole(qtbot: QtBot) -> None:
    text = big_texts()["paragraph"]
    view = TranscriptView()
    qtbot.addWidget(view)
    # All thinking and no answer: the thinking opens by itself.
    view.show_messages([Message("user", "Hi"), Message("assistant", "", reasoning=text)])
    assert view.thinking_open(1) and drawn(view) <= SHOWN_CHARS + SLACK
    assert f"{BIG - SHOWN_CHARS:,} more characters (25.0 MB in all)" in view.toPlainText()
    view.toggle_thinking(1)
    view.toggle_thinking(1)  # folded and opened again: still in part
    assert view.thinking_open(1) and drawn(view) <= SHOWN_CHARS + SLACK
    assert view.copy_thinking(1)
    assert len(QApplication.clipboard().text()) == BIG
    QApplication.clipboard().clear()


def test_the_viewer_lays_out_a_part_at_a_time_and_saves_it_whole(
    qtbot: QtBot, tmp_path: Path
) -> None:
    text = big_texts()["unbroken"][: 2 * SHOWN_CHARS + 7] + "é\n"
    viewer = LongTextViewer(text, "Message 1")
    qtbot.addWidget(viewer)
    assert viewer.parts == 3 and "Part 1 of 3" in viewer.where.text()
    assert viewer.view.document().characterCount() <= SHOWN_CHARS + SLACK
    assert not viewer.prev_button.isEnabled()
    viewer.next_button.click()
    viewer.next_button.click()
    assert viewer.view.toPlainText() == "xxxxxxxé\n" and not viewer.next_button.isEnabled()
    target = tmp_path / "message.txt"
    assert viewer.save(target)
    assert target.read_text(encoding="utf-8") == text


@settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    extra=st.integers(-3, 3),
    head=st.text(max_size=40),
    fill=st.sampled_from(["x", " ", "\n", "<b>&amp;", "\u200b", "é", "# ", "```\n"]),
)
def test_messages_around_the_limit_are_shown_or_cut_never_lost(
    qtbot: QtBot, extra: int, head: str, fill: str
) -> None:
    limit = 2_000  # the same code at a small limit: many cases, quickly
    text = head + fill * ((limit + extra - len(head)) // len(fill) + 1)
    view = TranscriptView()
    qtbot.addWidget(view)
    with patch.object(long_text, "SHOWN_CHARS", limit):
        view.show_messages([Message("user", text), Message("assistant", text)])
    assert drawn(view) <= 2 * (limit + 1_000)
    cut = len(text) > limit
    drawn_replies = 1 + bool(text.strip())  # a blank reply says "(no reply)"
    assert view.toPlainText().count("Show all (") == cut * drawn_replies
    assert view._texts == {0: text, 1: text}  # Copy and Show all have the whole text


@pytest.fixture()
def window(make_window: WindowFactory) -> MainWindow:
    return make_window(FakeEngine(reply="Read."))


def test_a_25_mb_paste_is_held_beside_the_message_box_and_sent_whole(
    qtbot: QtBot, window: MainWindow
) -> None:
    text = big_texts()["unbroken"]  # the worst for the box: quadratic in Qt's line layout
    chat = window.chat
    qtbot.keyClicks(window.chat_input, "Summarize:")
    paste(chat, text)
    assert window.chat_input.toPlainText() == "Summarize:"  # the box laid out none of it
    assert chat.held.isVisible() and "25.0 MB" in chat.held.label.text()
    assert window.send_button.isEnabled()
    with qtbot.waitSignal(window.replyEnded, timeout=20_000):
        window.send_button.click()
    sent = window.conversation.messages[0].content
    assert sent == "Summarize:\n\n" + text.strip()
    assert not chat.held.isVisible() and not chat.has_text()
    assert drawn(window.transcript) <= 2 * (SHOWN_CHARS + SLACK)
    # Editing it puts it back beside the box, whole; cancelling lets it go.
    window.edit_message(0)
    assert chat.held.text == sent and window.chat_input.toPlainText() == ""
    window.stop()
    assert not chat.held.isVisible() and not chat.has_text()


def test_a_paste_the_box_can_take_goes_in_the_box(qtbot: QtBot) -> None:
    chat = ChatPane()
    qtbot.addWidget(chat)
    paste(chat, big_texts()["paragraph"])  # one 25 MB paragraph took the box 30 s
    assert chat.chat_input.document().characterCount() == 1 and chat.held.isVisibleTo(chat)
    assert chat.text() == big_texts()["paragraph"].strip()
    chat.clear_text()
    paste(chat, "y" * PASTE_CHARS)
    assert chat.chat_input.toPlainText() == "y" * PASTE_CHARS and not chat.held.text
    chat.clear_text()
    paste(chat, " \n" * PASTE_CHARS)  # nothing to send: nothing held
    assert not chat.held.text and not chat.has_text()
    paste(chat, "a" * (PASTE_CHARS + 1))
    paste(chat, "b" * (PASTE_CHARS + 1))  # a second long paste is kept after the first
    assert chat.text() == "a" * (PASTE_CHARS + 1) + "\n\n" + "b" * (PASTE_CHARS + 1)
    viewer = chat.held.view()
    qtbot.addWidget(viewer)
    assert viewer.text == chat.held.text
    chat.held.findChild(QWidget, "heldTextRemove").click()
    assert not chat.has_text()


def test_a_long_paste_reaches_the_real_model_whole(
    qtbot: QtBot, tmp_path: Path, model_path: Path
) -> None:
    """The real engine gets all of it and refuses it at once (a bound on its tokens from
    all of its bytes: tokenizing 25 MB took 75 s), while the window drew only the start;
    the message stays, not answered, and edited short it is answered."""
    text = big_texts()["paragraph"]
    with real_window(qtbot, tmp_path, model_path, SamplingParams.greedy(8)) as win:
        paste(win.chat, text)
        assert win.chat.held.isVisible() and win.chat_input.toPlainText() == ""
        with qtbot.waitSignal(win.replyEnded, timeout=60_000) as ended:
            win.send_button.click()
        assert ended.args == ["failed"]
        assert [m.content for m in win.conversation.messages] == [text.strip()]
        shown = win.transcript.toPlainText()
        assert "Show all (25.0 MB)…" in shown and UNANSWERED in shown
        needs = re.search(r"needs at least ([\d,]+) tokens", shown)
        assert needs is not None  # every byte counted (gemma 3's longest token: 48 bytes)
        assert int(needs.group(1).replace(",", "")) > BIG // 48
        assert drawn(win.transcript) <= SHOWN_CHARS + SLACK + 1_000
        win.edit_message(0)
        assert win.chat.held.text == text.strip()
        win.chat.held.clear()
        qtbot.keyClicks(win.chat_input, "Hello")
        with qtbot.waitSignal(win.replyEnded, timeout=60_000) as ended:
            win.send_button.click()
        assert ended.args == ["finished"]
        assert [m.role for m in win.conversation.messages] == ["user", "assistant"]
        assert win.conversation.messages[0].content == "Hello"


@settings(max_examples=examples(200), deadline=None)
@given(text=st.text(st.sampled_from("ab \n\t\u00a0\u2003\x1c"), max_size=400))
def test_a_title_is_the_first_words_of_the_first_message(text: str) -> None:
    conv = Conversation()
    conv.messages = [Message("user", text)]
    conv.auto_title()
    line = " ".join(text.split())  # the title, as it always was
    assert conv.title == (((line[:59] + "…") if len(line) > 60 else line) or "New chat")


def test_a_25_mb_message_is_titled_from_its_first_words_only() -> None:
    """Splitting all of a 25 MB message to title it paused the window for 0.55 s at each
    save (1.1 s for a send that failed); now it reads words only as far as a title needs."""
    conv = Conversation()
    for big in big_texts().values():
        conv.messages = [Message("user", " \n" * 1000 + big)]
        tracemalloc.start()
        conv.auto_title()
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 100_000 and len(conv.title) == 60  # split() made 5 million words


def test_a_long_system_prompt_is_held_beside_its_field(qtbot: QtBot) -> None:
    """An unbroken 400,000-character prompt took the field 4.7 s to lay out when the bar
    opened; it is held whole beside the field, as a long paste is beside the message box."""
    prompt = "x" * 400_000
    bar = SystemPromptBar()
    qtbot.addWidget(bar)
    edited: list[str] = []
    bar.edited.connect(edited.append)
    bar.show_prompt(prompt)
    bar.expand()
    assert bar.editor.document().characterCount() == 1  # the field laid out none of it
    assert bar.held.isVisibleTo(bar) and bar.held.label.text().startswith("System prompt: 400.0 kB")
    assert bar.text() == prompt and not edited  # shown, not changed
    assert len(bar.summary.text()) <= 90 and len(bar.summary.toolTip()) <= 2_000
    qtbot.keyClicks(bar.editor, "Be brief.")
    assert edited[-1] == "Be brief.\n\n" + prompt  # typed text goes first
    data = QMimeData()
    data.setText("y" * (PASTE_CHARS + 1))
    bar.editor.insertFromMimeData(data)  # a long paste is held too, after the rest
    assert edited[-1] == f"Be brief.\n\n{prompt}\n\n{'y' * (PASTE_CHARS + 1)}"
    assert bar.editor.toPlainText() == "Be brief."
    viewer = bar.held.view()
    qtbot.addWidget(viewer)
    assert viewer.view.document().characterCount() <= SHOWN_CHARS + SLACK
    assert viewer.windowTitle().startswith("System prompt (")
    bar.held.findChild(QWidget, "heldTextRemove").click()
    assert edited[-1] == "Be brief." and not bar.held.isVisibleTo(bar)
    bar.show_prompt("z" * PASTE_CHARS)  # one the field can take goes in the field
    assert bar.editor.toPlainText() == "z" * PASTE_CHARS and not bar.held.text


def test_a_saved_chat_with_a_long_system_prompt_opens_and_sends_it_whole(
    qtbot: QtBot, make_window: WindowFactory
) -> None:
    """A saved or imported chat's system prompt has no length limit: it is kept whole
    (the file's 64 MB bound it), shown held, and sent whole."""
    prompt = "Rules: " + "x" * 2_000_000
    fake = FakeEngine(reply="Read.")
    window = make_window(fake)
    conv = Conversation(system_prompt=prompt)
    conv.messages = [Message("user", "Hi"), Message("assistant", "Hello.")]
    window.store.save(conv)
    with qtbot.waitSignal(window.conversationOpened, timeout=10_000):
        window.open_conversation(conv.id)
    bar = window.prompt_controls.bar
    bar.expand()
    assert bar.editor.document().characterCount() == 1 and bar.text() == prompt
    assert bar.summary.text().startswith("Rules: xxx") and len(bar.summary.text()) <= 90
    qtbot.keyClicks(window.chat_input, "Again")
    with qtbot.waitSignal(window.replyEnded, timeout=20_000):
        window.send_button.click()
    assert fake.requests[-1][0].content == prompt
    assert window.store.load(conv.id).system_prompt == prompt


def test_a_long_unbroken_title_ends_in_an_ellipsis_in_the_sidebar(qtbot: QtBot) -> None:
    """A title with a word wider than the sidebar made every row that wide, and put a
    horizontal scroll bar under the list; it is elided now, whole in its tooltip."""
    sidebar = ConversationList()
    qtbot.addWidget(sidebar)
    sidebar.resize(240, 400)
    sidebar.show()
    qtbot.waitExposed(sidebar)

    def row(conv_id: str, title: str) -> ConversationSummary:
        return ConversationSummary(conv_id, title, 0.0, "m" * 300, 12, 2, 0)

    long = "x" * TITLE_MAX
    sidebar.set_conversations([row("a", "Hello"), row("b", long), row("c", "y " * 99)], "a", 0, 1)
    scroll = sidebar.list.horizontalScrollBar()
    assert scroll.maximum() == 0 and not scroll.isVisible()
    item = sidebar.item_for("b")
    assert item is not None and item.toolTip() == long
    assert item.text().startswith(long)  # elided when drawn: the item keeps all of it
