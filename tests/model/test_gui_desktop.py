"""Desktop habits: every README shortcut wherever focus is, drag and drop of .gguf files,
the recent-models menu, light/dark switching, chart axes and accessible names.

Widget behaviour runs on the fake engine (fast); what involves the model (Ctrl+N and
Esc mid-reply, a dropped model loading) runs on the real one.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QGuiApplication, QKeySequence
from PySide6.QtWidgets import QApplication, QFileDialog, QMessageBox, QWidget
from pytestqt.qtbot import QtBot

from app.chat.store import ConversationStore
from app.config.paths import DataDirs, data_dirs
from app.config.setting_records import SamplingParams
from app.config.settings import AppSettings
from app.engine.metrics import MessageMetrics
from tests.conftest import TEST_LOAD
from tests.fakes.engine import FakeEngine
from ui.common import accessibility, theme
from ui.engine.worker import EngineClient
from ui.window.main_window import MainWindow

CTRL = Qt.KeyboardModifier.ControlModifier
SHIFT = Qt.KeyboardModifier.ShiftModifier
LONG_REPLY = " ".join(f"w{i}" for i in range(400))


def desktop_window(
    qtbot: QtBot, dirs: DataDirs, engine: FakeEngine | None, settings: AppSettings | None = None
) -> MainWindow:
    """A shown, active window on ``dirs``: the fake ``engine``, or the real one (None)."""
    store = ConversationStore(dirs.root)
    if engine is None:
        client = EngineClient(dirs.models, store=store)
    else:
        fake = engine
        client = EngineClient(dirs.models, engine_factory=lambda: fake, store=store)
    win = MainWindow(client, settings or AppSettings(load=TEST_LOAD), dirs, store)
    qtbot.addWidget(win)
    win.show()
    win.activateWindow()
    qtbot.waitUntil(win.isActiveWindow)
    return win


def load(qtbot: QtBot, win: MainWindow, path: Path, timeout: int = 5000) -> None:
    with qtbot.waitSignal(win.modelReady, timeout=timeout):
        win.load_model(path)


def fake_model(tmp_path: Path, name: str = "model.gguf") -> Path:
    path = tmp_path / name
    path.write_bytes(b"fake model")  # the snapshot header fingerprints it
    return path


@pytest.fixture()
def fake() -> FakeEngine:
    return FakeEngine(reply=LONG_REPLY, delay=0.002)


@pytest.fixture()
def window(qtbot: QtBot, tmp_path: Path, fake: FakeEngine) -> Iterator[MainWindow]:
    win = desktop_window(qtbot, data_dirs(tmp_path / "data"), fake)
    load(qtbot, win, fake_model(tmp_path))
    yield win
    win.close()  # put off while a reply settles (at most 5 s)
    qtbot.waitUntil(lambda: win.closed, timeout=15_000)
    assert not win.client.engine_thread.isRunning()


def press(
    qtbot: QtBot, key: Qt.Key, modifier: Qt.KeyboardModifier = Qt.KeyboardModifier.NoModifier
) -> None:
    """A key press as a person makes it: to whichever widget has the focus."""
    target = QApplication.focusWidget()
    assert target is not None, "nothing has the keyboard focus"
    qtbot.keyClick(target, key, modifier)


def focus(qtbot: QtBot, widget: QWidget) -> None:
    widget.setFocus()
    qtbot.waitUntil(lambda: QApplication.focusWidget() is widget)


def chat_once(qtbot: QtBot, win: MainWindow, text: str = "Hello") -> None:
    with qtbot.waitSignal(win.replyEnded, timeout=10_000):
        win.session.send(text, SamplingParams.greedy(8))


# -- keyboard -----------------------------------------------------------------------------


def readme_shortcuts() -> dict[str, str]:
    """The README's shortcut table: keys -> action."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    table = readme.split("## Keyboard shortcuts", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| ([^|]+?) \| ([^|]+?) \|$", table, re.MULTILINE)
    return {keys: what for keys, what in rows if keys not in ("Keys", "---")}


def test_every_readme_shortcut_exists_once(window: MainWindow) -> None:
    shortcuts = readme_shortcuts()
    assert len(shortcuts) >= 12
    window_keys: dict[str, list[str]] = {}
    for action in window.actions():
        for seq in action.shortcuts():
            window_keys.setdefault(seq.toString(), []).append(action.text())
    for keys in shortcuts:
        if keys in ("Enter", "Shift+Enter"):
            continue  # the message box's own keys
        wanted = QKeySequence(keys.replace("Esc", "Escape")).toString()
        assert window_keys.get(wanted), f"README promises {keys}, no action has it"
    ambiguous = {k: v for k, v in window_keys.items() if len(v) > 1}
    assert not ambiguous, f"one key, several actions (Qt then runs none): {ambiguous}"
    toggles = {a.text(): a.shortcut().toString() for a in window.view_menu.actions()}
    assert toggles["LoRA adapters"] == "Ctrl+Shift+L"
    assert toggles["Sampling"] == "Ctrl+Shift+S" and toggles["Performance"] == "Ctrl+Shift+P"


def test_shortcuts_from_the_message_box(
    qtbot: QtBot, window: MainWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each README shortcut, pressed with the focus in the message box."""
    focus(qtbot, window.chat_input)
    qtbot.keyClicks(window.chat_input, "two")
    press(qtbot, Qt.Key.Key_Return, SHIFT)  # a new line, not a send
    qtbot.keyClicks(window.chat_input, "lines")
    assert window.chat_input.toPlainText() == "two\nlines" and not window.busy
    with qtbot.waitSignal(window.replyEnded, timeout=10_000) as ended:
        press(qtbot, Qt.Key.Key_Return)  # Enter sends
    assert ended.args == ["finished"] and window.conversation.messages[0].content == "two\nlines"

    with qtbot.waitSignal(window.replyEnded, timeout=10_000):
        press(qtbot, Qt.Key.Key_R, CTRL)  # regenerate
    assert len(window.conversation.messages) == 2

    asked: list[str] = []

    def no_file(*_args: object, **_kwargs: object) -> tuple[str, str]:
        asked.append("open")
        return "", ""

    monkeypatch.setattr(QFileDialog, "getOpenFileName", no_file)
    press(qtbot, Qt.Key.Key_O, CTRL)
    assert asked == ["open"]

    window.manager_action.setEnabled(True)  # no Hub services in this window
    with qtbot.waitSignal(window.manager_action.triggered, timeout=2000):
        press(qtbot, Qt.Key.Key_M, CTRL)

    for key, dock in (
        (Qt.Key.Key_S, window.sampling_panel),
        (Qt.Key.Key_P, window.perf_panel),
        (Qt.Key.Key_L, window.lora_panel),
    ):
        shown = dock.toggleViewAction().isChecked()
        press(qtbot, key, CTRL | SHIFT)
        assert dock.toggleViewAction().isChecked() != shown, dock.objectName()
        press(qtbot, key, CTRL | SHIFT)
        assert dock.toggleViewAction().isChecked() == shown

    first = window.conversation.id
    press(qtbot, Qt.Key.Key_N, CTRL)
    qtbot.waitUntil(lambda: window.conversation.id != first)
    assert not window.conversation.messages and window.store.load(first).messages

    focus(qtbot, window.sidebar.list)
    press(qtbot, Qt.Key.Key_L, CTRL)  # back to the message box
    assert QApplication.focusWidget() is window.chat_input

    press(qtbot, Qt.Key.Key_Q, CTRL)
    qtbot.waitUntil(lambda: not window.isVisible())
    assert not window.client.engine_thread.isRunning()


def start_streaming(qtbot: QtBot, win: MainWindow, text: str) -> None:
    focus(qtbot, win.chat_input)
    qtbot.keyClicks(win.chat_input, text)
    press(qtbot, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: win.session.reply_started, timeout=60_000)


@pytest.mark.parametrize("where", ["message box", "transcript", "sidebar", "sampling field"])
def test_ctrl_n_and_esc_mid_reply_wherever_focus_is(
    qtbot: QtBot, tmp_path: Path, where: str
) -> None:
    slow = FakeEngine(reply=LONG_REPLY, delay=0.02)
    win = desktop_window(qtbot, data_dirs(tmp_path / "data"), slow)
    try:
        load(qtbot, win, fake_model(tmp_path))
        targets: dict[str, QWidget | None] = {
            "message box": win.chat_input,
            "transcript": win.transcript,
            "sidebar": win.sidebar.list,
            "sampling field": win.sampling_panel.findChild(QWidget, "field_temperature"),
        }
        target = targets[where]
        assert target is not None
        start_streaming(qtbot, win, "Tell me a long story")
        focus(qtbot, target)
        first = win.conversation.id
        with qtbot.waitSignal(win.replyEnded, timeout=10_000) as ended:
            press(qtbot, Qt.Key.Key_N, CTRL)
        assert ended.args == ["cancelled"]
        qtbot.waitUntil(lambda: win.conversation.id != first)
        kept = win.store.load(first).messages
        assert [m.role for m in kept] == ["user", "assistant"] and kept[1].content

        start_streaming(qtbot, win, "Another long one")
        focus(qtbot, target)
        with qtbot.waitSignal(win.replyEnded, timeout=10_000) as ended:
            press(qtbot, Qt.Key.Key_Escape)
        assert ended.args == ["cancelled"]
    finally:
        win.close()


def test_shortcuts_reach_a_floating_panel(qtbot: QtBot, window: MainWindow) -> None:
    chat_once(qtbot, window)
    window.sampling_panel.setFloating(True)
    window.sampling_panel.activateWindow()
    field = window.sampling_panel.findChild(QWidget, "field_temperature")
    assert field is not None
    focus(qtbot, field)
    first = window.conversation.id
    press(qtbot, Qt.Key.Key_N, CTRL)
    qtbot.waitUntil(lambda: window.conversation.id != first)
    press(qtbot, Qt.Key.Key_L, CTRL)
    qtbot.waitUntil(lambda: QApplication.focusWidget() is window.chat_input)


def test_ctrl_n_mid_reply_on_the_real_model(qtbot: QtBot, tmp_path: Path, model_path: Path) -> None:
    """The reported bug: Ctrl+N did nothing while a reply streamed and the message box
    had the focus. It starts a new chat and keeps the old one, partial reply and all."""
    win = desktop_window(
        qtbot,
        data_dirs(tmp_path / "data"),
        None,
        AppSettings(load=TEST_LOAD, sampling=SamplingParams.greedy(400)),
    )
    try:
        load(qtbot, win, model_path, timeout=60_000)
        start_streaming(qtbot, win, "Write a long story about a lighthouse.")
        qtbot.waitUntil(lambda: bool(streamed(win).strip()), timeout=30_000)  # words shown
        assert QApplication.focusWidget() is win.chat_input
        first = win.conversation.id
        with qtbot.waitSignal(win.replyEnded, timeout=30_000) as ended:
            press(qtbot, Qt.Key.Key_N, CTRL)
        assert ended.args == ["cancelled"]
        qtbot.waitUntil(lambda: win.conversation.id != first)
        assert not win.conversation.messages
        saved = win.store.load(first)
        assert [m.role for m in saved.messages] == ["user", "assistant"]
        assert saved.messages[1].content.strip()  # the partial reply, kept
        start_streaming(qtbot, win, "Count to one hundred.")
        with qtbot.waitSignal(win.replyEnded, timeout=30_000) as ended:
            press(qtbot, Qt.Key.Key_Escape)
        assert ended.args == ["cancelled"]
    finally:
        win.close()


def streamed(win: MainWindow) -> str:
    """The running reply's text so far."""
    request = win.session._reply.request
    return "".join(request.parts) if request is not None else ""


# -- drag and drop ------------------------------------------------------------------------


def file_drag(*urls: QUrl, text: str = "") -> QMimeData:
    mime = QMimeData()
    if urls:
        mime.setUrls(list(urls))
    if text:
        mime.setText(text)
    return mime


def drag_and_drop(widget: QWidget, mime: QMimeData) -> tuple[bool, bool]:
    """Drag ``mime`` over ``widget`` and drop it; whether the enter and the drop were taken."""
    pos = QPoint(widget.width() // 2, widget.height() // 2)
    actions = Qt.DropAction.CopyAction | Qt.DropAction.LinkAction
    enter = QDragEnterEvent(pos, actions, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier(0))
    QApplication.sendEvent(widget, enter)
    drop = QDropEvent(
        QPointF(pos), actions, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier(0)
    )
    QApplication.sendEvent(widget, drop)
    return enter.isAccepted(), drop.isAccepted()


@pytest.mark.parametrize(
    ("urls", "why"),
    [
        (["a.gguf", "b.gguf"], "one model file at a time"),
        (["notes.xyz"], "not a GGUF model"),
        (["https://example.com/m.gguf"], "Only files on this computer"),
    ],
)
def test_drops_that_are_refused(
    qtbot: QtBot, window: MainWindow, tmp_path: Path, urls: list[str], why: str
) -> None:
    loads = window.client.worker  # no load may start
    started: list[object] = []
    loads.loadProgress.connect(started.append)
    mime = file_drag(
        *(QUrl(u) if "://" in u else QUrl.fromLocalFile(str(tmp_path / u)) for u in urls)
    )
    for target in (window, window.chat_input.viewport()):
        assert drag_and_drop(target, mime) == (False, False)
        assert why in window.statusBar().currentMessage()
        window.statusBar().clearMessage()
    assert not window.chat_input.toPlainText()  # no path pasted as text
    assert not started


def test_text_drags_still_reach_the_message_box(window: MainWindow) -> None:
    enter, drop = drag_and_drop(window.chat_input.viewport(), file_drag(text="dragged words"))
    assert enter and drop
    assert "dragged words" in window.chat_input.toPlainText()


def test_dropped_damaged_gguf_says_why(qtbot: QtBot, window: MainWindow, tmp_path: Path) -> None:
    bad = tmp_path / "damaged.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 16)
    assert drag_and_drop(window, file_drag(QUrl.fromLocalFile(str(bad)))) == (True, True)
    qtbot.waitUntil(lambda: "Not opened" in window.statusBar().currentMessage())
    assert "damaged.gguf" in window.transcript.toPlainText()
    assert window.session.model is not None and window.session.model.path.name == "model.gguf"


def test_dropped_model_loads_and_joins_the_library(
    qtbot: QtBot, tmp_path: Path, model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real default model dropped on a window with no model: it loads, is listed in
    the library, and is the first recent model; a LoRA adapter dropped next joins the
    stack."""
    from tests.lora_factory import make_lora

    monkeypatch.setattr(QMessageBox, "warning", lambda *a, **k: QMessageBox.StandardButton.Ok)
    dirs = data_dirs(tmp_path / "data")
    win = desktop_window(qtbot, dirs, None)
    try:
        with qtbot.waitSignal(win.modelReady, timeout=60_000) as ready:
            taken = drag_and_drop(
                win.transcript.viewport(), file_drag(QUrl.fromLocalFile(str(model_path)))
            )
            assert taken == (True, True)
        assert ready.args[0].path == model_path
        saved = AppSettings.load_from(dirs.settings_file)
        assert saved.imported_models == [str(model_path)]
        assert saved.recent_models[0] == str(model_path)

        adapter = make_lora(tmp_path / "style.gguf", model_path, strength=0.05)
        assert drag_and_drop(win, file_drag(QUrl.fromLocalFile(str(adapter)))) == (True, True)
        qtbot.waitUntil(lambda: len(win.lora_panel.stack()) == 1)
        assert (
            win.lora_panel.isVisible()
            and "Added the LoRA adapter" in win.statusBar().currentMessage()
        )
    finally:
        win.close()


# -- recent models ------------------------------------------------------------------------


def menu_texts(win: MainWindow) -> list[tuple[str, bool, bool]]:
    win.recent_models.rebuild()
    return [
        (a.text(), a.isEnabled(), a.isChecked())
        for a in win.recent_models.menu.actions()
        if not a.isSeparator()
    ]


def test_recent_models_menu(qtbot: QtBot, window: MainWindow, tmp_path: Path) -> None:
    a = window.session.model
    assert a is not None
    b = fake_model(tmp_path, "other.gguf")
    load(qtbot, window, b)
    assert window.settings.recent_models == [str(b), str(a.path)]
    assert menu_texts(window)[:2] == [("&1 other.gguf", True, True), ("&2 model.gguf", True, False)]

    with qtbot.waitSignal(window.modelReady, timeout=5000) as ready:
        window.recent_models.menu.actions()[1].trigger()
    assert ready.args[0].path == a.path
    assert window.settings.recent_models == [str(a.path), str(b)]

    b.unlink()
    entries = menu_texts(window)
    assert entries[1] == ("&2 other.gguf — missing", False, False)
    assert ("Remove missing", True, False) in entries
    window.recent_models.remove_missing()
    assert AppSettings.load_from(window.dirs.settings_file).recent_models == [str(a.path)]
    window.recent_models.clear()
    assert menu_texts(window)[0] == ("No recent models", False, False)
    assert AppSettings.load_from(window.dirs.settings_file).recent_models == []


def test_recent_models_keep_eight() -> None:
    s = AppSettings()
    for i in range(12):
        s.remember_model(f"/m/{i}.gguf")
    s.remember_model("/m/5.gguf")
    assert s.recent_models[:2] == ["/m/5.gguf", "/m/11.gguf"] and len(s.recent_models) == 8


# -- theme and charts ---------------------------------------------------------------------


@pytest.fixture()
def os_scheme() -> Iterator[None]:
    """Let a test play the OS switching light/dark; puts everything back after."""
    yield
    hints = QGuiApplication.styleHints()
    app = QApplication.instance()
    assert isinstance(app, QApplication)
    t = theme.theme_for(app)
    t.set_choice("system")
    hints.colorSchemeChanged.emit(Qt.ColorScheme.Unknown)
    app.setStyleSheet("")
    assert not theme.is_dark(app.palette())


def background_dark(win: MainWindow) -> bool:
    return bool(win.perf_panel.live.backgroundBrush().color().lightness() < 128)


def transcript_dark(win: MainWindow) -> bool:
    """What the transcript shows: its background as painted (the style sheet's)."""
    view = win.transcript
    color = view.grab().toImage().pixelColor(view.width() - 12, view.height() - 12)
    return bool(color.lightness() < 128)


def test_follows_the_os_light_dark_switch_live(
    qtbot: QtBot, window: MainWindow, os_scheme: None
) -> None:
    app = QApplication.instance()
    assert isinstance(app, QApplication)
    app.setStyleSheet((Path(__file__).resolve().parents[2] / "resources" / "style.qss").read_text())
    chat_once(qtbot, window)
    assert not background_dark(window) and not transcript_dark(window)
    hints = QGuiApplication.styleHints()
    hints.colorSchemeChanged.emit(Qt.ColorScheme.Dark)  # what Qt does when the OS switches
    qtbot.waitUntil(lambda: background_dark(window))
    assert theme.is_dark(window.palette())
    qtbot.waitUntil(lambda: transcript_dark(window))
    axis = window.perf_panel.live.getAxis("left")
    assert axis.textPen().color().lightness() > 128  # light text on the dark chart
    # The transcript is drawn again for the dark palette (its HTML has colours in it).
    qtbot.waitUntil(lambda: not window.restyle.pending)
    assert "Hello" in window.transcript.toPlainText()
    hints.colorSchemeChanged.emit(Qt.ColorScheme.Light)
    qtbot.waitUntil(lambda: not background_dark(window))
    qtbot.waitUntil(lambda: not transcript_dark(window))


def test_appearance_menu_forces_a_scheme(qtbot: QtBot, window: MainWindow, os_scheme: None) -> None:
    dark = window.view_menu.findChild(QWidget, "appearanceMenu")
    assert dark is not None
    actions = {a.objectName(): a for a in dark.actions()}
    assert actions["theme_system"].isChecked()
    actions["theme_dark"].trigger()
    qtbot.waitUntil(lambda: background_dark(window))
    assert AppSettings.load_from(window.dirs.settings_file).theme == "dark"
    actions["theme_system"].trigger()
    qtbot.waitUntil(lambda: not background_dark(window))


def test_chart_axes_never_say_kms(qtbot: QtBot, window: MainWindow) -> None:
    """pyqtgraph's SI prefix on a value already in ms read "kms"; on tok/s "ktok/s"."""
    perf = window.perf_panel
    perf.show()  # the charts start closed (View -> Performance); hidden, they are not drawn
    times = [i * 40.0 for i in range(200)]  # 40 ms per token, 8 s
    perf.set_history(
        [
            MessageMetrics(
                generated_tokens=200,
                token_times_ms=[1500 + t for t in times],
                prefill_ms=1500,
                evaluated_tokens=4000,
            )
        ]
        * 3
    )
    perf._rss.append((4000.0, 1.5e9))
    perf._rss_dirty = True
    perf._on_redraw()
    for plot in (perf.live, perf.history, perf.ttft, perf.itl, perf.memory):
        plot.getViewBox().autoRange()
    labels = {
        name: {side: getattr(perf, name).getAxis(side).labelString() for side in ("left", "bottom")}
        for name in ("live", "history", "ttft", "itl", "memory")
    }
    text = str(labels)
    assert "kms" not in text and "ktok" not in text and "(x0." not in text, text
    assert "(ms)" in labels["ttft"]["left"] and "(ms)" in labels["itl"]["bottom"]
    assert "(s)" in labels["live"]["bottom"] and "(tok/s)" in labels["history"]["left"]
    assert "(GB)" in labels["memory"]["left"], labels["memory"]


# -- accessible names ---------------------------------------------------------------------


def test_every_control_has_an_accessible_name(window: MainWindow) -> None:
    from ui.settings.settings_form import Section

    for section in window.findChildren(Section):  # the collapsed sampling groups too
        section.toggle.setChecked(True)
    missing = [
        f"{type(w).__name__} {w.objectName()!r} in {parent.objectName()!r}"
        for w in accessibility.unnamed(window)
        if (parent := w.parentWidget()) is not None
    ]
    assert not missing, missing
    assert window.chat_input.accessibleName() == "Message"
    assert window.send_button.accessibleName() == "Send message"
    assert window.stop_button.accessibleName() == "Stop the reply"
    assert window.sidebar.list.accessibleName() == "Conversations"
    slider = window.findChild(QWidget, "slider_temperature")
    assert slider is not None and slider.accessibleName() == "Temperature slider"
