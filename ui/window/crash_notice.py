"""The next start after a crash: one line above the transcript, and what can be done.

The line says when Lamplight closed and what it was doing (``CrashReport.line``),
and that the conversation is safe once its transcript was read back from disk.
Its buttons: open the crash record; when the fault was inside llama.cpp, turn
off a risky native path that was running (a ``crash`` verdict for this machine in
``native_paths.json``, which the engine's guard honours from the next load on) and
carry on; and when the app closed mid-reply, answer the message that was left
without a reply. A crash inside llama.cpp while a vision projector was loading sets
that projector aside first (a ``crash`` verdict in ``projector_checks.json``), so no
choice loads it again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import (
    QBoxLayout,
    QFrame,
    QHBoxLayout,
    QLabel,
    QMessageBox,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.chat.conversation import ConversationError, is_valid_id
from app.config.paths import DataDirs
from app.engine.local.vision import PROJECTOR_KEY
from app.engine.native.paths import PathVerdicts, RiskyPath
from app.gguf.header import shown
from app.util.crash_report import CrashReport
from app.util.errors import ProjectorError
from ui.common.open_path import open_path

if TYPE_CHECKING:
    from app.engine.backend import ModelInfo
    from ui.window.main_window import MainWindow

log = logging.getLogger(__name__)


def offered_paths(report: CrashReport, off: frozenset[RiskyPath]) -> tuple[RiskyPath, ...]:
    """The paths to offer to turn off: running when the fault hit inside llama.cpp, and
    not off already."""
    if not report.in_native:
        return ()
    out = []
    for value in report.paths:
        try:
            path = RiskyPath(value)
        except ValueError:
            continue
        if path not in off:
            out.append(path)
    return tuple(out)


def short_label(path: RiskyPath) -> str:
    """The path's label without its explanation in brackets."""
    return path.label.split(" (")[0]


def verdicts_here(dirs: DataDirs) -> PathVerdicts:
    """This machine's verdicts, in the file the engine's guard reads (raises when
    llama.cpp's build cannot be named: no llama_cpp, no library folder)."""
    from app.engine.native.guard import store_file
    from app.engine.native.libs import machine_key

    return PathVerdicts(store_file(dirs.root), machine_key())


def set_aside_projector(report: CrashReport, dirs: DataDirs) -> str:
    """After a crash inside llama.cpp while a vision projector was loading, refuse that
    projector from now on (pairing passes it over, the engine leaves it out). Returns
    the notice's sentence about it ('' when no projector is to blame)."""
    from app.engine.native.guard import projector_checks_file
    from app.gguf.projector import read_projector
    from app.gguf.projector_checks import ProjectorChecks

    path = report.load.get(PROJECTOR_KEY)
    if report.step != "load" or not report.in_native or not isinstance(path, str) or not path:
        return ""
    fault = report.fault or "a fault"
    why = f"Lamplight closed unexpectedly while loading it ({fault} inside llama.cpp)"
    try:
        info = read_projector(path)
        ProjectorChecks(projector_checks_file(dirs.root)).record(info, False, why, "crash")
    except (ProjectorError, OSError, ValueError) as exc:
        log.warning("the projector %s was not set aside: %s", shown(path), exc)
        return ""
    return (
        f" It was loading the vision projector {shown(info.name)}, which is now set aside: "
        "the model loads without it."
    )


class CrashNotice(QFrame):
    """Says that Lamplight closed unexpectedly, with the actions that apply.

    Signals:
        openLogRequested(): show the crash record.
        turnOffRequested(object): turn this ``RiskyPath`` off and carry on.
        answerRequested(): reply to the message left unanswered.
    """

    openLogRequested = Signal()
    turnOffRequested = Signal(object)
    answerRequested = Signal()

    def __init__(
        self,
        text: str,
        paths: tuple[RiskyPath, ...],
        can_answer: bool,
        parent: QWidget | None = None,
        log: Path | None = None,
    ) -> None:
        """``log``: the crash record (or the log folder), named so it can be found and
        copied even where nothing opens it."""
        super().__init__(parent)
        self.setObjectName("crashNotice")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setAccessibleName("Lamplight closed unexpectedly")
        self.label = QLabel(text, self)
        self.label.setObjectName("crashNoticeText")
        self.label.setWordWrap(True)
        self.open_button = self._button("Open the log", "crashOpenLog")
        self.open_button.setToolTip("Show the crash record: what was running, and every stack")
        self.open_button.clicked.connect(self.openLogRequested)
        self.log_label = QLabel(f"Crash record: {log}" if log else "", self)
        self.log_label.setObjectName("crashLogPath")
        self.log_label.setTextFormat(Qt.TextFormat.PlainText)
        self.log_label.setWordWrap(True)
        self.log_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.log_label.setVisible(log is not None)
        self.off_buttons: dict[RiskyPath, QPushButton] = {}
        for path in paths:
            button = self._button(
                f"Turn off {short_label(path).lower()} and continue", f"crashTurnOff_{path.value}"
            )
            button.setToolTip(
                f"{path.label} was running when llama.cpp crashed. Turn it off on this "
                f"computer and load the model again. Without it, {path.cost}."
            )
            button.clicked.connect(lambda _checked=False, p=path: self.turnOffRequested.emit(p))
            self.off_buttons[path] = button
        self.answer_button = self._button("Answer it", "crashAnswer")
        self.answer_button.setToolTip("Reply to your message that was left unanswered")
        self.answer_button.clicked.connect(self.answerRequested)
        self.answer_button.setVisible(can_answer)
        self.answer_button.setEnabled(False)  # once a model is ready
        self.close_button = QToolButton(self)
        self.close_button.setObjectName("crashNoticeClose")
        self.close_button.setText("✕")
        self.close_button.setAutoRaise(True)
        self.close_button.setToolTip("Hide this note")
        self.close_button.setAccessibleName("Hide the crash note")
        self.close_button.clicked.connect(self.hide)
        top = QHBoxLayout()
        top.addWidget(self.label, 1)
        top.addWidget(self.close_button)
        self._buttons = QHBoxLayout()
        for b in (self.open_button, *self.off_buttons.values(), self.answer_button):
            self._buttons.addWidget(b)
        self._buttons.addStretch(1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 4, 4, 4)
        layout.addLayout(top)
        layout.addWidget(self.log_label)
        layout.addLayout(self._buttons)

    def _button(self, text: str, name: str) -> QPushButton:
        button = QPushButton(text, self)
        button.setObjectName(name)
        button.setAccessibleName(text)
        return button

    def add_button(self, text: str, name: str) -> QPushButton:
        """One more action, after the others."""
        button = self._button(text, name)
        self._buttons.insertWidget(self._buttons.count() - 1, button)
        return button


class CrashFollowUp(QObject):
    """The notice's actions on the window: open the log, turn a path off, answer.

    A child of the window, so it lives as long as the window does."""

    def __init__(
        self,
        win: MainWindow,
        report: CrashReport,
        dirs: DataDirs,
        start: Callable[[], None],
    ) -> None:
        super().__init__(win)
        self.win = win
        self.report = report
        self.dirs = dirs
        self._start = start
        self._started = False
        self._answer_after_load = False
        self._reload_after_load = False
        self.anyway: QPushButton | None = None  # "Load as before", while the load waits
        # Before any load: a projector that crashed the load is never loaded again.
        self.projector_note = set_aside_projector(report, dirs)
        self.conv_id = self._open_conversation()
        safe = self._safe()
        paths: tuple[RiskyPath, ...] = ()
        if report.in_native:
            try:
                paths = offered_paths(report, verdicts_here(dirs).disabled())
            except Exception as exc:  # no llama.cpp build to name: nothing can be turned off
                log.warning("native paths cannot be turned off here: %s", exc)
        text = report.line(safe) + self.projector_note
        self.log_path = self._log_path()
        self.path_note: QMessageBox | None = None  # where the log is, when nothing opened it
        self.notice = CrashNotice(text, paths, self._pending(), win.chat, self.log_path)
        layout = win.chat.layout()
        assert isinstance(layout, QBoxLayout)
        layout.insertWidget(0, self.notice)
        self.notice.show()
        self.notice.openLogRequested.connect(self.open_log)
        self.notice.turnOffRequested.connect(self.turn_off)
        self.notice.answerRequested.connect(self.answer)
        win.modelReady.connect(self._on_model_ready)
        win.replyEnded.connect(self._refresh)
        win.statusBar().showMessage(report.line(safe), 15000)
        log.warning("shown: %s", report.line(safe))

    def start_engine(self) -> None:
        """Load the model as the window does at start; a crash while loading inside
        llama.cpp waits for the user's choice (turning a path off, or loading anyway), unless
        the projector that was loading is to blame: the model loads at once without it."""
        if self.report.step == "load" and self.notice.off_buttons and not self.projector_note:
            self.anyway = self.notice.add_button("Load as before", "crashLoadAnyway")
            self.anyway.setToolTip("Load the model with the same settings")
            self.anyway.clicked.connect(self._load_anyway)
            self.notice.label.setText(
                self.notice.label.text() + " The model is loaded once you choose."
            )
            return
        self._begin()

    def _begin(self) -> None:
        if not self._started:
            self._started = True
            self._start()

    def _load_anyway(self) -> None:
        if self.anyway is not None:
            self.anyway.hide()
        self._begin()

    def _open_conversation(self) -> str:
        """Show the conversation that was being answered (the window opens the last one
        of a clean exit); returns its id ('' when there is none)."""
        conv = self.report.conv_id
        store = self.win.session.store
        if self.report.kind != "chat" or not is_valid_id(conv):
            return ""
        if not store.transcript_path(conv).exists():
            return conv
        if self.win.conversation.id != conv:
            self.win.open_conversation(conv, restore=False)  # its cache once a model is ready
        return conv

    def _safe(self) -> bool | None:
        """Whether the conversation the step concerned is on disk (None: no conversation)."""
        if not self.conv_id:
            return None
        try:
            return bool(self.win.session.store.load(self.conv_id).messages)
        except (ConversationError, OSError) as exc:
            log.warning("the conversation %s cannot be read back: %s", self.conv_id, exc)
            return False

    def _pending(self) -> bool:
        """The open conversation is the crashed one and ends with an unanswered message."""
        msgs = self.win.conversation.messages
        return (
            self.report.mid_reply
            and bool(self.conv_id)
            and self.win.conversation.id == self.conv_id
            and bool(msgs)
            and msgs[-1].role == "user"
        )

    def _refresh(self, *_args: object) -> None:
        pending = self._pending()
        ready = self.win.session.model is not None and not self.win.session.busy
        self.notice.answer_button.setVisible(pending)
        self.notice.answer_button.setEnabled(pending and ready)

    def _on_model_ready(self, _info: ModelInfo) -> None:
        if self._reload_after_load:  # loaded with the path on: load again without it
            self._reload_after_load = False
            self.win.reload_model()
            return
        self._refresh()
        if self._answer_after_load:
            self._answer_after_load = False
            self.answer()

    # -- actions -------------------------------------------------------------------------

    def _log_path(self) -> Path:
        """The crash record, else the log folder it would be in."""
        target = self.report.log_file
        return target if target is not None and target.is_file() else self.dirs.logs

    def open_log(self) -> None:
        """Open the crash record with the desktop's app; where none opens it, say so and
        offer its path to copy (a click used to do nothing, silently)."""
        what = "the crash record" if self.log_path.is_file() else "the log folder"
        self.path_note = open_path(self.win, self.log_path, what)
        if self.path_note is None:
            self.win.statusBar().showMessage(f"Opened {self.log_path}", 8000)

    def turn_off(self, path: RiskyPath) -> None:
        """Record that ``path`` is off on this machine, then load the model without it
        and answer the message left unanswered."""
        why = (
            f"Lamplight crashed inside llama.cpp ({self.report.fault or 'a fault'}) while "
            f"{self.report.doing() or 'running'} with it on"
        )
        try:
            verdicts_here(self.dirs).record(path, False, why, "crash")
        except Exception as exc:  # a file that cannot be written, no build to name
            log.warning("could not turn off %s: %s", path.value, exc)
            self.win.session_view.notice(f"{short_label(path)} could not be turned off: {exc}")
            return
        for button in self.notice.off_buttons.values():
            button.hide()
        if self.anyway is not None:
            self.anyway.hide()
        self.notice.label.setText(
            f"{short_label(path)} is off on this computer (Help → Hardware and backends can "
            f"turn it on again). Without it, {path.cost}."
        )
        self._answer_after_load = self._pending()
        if not self._started:
            self._begin()
        elif self.win.session.model is not None:
            self.win.reload_model()
        else:  # the first load is under way, with the path on
            self._reload_after_load = True

    def answer(self) -> None:
        if self.win.answer_pending():
            self.notice.answer_button.hide()


def install(
    win: MainWindow, report: CrashReport | None, dirs: DataDirs, start: Callable[[], None]
) -> CrashFollowUp | None:
    """Show ``report`` on ``win`` (if any) and start the engine with ``start`` (held when
    the crash was while loading, inside llama.cpp, until the user chooses)."""
    if report is None:
        start()
        return None
    try:
        follow = CrashFollowUp(win, report, dirs, start)
    except Exception:  # the notice must never keep the app from starting
        log.exception("the crash notice could not be shown")
        start()
        return None
    follow.start_engine()
    return follow
