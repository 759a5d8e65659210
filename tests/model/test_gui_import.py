"""File → Import conversation… with a chat file that names a file of the user's (issue 40,
item 3): the window lists it and reads it only after Attach. The window runs a fake chat
engine and the real document library (parse child, built-in embedding model)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QFileDialog, QMessageBox
from pytestqt.qtbot import QtBot

from app.chat.conversation import Conversation
from tests.embed_model import embedder_path
from tests.fakes.engine import FakeEngine
from tests.fakes.window import WindowFactory
from ui.chat import conversation_files
from ui.chat.import_review_dialog import ImportReview
from ui.window.main_window import MainWindow

TOKEN = "gho_kq8TOKENthatmuststayhere"


@pytest.fixture()
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture()
def window(
    make_window: WindowFactory, engine: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> MainWindow:
    def warn(*args: Any, **_k: Any) -> None:
        raise AssertionError(f"a message box: {args[1:]}")

    monkeypatch.setattr(QMessageBox, "warning", warn)
    # The embedding model built once for the tests, not again in this data folder.
    monkeypatch.setattr("app.models.embedders.chosen_embedder", lambda _root: embedder_path())
    return make_window(engine)


def answer_review(win: MainWindow, attach: bool, seen: list[list[str]]) -> None:
    """Answer the review dialog once it shows (Attach or Don't attach), noting its list."""
    tries = [0]

    def poll() -> None:
        shown = [d for d in win.findChildren(ImportReview) if d.isVisible()]
        if not shown:
            tries[0] += 1
            if tries[0] < 500:
                QTimer.singleShot(10, poll)
            return
        dialog = shown[0]
        seen.append([dialog.list.item(i).text() for i in range(dialog.list.count())])
        (dialog.attach_button if attach else dialog.skip_button).click()

    QTimer.singleShot(0, poll)


@pytest.mark.parametrize("attach", [False, True], ids=["dont-attach", "attach"])
def test_an_imported_chat_sends_a_file_of_yours_only_once_you_attach_it(
    qtbot: QtBot,
    window: MainWindow,
    engine: FakeEngine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    attach: bool,
) -> None:
    home = tmp_path / "home"
    secret = home / ".config" / "gh" / "hosts.yml"
    secret.parent.mkdir(parents=True)
    secret.write_text(f"github.com:\n    oauth_token: {TOKEN}\n", encoding="utf-8")
    monkeypatch.setenv("HOME", str(home))
    shared = Conversation(title="Shared").to_dict()
    shared["messages"] = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi"},
    ]
    shared["documents"] = [str(secret)]
    chat_file = tmp_path / "shared.json"
    chat_file.write_text(json.dumps(shared), encoding="utf-8")
    monkeypatch.setattr(
        QFileDialog, "getOpenFileName", lambda *_a, **_k: (str(chat_file), "Lamplight JSON")
    )

    seen: list[list[str]] = []
    answer_review(window, attach, seen)
    conversation_files.ask_import(window.ctx)
    assert seen == [[f"Document: {secret}"]]
    qtbot.waitUntil(lambda: window.conversation.title == "Shared", timeout=5000)
    assert window.conversation.documents == ([str(secret)] if attach else [])

    window.chat_input.setPlainText("What does my config say?")
    with qtbot.waitSignal(window.replyEnded, timeout=120_000):
        window.send()
    sent = "\n".join(m.content for m in engine.requests[-1])
    assert "What does my config say?" in sent
    assert (TOKEN in sent) is attach
    saved = window.store.load(window.conversation.id)
    assert saved.documents == ([str(secret)] if attach else [])
