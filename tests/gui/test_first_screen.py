"""The chat is the biggest thing on the first screen (issue 27): at 1366x768 on a fresh
data dir, with the welcome card, the system prompt bar and the base-model notice all
showing, the transcript is the largest area in the window and at least half its height,
before the first model loads, once it has, and after the first reply. A screenshot of
each moment is saved under the test's tmp dir (``grab()``) for a person to look at.

The fake engine stands in for the model (the layout does not depend on it); the Hub
services are real but never reach the network (the library scan is local).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image
from PySide6.QtCore import QRect, Qt
from PySide6.QtWidgets import QDockWidget, QPushButton, QWidget
from pytestqt.qtbot import QtBot

from app.config.paths import DataDirs, data_dirs
from app.config.settings import AppSettings
from app.models.recommended import default_model_name
from tests.fakes.engine import VISION_CAPABILITIES, FakeEngine
from tests.fakes.window import LAPTOP, WindowFactory, settle
from ui.models.onboarding import WelcomeCard
from ui.window.main_window import MainWindow

MIN_SHARE = 0.5  # of the window's height, for the transcript


@pytest.fixture()
def dirs(tmp_path: Path) -> DataDirs:
    return data_dirs(tmp_path / "data")


@pytest.fixture()
def window(make_window: WindowFactory, dirs: DataDirs) -> tuple[MainWindow, FakeEngine]:
    """A first start: fresh data dir, default settings, Hub services, a base model to come."""
    fake = FakeEngine()
    fake.base_model = True  # like the embedded default: the text-completion notice shows
    settings = AppSettings.load_from(dirs.settings_file)
    win = make_window(fake, dirs=dirs, settings=settings, services=True, size=LAPTOP, loaded=False)
    return win, fake


def visible_parts(win: MainWindow) -> dict[str, QRect]:
    """What takes room in the window, each in window coordinates: the docks, the
    sidebar, the message box and whatever sits above the transcript."""
    parts: dict[str, QWidget] = {
        "sidebar": win.sidebar,
        "message box": win.chat_input,
        "system prompt bar": win.prompt_controls.bar,
        "base-model notice": win.prompt_controls.notice,
    }
    for dock in win.findChildren(QDockWidget):
        parts[dock.objectName()] = dock
    card = win.onboarding.card
    if card is not None:
        parts["welcome card"] = card
    return {
        name: QRect(w.mapTo(win, w.rect().topLeft()), w.size())
        for name, w in parts.items()
        if w.isVisible()
    }


def area(r: QRect) -> int:
    return r.width() * r.height()


def check_transcript_dominates(win: MainWindow, shot: Path) -> QRect:
    """The transcript is the largest visible area, at least ``MIN_SHARE`` of the window's
    height, and the window still fits the laptop's screen; saves a screenshot."""
    settle()
    assert win.grab().save(str(shot)), shot
    assert (win.width(), win.height()) == LAPTOP  # nothing forced the window taller
    transcript = win.transcript
    assert transcript.isVisible()
    mine = QRect(transcript.mapTo(win, transcript.rect().topLeft()), transcript.size())
    assert mine.height() >= MIN_SHARE * win.height(), (mine, win.size())
    for name, rect in visible_parts(win).items():
        assert area(mine) > area(rect), (name, rect, mine)
    return mine


def load_the_default_model(qtbot: QtBot, win: MainWindow, dirs: DataDirs) -> WelcomeCard:
    """Load the embedded default model (by its file name) and wait for the welcome card."""
    model = dirs.models / default_model_name()
    model.parent.mkdir(parents=True, exist_ok=True)
    model.write_bytes(b"fake model")
    with qtbot.waitSignal(win.modelReady, timeout=5000):
        win.load_model(model)
    qtbot.waitUntil(lambda: win.onboarding.card is not None, timeout=10_000)
    card = win.onboarding.card
    assert card is not None
    return card


def test_the_transcript_is_the_largest_area_at_1366x768(
    qtbot: QtBot, window: tuple[MainWindow, FakeEngine], dirs: DataDirs, tmp_path: Path
) -> None:
    win, _fake = window
    assert not win.perf_panel.isVisible()  # the charts start closed (View → Performance)
    assert win.perf_panel.toggleViewAction().isEnabled()
    check_transcript_dominates(win, tmp_path / "1-no-model.png")

    # The embedded default model (by its file name): the welcome card and the notice come.
    card = load_the_default_model(qtbot, win, dirs)
    notice = win.prompt_controls.notice
    qtbot.waitUntil(notice.isVisible, timeout=5000)
    settle()
    assert card.isVisible()
    assert notice.height() <= 2.5 * win.chat_input.fontMetrics().height() + 16  # one line
    transcript = check_transcript_dominates(win, tmp_path / "2-welcome.png")
    # The card sits in the empty transcript, whole, rather than pushing it down.
    placed = QRect(card.mapTo(win, card.rect().topLeft()), card.size())
    assert transcript.contains(placed), (placed, transcript)
    assert card.height() >= card.sizeHint().height() or card.height() >= placed.height()

    # The first message: the card steps aside for the conversation.
    qtbot.keyClicks(win.chat_input, "Once upon a time")
    with qtbot.waitSignal(win.replyEnded, timeout=5000):
        qtbot.keyClick(win.chat_input, Qt.Key.Key_Return)
    assert win.conversation.messages
    assert not card.isVisible()
    check_transcript_dominates(win, tmp_path / "3-first-reply.png")

    # A new, empty chat brings the card back (the default model is still the only one).
    win.new_chat()
    qtbot.waitUntil(lambda: not win.conversation.messages, timeout=5000)
    settle()
    assert card.isVisible()
    check_transcript_dominates(win, tmp_path / "4-new-chat.png")
    for name in ("1-no-model", "2-welcome", "3-first-reply", "4-new-chat"):
        assert (tmp_path / f"{name}.png").stat().st_size > 0


def check_card_whole(win: MainWindow, card: WelcomeCard) -> None:
    """The card lies inside the transcript's visible area, and shows all of itself or
    scrolls to it (nothing of it is cut off)."""
    settle()
    view = win.transcript.viewport().geometry()  # the card is the transcript's child
    assert card.isVisible() and view.contains(card.geometry()), (card.geometry(), view)
    hidden = card.full_height(card.width()) - card.height()
    assert hidden <= 0 or card.scroll_area.verticalScrollBar().maximum() >= hidden, hidden


def test_the_welcome_card_stays_whole_when_chips_and_documents_take_room(
    qtbot: QtBot, window: tuple[MainWindow, FakeEngine], dirs: DataDirs, tmp_path: Path
) -> None:
    """Before: the card was placed for the transcript's old size (its resize comes before
    its viewport has the new one), so an image chip or the documents bar cut its foot
    off; and a transcript shorter than the card cut it too. Now it is placed for the
    room there is, and scrolls where it is taller than that room."""
    win, fake = window
    fake.caps = VISION_CAPABILITIES
    card = load_the_default_model(qtbot, win, dirs)
    check_card_whole(win, card)
    picture = tmp_path / "picture.png"
    Image.new("RGB", (64, 48), (200, 30, 30)).save(picture)
    win.images.add_files([picture])
    qtbot.waitUntil(lambda: len(win.images.chips) == 1, timeout=10_000)
    check_card_whole(win, card)
    notes = tmp_path / "notes.txt"
    notes.write_text("Notes for the meeting. " * 40, encoding="utf-8")
    win.documents.add_paths([notes])
    qtbot.waitUntil(win.documents.bar.isVisible, timeout=10_000)
    check_card_whole(win, card)
    assert (win.width(), win.height()) == LAPTOP  # nothing forced the window taller
    assert win.grab().save(str(tmp_path / "welcome-with-attachments.png"))

    # Less room than the card needs: it scrolls, down to its last button.
    win.resize(LAPTOP[0], 620)
    check_card_whole(win, card)
    assert card.scroll_area.verticalScrollBar().maximum() > 0
    manager = card.findChild(QPushButton, "welcomeManager")
    assert manager is not None
    card.scroll_area.ensureWidgetVisible(manager)
    settle()
    assert not manager.visibleRegion().isEmpty()
    assert win.height() == 620


def test_charts_open_under_the_chat_from_the_view_menu(
    qtbot: QtBot, window: tuple[MainWindow, FakeEngine]
) -> None:
    """Closed at first, the charts are one shortcut away and open beneath the chat."""
    win, _fake = window
    win.perf_panel.toggleViewAction().trigger()
    settle()
    assert win.perf_panel.isVisible()
    assert win.dockWidgetArea(win.perf_panel) == Qt.DockWidgetArea.BottomDockWidgetArea
    assert win.transcript.height() > 0
