"""Controls a new user met at 1366x768 (issue 40): the version arrows were 5 px targets,
"Think: auto" was clipped, Ctrl+F did nothing, and the Models window had no Close."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QTextCursor
from PySide6.QtWidgets import (
    QApplication,
    QDialogButtonBox,
    QSplitter,
    QStyle,
    QStyleOptionToolButton,
    QToolButton,
)
from pytestqt.qtbot import QtBot

from app.chat.conversation import Message
from app.config.setting_records import SamplingParams
from tests.fakes.window import LAPTOP, WindowFactory, hub_services, settle
from ui.chat.transcript import TranscriptView
from ui.window.main_window import MainWindow

MIN_TARGET_PX = 20
CTRL = Qt.KeyboardModifier.ControlModifier


def anchor_spans(view: TranscriptView, action: str) -> list[tuple[int, int]]:
    """(first, last + 1) document positions of each link to ``action``."""
    spans: list[tuple[int, int]] = []
    block = view.document().begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            frag = it.fragment()
            if f"/{action}/" in frag.charFormat().anchorHref():
                start, end = frag.position(), frag.position() + frag.length()
                if spans and spans[-1][1] == start:
                    start = spans.pop()[0]
                spans.append((start, end))
            it += 1
        block = block.next()
    return spans


def width_px(view: TranscriptView, span: tuple[int, int]) -> int:
    """How wide the laid-out text between two positions is (one line)."""
    start, end = QTextCursor(view.document()), QTextCursor(view.document())
    start.setPosition(span[0])
    end.setPosition(span[1])
    left, right = view.cursorRect(start), view.cursorRect(end)
    assert left.top() == right.top(), "the link wraps"
    return right.left() - left.left()


def versions_view(qtbot: QtBot) -> TranscriptView:
    view = TranscriptView()
    qtbot.addWidget(view)
    view.resize(700, 400)
    view.show()
    qtbot.waitExposed(view)
    messages = [Message("user", "Hi"), Message("assistant", "Hello"), Message("user", "More")]
    view.show_messages(messages, [(1, 1), (2, 3), (1, 1)])
    return view


def test_version_arrows_are_targets_with_tooltips(qtbot: QtBot) -> None:
    view = versions_view(qtbot)
    assert "2/3" in view.toPlainText()
    for action, tip in (("prev-version", "Previous version"), ("next-version", "Next version")):
        spans = anchor_spans(view, action)
        assert len(spans) == 1, action
        assert width_px(view, spans[0]) >= MIN_TARGET_PX, action
        inside = QTextCursor(view.document())
        inside.setPosition(spans[0][0] + 1)
        assert inside.charFormat().toolTip() == tip


def test_version_arrows_work_from_the_keyboard(qtbot: QtBot) -> None:
    view = versions_view(qtbot)
    view.setFocus()
    qtbot.waitUntil(view.hasFocus)
    asked: list[tuple[str, int]] = []
    view.actionRequested.connect(lambda action, index: asked.append((action, index)))
    for _ in range(20):  # Tab walks the links: Edit, Fork, Copy, then the arrows
        qtbot.keyClick(view, Qt.Key.Key_Tab)
        cursor = view.textCursor()
        here = QTextCursor(view.document())
        here.setPosition(cursor.selectionStart() + 1)
        if "/prev-version/" in here.charFormat().anchorHref():
            break
    else:
        pytest.fail("Tab never reached the Previous version arrow")
    qtbot.keyClick(view, Qt.Key.Key_Return)
    assert asked == [("prev-version", 1)]


@pytest.fixture()
def window(qtbot: QtBot, make_window: WindowFactory) -> MainWindow:
    """A fresh window at the laptop's size, with Hub services (never reaching the network)."""
    win = make_window(shown=False, loaded=False)
    win.services = hub_services(win.dirs)
    win.manager_action.setEnabled(True)
    win.show()
    qtbot.waitExposed(win)
    win.resize(*LAPTOP)
    settle()
    return win


def label_fits(button: QToolButton) -> bool:
    """The label, the menu arrow Qt draws at the right, and a little air, all fit."""
    opt = QStyleOptionToolButton()
    button.initStyleOption(opt)
    arrow = button.style().pixelMetric(QStyle.PixelMetric.PM_MenuButtonIndicator, opt, button)
    return button.width() >= button.fontMetrics().horizontalAdvance(button.text()) + arrow + 8


def test_think_and_attach_show_whole_at_1366x768(qtbot: QtBot, window: MainWindow) -> None:
    think = window.thinking.button
    attach = window.findChild(QToolButton, "attachButton")
    assert think.text() == "Think: auto" and attach is not None
    assert label_fits(think), (think.width(), think.text())
    assert label_fits(attach), (attach.width(), attach.text())
    think.show_params(SamplingParams(thinking="on", reasoning_effort="medium"))
    qtbot.waitUntil(lambda: label_fits(think), timeout=2000)  # the longest label too


def test_ctrl_f_focuses_the_sidebar_search(qtbot: QtBot, window: MainWindow) -> None:
    for start in (window.chat_input, window.transcript):
        start.setFocus()
        qtbot.waitUntil(start.hasFocus)
        qtbot.keyClick(start, Qt.Key.Key_F, CTRL)
        qtbot.waitUntil(window.sidebar.search.hasFocus, timeout=2000)
    # A sidebar dragged shut opens again, the typed search selected to be replaced.
    window.sidebar.search.setText("old words")
    splitter = window.sidebar.parentWidget()
    assert isinstance(splitter, QSplitter)
    splitter.setSizes([0, sum(splitter.sizes())])
    assert splitter.sizes()[0] == 0
    window.chat_input.setFocus()
    qtbot.waitUntil(window.chat_input.hasFocus)
    qtbot.keyClick(window.chat_input, Qt.Key.Key_F, CTRL)
    qtbot.waitUntil(window.sidebar.search.hasFocus, timeout=2000)
    assert splitter.sizes()[0] >= 200
    assert window.sidebar.search.selectedText() == "old words"


def test_the_models_window_closes_with_close_and_esc(qtbot: QtBot, window: MainWindow) -> None:
    manager = window.show_model_manager()
    assert manager is not None
    qtbot.waitExposed(manager)
    box = manager.findChild(QDialogButtonBox, "modelManagerButtons")
    assert box is not None
    close = box.button(QDialogButtonBox.StandardButton.Close)
    assert close is not None and close.isVisible()
    close.click()
    assert not manager.isVisible()
    assert window.show_model_manager() is manager and manager.isVisible()
    qtbot.waitExposed(manager)
    manager.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is manager, timeout=3000)
    manager.tabs.setCurrentIndex(0)
    manager.search_box.setFocus()  # Esc from the Hub search box
    qtbot.keyClick(manager.search_box, Qt.Key.Key_Escape)
    assert not manager.isVisible()
    assert window.isVisible()  # Esc closed the Models window, nothing else
