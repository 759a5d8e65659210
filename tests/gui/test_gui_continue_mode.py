"""The window in continue-the-text mode, as a new user meets it (issue 40, item 14): the
message box's hint and the message headers say the mode after a restart too, and the
Tools page says that tools are not used in it (and nothing is listed or started for
them). The fake engine stands in for the model: nothing here depends on what it writes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QApplication, QWidget
from pytestqt.qtbot import QtBot

from app.chat.store import ConversationStore
from app.config.paths import DataDirs, data_dirs
from app.config.settings import AppSettings
from app.engine.templates.builtin import plain_template
from tests.fakes.engine import FakeEngine
from tests.fakes.mcp import FakeMcpHost
from tests.gui.test_gui_mcp import FILES
from ui.chat.prompt_controls import CHAT_INPUT_HINT, COMPLETION_INPUT_HINT
from ui.engine.worker import EngineClient
from ui.main import open_window
from ui.tools import mcp_control
from ui.window.main_window import MainWindow

LOAD_NOTE = "A note the load left in the chat."


def shown_pixels(widget: QWidget) -> QImage:
    """What the window's backing store holds where ``widget`` is: what the screen shows."""
    win = widget.window()
    top_left = widget.mapTo(win, widget.rect().topLeft())
    screen = win.screen()
    grabbed = screen.grabWindow(
        win.winId(), top_left.x(), top_left.y(), widget.width(), widget.height()
    )
    return grabbed.toImage().convertToFormat(QImage.Format.Format_RGB32)


def drawn_now(widget: QWidget) -> QImage:
    """``widget`` painted afresh, as it should look."""
    return widget.grab().toImage().convertToFormat(QImage.Format.Format_RGB32)


def settle(qtbot: QtBot) -> None:
    for _ in range(3):
        QApplication.sendPostedEvents()
        QApplication.processEvents()
    qtbot.wait(50)


def base_fake() -> FakeEngine:
    fake = FakeEngine(reply="and then the rain came.")
    fake.base_model = True  # like the embedded default: continue-the-text mode by default
    return fake


def start(
    qtbot: QtBot, dirs: DataDirs, fake: FakeEngine, model: Path
) -> tuple[MainWindow, Callable[[], None]]:
    """A start as ``ui.main`` makes it: settings from the data folder, the last chat shown
    before the model is loaded; returns the window and what loads the model."""
    settings = AppSettings.load_from(dirs.settings_file)

    def make_client(store: ConversationStore) -> EngineClient:
        return EngineClient(dirs.models, engine_factory=lambda: fake, store=store)

    win = open_window(dirs, settings, [], make_client)
    qtbot.addWidget(win)
    qtbot.waitExposed(win)
    win.resize(1366, 768)  # a laptop's screen: the offscreen one is smaller

    def load() -> None:
        with qtbot.waitSignal(win.modelReady, timeout=5000):
            win.load_model(model)
        qtbot.waitUntil(lambda: "plain text" in win.status_model.text(), timeout=5000)

    return win, load


def close(qtbot: QtBot, win: MainWindow) -> None:
    win.close()
    qtbot.waitUntil(lambda: win.closed, timeout=15_000)


def test_after_a_restart_the_hint_and_headers_say_continue_the_text(
    qtbot: QtBot, tmp_path: Path
) -> None:
    """Before: the chat reopened at start kept "You"/"Assistant" (drawn before the mode
    was known), and the box kept showing the chat hint (Qt repaints a shown hint only
    when it appears or goes, not when its text changes)."""
    dirs = data_dirs(tmp_path / "data")
    model = tmp_path / "base.gguf"
    model.write_bytes(b"fake model")
    fake = base_fake()
    win, load = start(qtbot, dirs, fake, model)
    load()
    assert win.prompt_controls.completion
    with qtbot.waitSignal(win.replyEnded, timeout=10_000):
        win.chat_input.setPlainText("Once upon a time")
        win.send()
    first = win.transcript.toPlainText()
    assert "Your text" in first and "Continued by the model" in first
    close(qtbot, win)

    win, load = start(qtbot, dirs, base_fake(), model)  # the restart
    try:
        shown = win.transcript.toPlainText()
        assert "You " in shown and "Once upon a time" in shown  # drawn before the model
        assert win.chat_input.placeholderText() == CHAT_INPUT_HINT
        win.transcript.add_notice(LOAD_NOTE)  # what a load says meanwhile
        settle(qtbot)
        before = shown_pixels(win.chat_input.viewport())
        load()
        settle(qtbot)
        shown = win.transcript.toPlainText()
        assert "Your text" in shown and "Continued by the model" in shown, shown
        assert "You " not in shown and "Assistant" not in shown, shown
        assert LOAD_NOTE in shown  # named in place: the notes stay
        box = win.chat_input
        assert box.placeholderText() == COMPLETION_INPUT_HINT
        assert not box.toPlainText()
        now = shown_pixels(box.viewport())
        assert now != before, "the box still shows the chat hint"
        assert now == drawn_now(box.viewport())

        # Back to chat turns and to continue-the-text again: both follow, in place.
        win.prompt_controls.set_completion(False)
        settle(qtbot)
        assert "You " in win.transcript.toPlainText() and LOAD_NOTE in win.transcript.toPlainText()
        assert shown_pixels(box.viewport()) == drawn_now(box.viewport())
        assert box.placeholderText() == CHAT_INPUT_HINT
    finally:
        close(qtbot, win)


@pytest.fixture()
def fake_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeMcpHost:
    host = FakeMcpHost([FILES], tmp_path)
    monkeypatch.setattr(mcp_control, "HOST_FACTORY", lambda _d: host)
    return host


def test_tools_page_says_tools_are_not_used_in_continue_the_text_mode(
    qtbot: QtBot, tmp_path: Path, fake_host: FakeMcpHost
) -> None:
    """Before: the page said "Tools add ≈ N tokens to every prompt" while the engine
    offered no tool in this mode (and the chat started the servers for nothing)."""
    dirs = data_dirs(tmp_path / "data")
    dirs.root.mkdir(parents=True, exist_ok=True)
    (dirs.root / "mcp.json").write_text('{"mcpServers": {}}')
    model = tmp_path / "base.gguf"
    model.write_bytes(b"fake model")
    fake = base_fake()
    win, load = start(qtbot, dirs, fake, model)
    try:
        load()
        assert win.session.model is not None and win.session.model.continues_text
        assert win.session.model.template == plain_template().label
        page = win.mcp.show_page()
        qtbot.waitUntil(lambda: bool(page.boxes))
        total = page.total.text()
        assert "continue-the-text mode" in total and "chat mode" in total, total
        assert "tokens to every prompt" not in total
        assert not any(t.isVisible() for b in page.boxes.values() for t in b.tool_tokens.values())

        qtbot.waitUntil(lambda: fake_host.tools_asked >= 1)  # the page started the servers
        asked = fake_host.tools_asked
        with qtbot.waitSignal(win.replyEnded, timeout=10_000):
            win.chat_input.setPlainText("Once upon a time")
            win.send()
        assert fake_host.tools_asked == asked  # no server started or listed for the reply
        assert fake.tools[-1] is None

        # Chat turns: the tools are offered, and their cost is said again.
        win.prompt_controls.set_completion(False)
        qtbot.waitUntil(lambda: "tokens to every prompt" in page.total.text(), timeout=5000)
        qtbot.waitUntil(  # each tool's own cost: drawn once its count has come back
            lambda: all(t.isVisible() for b in page.boxes.values() for t in b.tool_tokens.values()),
            timeout=5000,
        )
        with qtbot.waitSignal(win.replyEnded, timeout=10_000):
            win.chat_input.setPlainText("Hello")
            win.send()
        assert fake_host.tools_asked > asked and fake.tools[-1] is not None
    finally:
        close(qtbot, win)


def test_a_loads_notes_are_said_once_each_on_a_line_of_their_own(
    qtbot: QtBot, tmp_path: Path
) -> None:
    """Before: on a machine with a native path off, a base model's first start showed the
    guard's note twice, run together ("…check it again.Repacked weights…"): once for the
    load and again when continue-the-text mode was applied, in the same paragraph."""
    dirs = data_dirs(tmp_path / "data")
    model = tmp_path / "base.gguf"
    model.write_bytes(b"fake model")
    fake = base_fake()
    off = "Repacked weights are off on this computer: a test crashed. Check it again."
    fake.load_notes = (off, LOAD_NOTE)
    win, load = start(qtbot, dirs, fake, model)
    try:
        load()
        settle(qtbot)
        lines = win.transcript.toPlainText().splitlines()
        assert lines.count(off) == 1 and lines.count(LOAD_NOTE) == 1, lines
    finally:
        close(qtbot, win)
