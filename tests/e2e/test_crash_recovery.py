"""The start after a crash: the notice, the conversation that was being answered, and
answering it. Fast ones on the fake engine; slow ones kill the real app mid-reply."""

from __future__ import annotations

import ctypes
import json
import os
import platform
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QApplication, QPushButton
from pytestqt.qtbot import QtBot

from app.chat.conversation import Conversation, Message
from app.chat.store import ConversationStore
from app.config.paths import DataDirs, data_dirs
from app.config.setting_records import SamplingParams
from app.config.settings import AppSettings
from app.engine.native.guard import STORE_ENV
from app.engine.native.paths import PathVerdicts, RiskyPath
from app.util import crash_record
from app.util.crash_recorder import MARKER_NAME
from app.util.crash_report import CrashReport
from app.util.previous_crash import read_previous
from tests.conftest import ROOT, TEST_LOAD, chat_turns
from tests.fakes.engine import FakeEngine
from tests.native import extra_bufts_ok
from ui.engine.worker import EngineClient
from ui.main import open_window
from ui.window import crash_notice
from ui.window.crash_notice import CrashFollowUp, CrashNotice
from ui.window.main_window import MainWindow

QUESTION = "What keeps a lighthouse lamp turning through the night?"
FAULT = "crash-20260101-120000-42.log"


def crashed_data(
    tmp_path: Path, frame: str = "/app/app/engine/decode.py", **marker: object
) -> tuple[DataDirs, str]:
    """A data dir as a crash mid-reply leaves it: the user's message saved, no reply, the
    marker and a fault record; and an older conversation that was open at the last quit."""
    dirs = data_dirs(tmp_path / "data")
    store = ConversationStore(dirs.root)
    older = Conversation()
    older.messages = [Message("user", "Older?"), Message("assistant", "Older.")]
    store.save(older)
    conv = Conversation()
    conv.messages = [
        Message("user", "Hi"),
        Message("assistant", "Hello."),
        Message("user", QUESTION),
    ]
    store.save(conv)
    AppSettings(last_conversation=older.id).save(dirs.settings_file)
    thread = 0x7F0000000002
    (dirs.logs / FAULT).write_text(
        "Fatal Python error: Segmentation fault\n\n"
        f"Current thread 0x{thread:016x} (most recent call first):\n"
        f'  File "{frame}", line 1 in loop_plain\n\n'
    )
    doc: dict[str, object] = {
        "version": 1,
        "pid": 2**31 - 7,
        "proc_start": 1.0,
        "app": "0.1.0",
        "started": time.time() - 60,
        "fault_log": FAULT,
        "step": "decode",
        "since": time.time() - 5,
        "thread": thread,
        "model": "/models/model.gguf",
        "load": {"n_ctx": 2048},
        "paths": ["extra_bufts"],
        "request": {"kind": "chat", "conv": conv.id},
    }
    doc.update(marker)
    (dirs.logs / MARKER_NAME).write_text(json.dumps(doc))
    return dirs, conv.id


def fake_app(
    qtbot: QtBot, dirs: DataDirs, fake: FakeEngine, model: Path
) -> tuple[MainWindow, CrashReport, Callable[[], CrashFollowUp | None]]:
    """The window as ``main()`` opens it after the crash, and the notice's installer."""
    report, _ = read_previous(dirs.logs)
    assert report is not None
    settings, _notes = AppSettings.load_with_notes(dirs.settings_file)
    settings.sampling = SamplingParams.greedy(8)
    win = open_window(
        dirs,
        settings,
        [],
        lambda s: EngineClient(dirs.models, engine_factory=lambda: fake, store=s),
    )
    qtbot.addWidget(win)

    def install() -> CrashFollowUp | None:
        return crash_notice.install(win, report, dirs, lambda: win.load_model(model))

    return win, report, install


@pytest.fixture()
def model(tmp_path: Path) -> Path:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"fake model")
    return path


@pytest.fixture()
def verdicts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PathVerdicts:
    """This machine's verdicts, in a file of the test's own."""
    store = PathVerdicts(tmp_path / "native_paths.json", "test-machine")
    monkeypatch.setattr(crash_notice, "verdicts_here", lambda _dirs: store)
    return store


def notice_of(win: MainWindow) -> CrashNotice:
    notice = win.findChild(CrashNotice, "crashNotice")
    assert notice is not None and notice.isVisible()
    return notice


def test_the_next_start_says_so_and_answers_the_message(
    qtbot: QtBot, tmp_path: Path, model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The GUI thread faulted, in Qt's event loop: not llama.cpp's doing.
    dirs, conv_id = crashed_data(tmp_path, frame="/app/ui/main.py", thread=1)
    fake = FakeEngine(reply="The clockwork turns it.")
    win, report, install = fake_app(qtbot, dirs, fake, model)
    try:
        assert not report.in_native
        with qtbot.waitSignal(win.modelReady, timeout=5000):
            install()
        notice = notice_of(win)
        text = notice.label.text()
        assert text.startswith("Lamplight closed unexpectedly while writing a reply on ")
        assert text.endswith("Your conversation is safe.")
        assert win.conversation.id == conv_id  # the crashed chat, not the last one quit on
        assert QUESTION in win.transcript.toPlainText()
        assert not notice.off_buttons  # the fault was not inside llama.cpp
        opened: list[QUrl] = []

        def open_url(url: QUrl) -> bool:
            opened.append(url)
            return True

        monkeypatch.setattr(QDesktopServices, "openUrl", open_url)
        notice.open_button.click()
        assert opened and opened[0].toLocalFile() == str(dirs.logs / FAULT)
        record = (dirs.logs / FAULT).read_text()
        assert record.startswith("Lamplight 0.1.0") and "Current thread" in record
        assert notice.answer_button.isVisible() and notice.answer_button.isEnabled()
        with qtbot.waitSignal(win.replyEnded, timeout=10_000) as ended:
            notice.answer_button.click()
        assert ended.args == ["finished"]
        assert not notice.answer_button.isVisible()
        want = [("user", QUESTION), ("assistant", "The clockwork turns it.")]
        assert [(m.role, m.content) for m in win.conversation.messages][-2:] == want
        on_disk = ConversationStore(dirs.root).load(conv_id).messages
        assert [(m.role, m.content) for m in on_disk][-2:] == want
        assert fake.requests[-1][-1].content == QUESTION
    finally:
        win.close()


def test_the_log_is_named_and_its_path_offered_where_nothing_opens_it(
    qtbot: QtBot, tmp_path: Path, model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: "Open the log" did nothing where no opener exists (``openUrl`` returns
    False: no xdg-open on a minimal Linux) and never said which file it meant."""
    dirs, _conv_id = crashed_data(tmp_path)
    win, _report, install = fake_app(qtbot, dirs, FakeEngine(), model)
    try:
        with qtbot.waitSignal(win.modelReady, timeout=5000):
            follow = install()
        assert follow is not None
        notice = notice_of(win)
        record = dirs.logs / FAULT
        assert notice.log_label.isVisible() and str(record) in notice.log_label.text()
        flags = notice.log_label.textInteractionFlags()
        assert flags & Qt.TextInteractionFlag.TextSelectableByMouse  # it can be copied

        monkeypatch.setattr(QDesktopServices, "openUrl", lambda _url: False)
        notice.open_button.click()
        note = follow.path_note
        assert note is not None and note.isVisible()  # shown with open(): nothing waits on it
        assert "Nothing on this computer opened the crash record" in note.text()
        assert str(record) in note.text()
        copy = note.findChild(QPushButton, "copyPath")
        assert copy is not None
        QApplication.clipboard().clear()
        copy.click()
        assert QApplication.clipboard().text() == str(record)

        monkeypatch.setattr(QDesktopServices, "openUrl", lambda _url: True)
        notice.open_button.click()
        assert follow.path_note is None
        assert win.statusBar().currentMessage() == f"Opened {record}"
    finally:
        win.close()


def test_a_new_message_after_the_crash_keeps_the_unanswered_one(
    qtbot: QtBot, tmp_path: Path, model: Path
) -> None:
    dirs, _conv_id = crashed_data(tmp_path)
    fake = FakeEngine(reply="Both answered.")
    win, _report, install = fake_app(qtbot, dirs, fake, model)
    try:
        with qtbot.waitSignal(win.modelReady, timeout=5000):
            install()
        with qtbot.waitSignal(win.replyEnded, timeout=10_000):
            win.chat_input.setPlainText("And who winds it?")
            win.send()
        assert fake.requests[-1][-1].content == f"{QUESTION}\n\nAnd who winds it?"
        assert [m.role for m in win.conversation.messages] == ["user", "assistant"] * 2
        assert not notice_of(win).answer_button.isVisible()
    finally:
        win.close()


def test_turning_off_a_path_after_a_crash_inside_llama_cpp(
    qtbot: QtBot, tmp_path: Path, model: Path, verdicts: PathVerdicts
) -> None:
    dirs, _conv_id = crashed_data(tmp_path, paths=["extra_bufts", "flash_attn", "gpu_offload"])
    verdicts.record(RiskyPath.GPU_OFFLOAD, False, "crashed in the probe", "probe")
    fake = FakeEngine(reply="Answered without it.")
    win, report, install = fake_app(qtbot, dirs, fake, model)
    try:
        assert report.in_native
        with qtbot.waitSignal(win.modelReady, timeout=5000):
            install()
        notice = notice_of(win)
        # Only what was running and is not off already.
        assert set(notice.off_buttons) == {RiskyPath.EXTRA_BUFTS, RiskyPath.FLASH_ATTN}
        button = notice.off_buttons[RiskyPath.FLASH_ATTN]
        assert button.text() == "Turn off flash attention and continue"
        loads = fake.loads
        with qtbot.waitSignal(win.replyEnded, timeout=10_000) as ended:
            button.click()  # recorded, the model loaded again, the message answered
        assert ended.args == ["finished"] and fake.loads == loads + 1
        verdict = verdicts.verdict(RiskyPath.FLASH_ATTN)
        assert verdict is not None and not verdict.ok and verdict.source == "crash"
        assert "while writing a reply" in verdict.reason
        assert win.conversation.messages[-1].content == "Answered without it."
        assert "Flash attention is off on this computer" in notice.label.text()
        assert not any(b.isVisible() for b in notice.off_buttons.values())
    finally:
        win.close()


def test_a_crash_while_loading_waits_for_a_choice(
    qtbot: QtBot, tmp_path: Path, model: Path, verdicts: PathVerdicts
) -> None:
    dirs, _conv_id = crashed_data(tmp_path, step="load", request={})
    fake = FakeEngine()
    win, _report, install = fake_app(qtbot, dirs, fake, model)
    try:
        install()
        notice = notice_of(win)
        assert "while loading model.gguf" in notice.label.text()
        assert "once you choose" in notice.label.text()
        qtbot.wait(200)
        assert fake.loads == 0  # the load that crashed is not run again on its own
        anyway = notice.findChild(QPushButton, "crashLoadAnyway")
        assert anyway is not None
        with qtbot.waitSignal(win.modelReady, timeout=5000):
            anyway.click()
        assert fake.loads == 1 and verdicts.verdicts() == {}
    finally:
        win.close()


def test_no_notice_after_a_clean_exit(qtbot: QtBot, tmp_path: Path, model: Path) -> None:
    dirs = data_dirs(tmp_path / "data")
    rec, report = crash_record.begin(dirs.logs, "0.1.0", fault_handler=False)
    crash_record.end(rec)
    assert report is None
    rec, report = crash_record.begin(dirs.logs, "0.1.0", fault_handler=False)
    crash_record.end(rec)
    assert report is None
    fake = FakeEngine()
    win = open_window(
        dirs,
        AppSettings(),
        [],
        lambda s: EngineClient(dirs.models, engine_factory=lambda: fake, store=s),
    )
    qtbot.addWidget(win)
    try:
        with qtbot.waitSignal(win.modelReady, timeout=5000):
            assert crash_notice.install(win, None, dirs, lambda: win.load_model(model)) is None
        assert win.findChild(CrashNotice, "crashNotice") is None
    finally:
        win.close()


# -- the real app, killed mid-reply ------------------------------------------------------------

STREAMING_TIMEOUT_S = 300  # start, the model's load and its first words, on a busy machine
LONG = SamplingParams.greedy(2000)  # still writing when it is killed


class Driven:
    """``tests/crash_driver.py`` running the real app in a child process."""

    def __init__(self, data: Path, model: Path, env: dict[str, str]) -> None:
        self.stderr_path = data.parent / "app-stderr.txt"
        with self.stderr_path.open("w") as err:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.crash_driver",
                    QUESTION,
                    "--",
                    "--data-dir",
                    str(data),
                    "--model",
                    str(model),
                ],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env={**os.environ, "QT_QPA_PLATFORM": "offscreen", **env},
            )

    def wait_streaming(self) -> dict[str, object]:
        """The driver's line once the reply's first words are shown."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + STREAMING_TIMEOUT_S
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while time.monotonic() < deadline and self.proc.poll() is None:
                if sel.select(timeout=0.5):
                    line = self.proc.stdout.readline()
                    if line.startswith("{"):
                        data = json.loads(line)
                        assert isinstance(data, dict)
                        return data
        raise AssertionError(
            f"the app did not start replying (exit {self.proc.poll()}):\n"
            + self.stderr_path.read_text(errors="replace")[-4000:]
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture()
def crash_setup(
    tmp_path: Path, model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[DataDirs, dict[str, str]]]:
    """A data dir for chat turns on the default model with long greedy replies, and a
    verdict file of the test's own (a copy of the suite's: no checks to run again)."""
    dirs = data_dirs(tmp_path / "data")
    chat_turns(dirs.root, model_path)
    AppSettings(load=TEST_LOAD, sampling=LONG).save(dirs.settings_file)
    store = tmp_path / "native_paths.json"
    suite = os.environ.get(STORE_ENV, "")
    if suite and Path(suite).is_file():
        shutil.copyfile(suite, store)
    monkeypatch.setenv(STORE_ENV, str(store))
    yield dirs, {STORE_ENV: str(store)}


def kill_mid_reply(
    dirs: DataDirs, model: Path, env: dict[str, str], kill: Callable[[int], None]
) -> tuple[str, dict[str, object]]:
    """Run the app until it streams, ``kill`` it, and return the conversation id and the
    marker it left."""
    app = Driven(dirs.root, model, env)
    try:
        line = app.wait_streaming()
        marker = json.loads((dirs.logs / MARKER_NAME).read_text())
        kill(app.proc.pid)
        app.proc.wait(60)
        assert app.proc.returncode == -signal.SIGSEGV, app.stderr_path.read_text()[-3000:]
    finally:
        app.stop()
    assert line["pid"] == marker["pid"]
    conv = line["conv"]
    assert isinstance(conv, str) and isinstance(marker, dict)
    return conv, marker


def restart(
    qtbot: QtBot, dirs: DataDirs, model: Path
) -> tuple[MainWindow, CrashReport, CrashFollowUp]:
    """The next start, as ``main()`` makes it, on the real engine; the model loaded (unless
    the notice holds the load)."""
    report, _ = read_previous(dirs.logs)
    assert report is not None
    settings, _notes = AppSettings.load_with_notes(dirs.settings_file)
    win = open_window(dirs, settings, [], lambda s: EngineClient(dirs.models, store=s))
    qtbot.addWidget(win)
    with qtbot.waitSignal(win.modelReady, timeout=120_000):
        follow = crash_notice.install(win, report, dirs, lambda: win.start_engine(model))
    assert follow is not None
    win.settings.sampling = SamplingParams.greedy(24)  # a short answer will do
    return win, report, follow


def check_saved_and_shown(win: MainWindow, dirs: DataDirs, conv: str) -> None:
    on_disk = ConversationStore(dirs.root).load(conv).messages
    assert [(m.role, m.content) for m in on_disk] == [("user", QUESTION)]
    assert win.conversation.id == conv
    assert QUESTION in win.transcript.toPlainText()


def check_answered(win: MainWindow, dirs: DataDirs, conv: str) -> None:
    roles = [m.role for m in win.conversation.messages]
    assert roles == ["user", "assistant"] and win.conversation.messages[1].content.strip()
    on_disk = ConversationStore(dirs.root).load(conv).messages
    assert [(m.role, m.content) for m in on_disk] == [
        (m.role, m.content) for m in win.conversation.messages
    ]


def test_sigsegv_mid_reply_then_the_next_start_tells_and_answers(
    qtbot: QtBot, model_path: Path, crash_setup: tuple[DataDirs, dict[str, str]]
) -> None:
    dirs, env = crash_setup
    conv, marker = kill_mid_reply(dirs, model_path, env, lambda pid: os.kill(pid, signal.SIGSEGV))
    assert marker["step"] == "decode" and marker["model"] == str(model_path)
    assert marker["request"] == {**marker["request"], "kind": "chat", "conv": conv}  # type: ignore[dict-item]
    assert marker["paths"] and "extra_bufts" in marker["paths"]  # type: ignore[operator]
    fault = (dirs.logs / str(marker["fault_log"])).read_text()
    assert "Fatal Python error: Segmentation fault" in fault
    assert "Current thread 0x" in fault and "Thread 0x" in fault
    assert "app/engine/" in fault  # the engine thread's stack is there too

    win, report, follow = restart(qtbot, dirs, model_path)
    try:
        assert report.step == "decode" and report.conv_id == conv
        assert not report.in_native  # delivered to the GUI thread from outside
        line = follow.notice.label.text()
        assert line.startswith("Lamplight closed unexpectedly while writing a reply on ")
        assert line.endswith("Your conversation is safe.")
        check_saved_and_shown(win, dirs, conv)
        record = (dirs.logs / str(marker["fault_log"])).read_text()
        assert "Step: decode (writing a reply)" in record and "Segmentation fault" in record
        answer = follow.notice.answer_button
        assert answer.isVisible() and answer.isEnabled()
        with qtbot.waitSignal(win.replyEnded, timeout=180_000) as ended:
            answer.click()
        assert ended.args == ["finished"]
        check_answered(win, dirs, conv)
    finally:
        win.close()


def _tgkill(pid: int, tid: int, sig: int) -> None:
    numbers = {"x86_64": 234, "aarch64": 131}
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(numbers[platform.machine()], pid, tid, sig) != 0:
        raise OSError(ctypes.get_errno(), "tgkill failed")


def engine_thread(pid: int) -> int:
    """The native id of the app's engine thread (the QThread named lamplight-engine)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        if (task / "comm").read_text().strip().startswith("lamplight-engin"):
            return int(task.name)
    raise AssertionError("no engine thread")


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "aarch64"),
    reason="signals one thread of another process with tgkill",
)
def test_a_fault_in_the_engine_thread_offers_to_turn_the_path_off(
    qtbot: QtBot, model_path: Path, crash_setup: tuple[DataDirs, dict[str, str]]
) -> None:
    dirs, env = crash_setup
    # A path that runs here: repacking, or flash attention where repacking is already off.
    path = RiskyPath.EXTRA_BUFTS if extra_bufts_ok(model_path) else RiskyPath.FLASH_ATTN
    if path is RiskyPath.FLASH_ATTN:
        AppSettings(load=replace(TEST_LOAD, flash_attn=True), sampling=LONG).save(
            dirs.settings_file
        )
    conv, _marker = kill_mid_reply(
        dirs, model_path, env, lambda pid: _tgkill(pid, engine_thread(pid), signal.SIGSEGV)
    )
    store = Path(env[STORE_ENV])
    win, report, follow = restart(qtbot, dirs, model_path)
    try:
        assert report.in_native and report.step == "decode"
        check_saved_and_shown(win, dirs, conv)
        button = follow.notice.off_buttons.get(path)
        assert button is not None and button.isVisible()
        with qtbot.waitSignal(win.replyEnded, timeout=240_000) as ended:
            button.click()  # off for this machine, the model loaded again, the message answered
        assert ended.args == ["finished"]
        check_answered(win, dirs, conv)
        machines = json.loads(store.read_text())["machines"]
        entries = [m[path.value] for m in machines.values() if path.value in m]
        assert any(e["ok"] is False and e["source"] == "crash" for e in entries)
        notes = win.loaded_model.info.notes  # type: ignore[union-attr]
        assert any(n.startswith(f"{path.label} is off on this computer") for n in notes)
    finally:
        win.close()
