"""``ui.common.background.run_in_background``: the answer on the GUI thread, failures
handed over or logged, nothing called for an owner deleted meanwhile."""

from __future__ import annotations

import logging
import threading

import pytest
import shiboken6
from PySide6.QtCore import QObject, QThread
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from ui.common.background import run_in_background


class Receiver(QObject):
    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.got: list[object] = []
        self.threads: list[QThread] = []

    def on_done(self, result: object) -> None:
        self.threads.append(QThread.currentThread())
        self.got.append(result)

    def on_error(self, exc: Exception) -> None:
        self.threads.append(QThread.currentThread())
        self.got.append(exc)


def test_the_result_arrives_on_the_gui_thread(qtbot: QtBot) -> None:
    r = Receiver()
    ran_on: list[str] = []

    def work() -> int:
        ran_on.append(threading.current_thread().name)
        return 42

    job = run_in_background(work, r.on_done)
    assert r.got == []  # never inside the call that started it
    qtbot.waitUntil(lambda: r.got == [42], timeout=5000)
    assert not job.running and job.wait(0)
    assert ran_on and ran_on[0] != threading.main_thread().name
    assert r.threads == [QApplication.instance().thread()]  # type: ignore[union-attr]


def test_an_exception_goes_to_on_error_on_the_gui_thread(qtbot: QtBot) -> None:
    r = Receiver()

    def fail() -> int:
        raise ValueError("broken")

    run_in_background(fail, r.on_done, r.on_error)
    qtbot.waitUntil(lambda: bool(r.got), timeout=5000)
    assert len(r.got) == 1 and isinstance(r.got[0], ValueError) and str(r.got[0]) == "broken"
    assert r.threads == [QApplication.instance().thread()]  # type: ignore[union-attr]


def test_an_exception_nobody_takes_is_logged(
    qtbot: QtBot, caplog: pytest.LogCaptureFixture
) -> None:
    r = Receiver()

    def fail() -> int:
        raise KeyError("lost?")

    with caplog.at_level(logging.ERROR, logger="ui.common.background"):
        run_in_background(fail, r.on_done)
        qtbot.waitUntil(lambda: bool(caplog.records), timeout=5000)
    assert r.got == []
    record = caplog.records[0]
    assert record.exc_info is not None and isinstance(record.exc_info[1], KeyError)


def test_nothing_is_called_for_an_owner_deleted_before_the_answer(qtbot: QtBot) -> None:
    parent = QObject()
    r = Receiver(parent)
    release = threading.Event()

    def slow() -> str:
        release.wait(5)
        return "late"

    job = run_in_background(slow, r.on_done)
    other = Receiver()
    # An explicit owner too; both answers come only after the owner is gone.
    owned = run_in_background(slow, other.on_done, owner=r)
    parent.deleteLater()
    qtbot.waitUntil(lambda: not _alive(r), timeout=5000)
    release.set()
    assert job.wait(5) and owned.wait(5)
    qtbot.wait(100)  # the queued answers arrive, and are dropped
    assert r.got == [] and other.got == []


def test_cancelling_is_the_jobs_own_event(qtbot: QtBot) -> None:
    r = Receiver()
    cancel = threading.Event()

    def loop() -> str:
        while not cancel.wait(0.01):
            pass
        return "stopped"

    job = run_in_background(loop, r.on_done)
    assert job.running and not job.wait(0.05)
    cancel.set()
    assert job.wait(5)
    qtbot.waitUntil(lambda: r.got == ["stopped"], timeout=5000)


def _alive(obj: QObject) -> bool:
    return bool(shiboken6.isValid(obj))
