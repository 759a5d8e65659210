"""Documents in the window with a fake library and engine: the Attach menu, the file and
folder dialogs, drops, the documents bar (progress, cancel, errors), collections, and
sending with passages (Stop during the search keeps the text)."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QApplication, QFileDialog, QInputDialog, QMessageBox
from pytestqt.qtbot import QtBot

from app.chat.composer import MIN_ROOM
from app.util.errors import DocumentError
from tests.fakes.documents import FakeEmbedder, FakeLibrary
from tests.fakes.engine import VISION_CAPABILITIES, FakeEngine
from tests.fakes.window import WindowFactory, close_window
from ui.chat.collections_dialog import CollectionsDialog
from ui.chat.document_bar import ChipState, detail_text
from ui.window import send_flow
from ui.window.main_window import MainWindow


@pytest.fixture()
def library(monkeypatch: pytest.MonkeyPatch) -> FakeLibrary:
    lib = FakeLibrary()
    fake: Any = lib
    monkeypatch.setattr(send_flow, "make_documents", lambda _root: (FakeEmbedder(), fake))
    return lib


@pytest.fixture()
def window(
    qtbot: QtBot, make_window: WindowFactory, library: FakeLibrary, monkeypatch: pytest.MonkeyPatch
) -> Iterator[MainWindow]:
    def warn(*args: Any, **_k: Any) -> None:
        raise AssertionError(f"a message box: {args[1:]}")

    monkeypatch.setattr(QMessageBox, "warning", warn)
    engine = FakeEngine()
    engine.caps = VISION_CAPABILITIES
    win = make_window(engine)
    yield win
    close_window(qtbot, win)
    assert library.closed


def docs(tmp_path: Path, *names: str) -> list[Path]:
    out = []
    for name in names:
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.suffix == ".png":
            buf = io.BytesIO()
            Image.new("RGB", (20 + len(name), 20), "red").save(buf, "PNG")
            p.write_bytes(buf.getvalue())
        else:
            p.write_text(f"text of {name}\n")
        out.append(p)
    return out


def states(win: MainWindow) -> dict[str, str]:
    return {Path(c.item.key).name: c.item.state for c in win.documents.bar.chips}


def indexed(qtbot: QtBot, win: MainWindow, n: int) -> None:
    qtbot.waitUntil(
        lambda: not win.documents.busy and len(win.documents.bar.chips) == n, timeout=5000
    )


def drop(widget: object, paths: list[Path]) -> None:
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    left, none = Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier
    enter = QDragEnterEvent(QPoint(5, 5), Qt.DropAction.CopyAction, mime, left, none)
    QApplication.sendEvent(widget, enter)  # type: ignore[arg-type]
    event = QDropEvent(QPointF(5, 5), Qt.DropAction.CopyAction, mime, left, none)
    QApplication.sendEvent(widget, event)  # type: ignore[arg-type]


def test_detail_text() -> None:
    assert detail_text(ChipState("/a", "a", "ready", n_chunks=12, pages=3)) == (
        "ready · 12 chunks · 3 pages"
    )
    assert detail_text(ChipState("c", "c", "collection", collection=True, n_documents=1)) == (
        "collection · 1 document"
    )


def test_attach_menu_entries(window: MainWindow) -> None:
    texts = [a.text() for a in window.images.menu.actions()]
    assert texts == ["Image…", "Documents…", "Folder…", "Collection…"]
    assert window.images.button.text() == "Attach"
    assert not window.documents.bar.isVisible()  # none yet


def test_documents_dialog_and_bar(
    qtbot: QtBot,
    window: MainWindow,
    tmp_path: Path,
    library: FakeLibrary,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    picked = docs(tmp_path, "report.pdf", "notes.md", "broken.txt")
    library.errors["broken.txt"] = "It is not text."
    seen: list[str] = []

    def pick(*args: Any, **_k: Any) -> tuple[list[str], str]:
        seen.append(args[3])
        return [str(p) for p in picked], ""

    monkeypatch.setattr(QFileDialog, "getOpenFileNames", pick)
    window.documents.documents_action.trigger()
    indexed(qtbot, window, 3)
    assert "*.pdf" in seen[0] and "*.md" in seen[0]
    assert states(window) == {"report.pdf": "ready", "notes.md": "ready", "broken.txt": "error"}
    assert window.conversation.documents == sorted(str(p) for p in picked)  # expanded
    bad = window.documents.bar.chip(str(picked[2]))
    assert bad is not None and "It is not text." in bad.toolTip()
    assert "d1242f" in bad.detail.styleSheet()
    assert window.documents.bar.isVisible()
    assert not window.documents.bar.progress_row.isVisible()
    # × removes it from the conversation.
    bad.remove_button.click()
    assert window.conversation.documents == sorted(str(p) for p in picked[:2])
    assert len(window.documents.bar.chips) == 2


def test_folder_is_expanded(
    qtbot: QtBot,
    window: MainWindow,
    tmp_path: Path,
    library: FakeLibrary,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    folder = tmp_path / "folder"
    docs(folder, "a.md", "sub/b.txt", "skip.bin")
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: str(folder))
    window.documents.folder_action.trigger()
    indexed(qtbot, window, 2)
    assert sorted(states(window)) == ["a.md", "b.txt"]
    assert library.add_calls == [[str(folder / "a.md"), str(folder / "sub" / "b.txt")]]


def test_drop_mix_splits_images_documents_and_unsupported(
    qtbot: QtBot, window: MainWindow, tmp_path: Path
) -> None:
    window.chat_input.setPlainText("keep")
    dropped = docs(tmp_path, "a.pdf", "b.md", "pic.png", "tool.exe")
    drop(window.chat_input.viewport(), dropped)
    indexed(qtbot, window, 2)
    qtbot.waitUntil(lambda: len(window.images.chips) == 1 and not window.images.busy)
    assert sorted(states(window)) == ["a.pdf", "b.md"]
    assert "tool.exe" in window.documents.bar.note.text()
    assert window.chat_input.toPlainText() == "keep"
    # Pictures alone still go to the images, on the transcript too.
    drop(window.transcript.viewport(), docs(tmp_path, "second.png"))
    qtbot.waitUntil(lambda: len(window.images.chips) == 2 and not window.images.busy)


def test_progress_and_cancel(
    qtbot: QtBot, window: MainWindow, tmp_path: Path, library: FakeLibrary
) -> None:
    library.gate.clear()
    window.documents.add_paths(docs(tmp_path, "one.md", "two.md", "three.md"))
    bar = window.documents.bar
    qtbot.waitUntil(lambda: bar.progress_label.text() == "Indexing 1 of 3 · one.md")
    assert bar.progress_row.isVisible() and window.documents.busy
    assert states(window)["one.md"] == "embedding" and states(window)["two.md"] == "queued"
    bar.cancel_button.click()
    qtbot.waitUntil(lambda: not window.documents.busy, timeout=5000)
    assert library.cancelled.is_set()
    assert not bar.progress_row.isVisible()
    library.gate.set()


def test_switching_conversations_shows_each_ones_documents(
    qtbot: QtBot, window: MainWindow, tmp_path: Path
) -> None:
    first = docs(tmp_path, "first.md", "gone.md")
    window.documents.add_paths(first)
    indexed(qtbot, window, 2)
    window.chat_input.setPlainText("hello")
    with qtbot.waitSignal(window.replyEnded, timeout=5000):
        window.send()
    first_id = window.conversation.id
    window.new_chat()
    assert window.documents.bar.chips == [] and not window.documents.bar.isVisible()
    window.documents.add_paths(docs(tmp_path, "second.md"))
    indexed(qtbot, window, 1)
    assert list(states(window)) == ["second.md"]
    first[1].unlink()
    window.open_conversation(first_id)
    qtbot.waitUntil(lambda: states(window).get("gone.md") == "missing", timeout=5000)
    assert states(window)["first.md"] == "ready"


def test_send_with_documents_passes_sources(
    qtbot: QtBot, window: MainWindow, tmp_path: Path, library: FakeLibrary
) -> None:
    paths = docs(tmp_path, "report.pdf")
    window.documents.add_paths(paths)
    indexed(qtbot, window, 1)
    window.chat_input.setPlainText("what does it say?")
    with qtbot.waitSignal(window.replyEnded, timeout=5000):
        window.send()
    (called, query, room, whole) = library.context_calls[0]
    assert called == [str(paths[0])] and query == "what does it say?" and room > 0
    assert whole == set()
    user = window.conversation.messages[-2]
    assert user.role == "user" and user.sources[0]["path"] == str(paths[0])
    # Counted with the model's tokenizer on the engine thread (the fake's: words), not
    # estimated at 3 characters a token.
    assert library.count is not None and library.count("one two three") == 3
    info, settings = window.ctx.model.info, window.ctx.settings.value
    assert info is not None
    assert room == max(MIN_ROOM, info.n_ctx - 4 - settings.sampling.max_tokens)
    assert window.chat_input.toPlainText() == ""


def test_stop_during_search_keeps_text(
    qtbot: QtBot, window: MainWindow, tmp_path: Path, library: FakeLibrary
) -> None:
    window.documents.add_paths(docs(tmp_path, "a.md"))
    indexed(qtbot, window, 1)
    library.gate.clear()
    window.chat_input.setPlainText("my question")
    window.send()
    assert window.send_flow.searching and window.stop_button.isEnabled()
    assert window.status_speed.text() == send_flow.SEARCHING
    window.stop()
    qtbot.waitUntil(library.cancelled.is_set, timeout=5000)
    assert not window.send_flow.searching
    assert window.chat_input.toPlainText() == "my question"
    assert window.conversation.messages == []
    library.gate.set()


def test_search_error_is_a_notice_and_nothing_is_sent(
    qtbot: QtBot, window: MainWindow, tmp_path: Path, library: FakeLibrary
) -> None:
    window.documents.add_paths(docs(tmp_path, "a.md"))
    indexed(qtbot, window, 1)
    library.context_error = DocumentError("The embedding model could not be loaded.")
    window.chat_input.setPlainText("question")
    window.send()
    qtbot.waitUntil(lambda: not window.send_flow.searching, timeout=5000)
    assert window.chat_input.toPlainText() == "question"
    assert window.conversation.messages == []


def test_collections_save_pick_rename_delete(
    qtbot: QtBot,
    window: MainWindow,
    tmp_path: Path,
    library: FakeLibrary,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    paths = docs(tmp_path, "a.md", "b.md")
    dialog = CollectionsDialog(library.collections, [str(p) for p in paths], window)  # type: ignore[arg-type]
    monkeypatch.setattr(QInputDialog, "getText", lambda *a, **k: ("Work", True))
    dialog.ask_save()
    assert library.collections.paths("Work") == [str(p) for p in paths]
    assert dialog.selected() == "Work"
    monkeypatch.setattr(QInputDialog, "getText", lambda *a, **k: ("Job", True))
    dialog.ask_rename()
    assert library.collections.names() == ["Job"]
    dialog.accept_selected()
    assert dialog.chosen == "Job"
    # Picking it attaches the collection (its files are indexed, not listed as documents).
    window.documents.attach_collection("Job")
    indexed(qtbot, window, 1)
    assert window.conversation.collections == ["Job"] and window.conversation.documents == []
    chip = window.documents.bar.chips[0]
    assert chip.item.collection and chip.detail.text() == "collection · 2 documents"
    assert window.documents.paths() == [str(p) for p in paths]
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Yes)
    dialog.ask_delete()
    assert library.collections.names() == []
    dialog.deleteLater()


def test_search_for_a_chat_left_meanwhile_sends_nothing(
    qtbot: QtBot, window: MainWindow, tmp_path: Path, library: FakeLibrary
) -> None:
    window.documents.add_paths(docs(tmp_path, "a.md"))
    indexed(qtbot, window, 1)
    library.gate.clear()
    window.chat_input.setPlainText("question")
    window.send()
    assert window.send_flow.searching
    window.new_chat()
    library.gate.set()
    qtbot.waitUntil(lambda: not window.send_flow.searching, timeout=5000)
    assert window.conversation.messages == []
    assert window.chat_input.toPlainText() == "question"


class _Host:
    """An engine host whose queue runs a task at once, or never (an engine busy)."""

    def __init__(self, engine: Any, runs: bool = True) -> None:
        self.engine, self.runs, self.posted = engine, runs, 0

    def post(self, task: Any) -> bool:
        self.posted += 1
        if self.runs:
            task()
        return True


def test_the_engine_counts_where_it_can_and_the_estimate_stands_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class _Counts:
        def __init__(self, n: int) -> None:
            self.n = n

        def count_tokens(self, text: str) -> int:
            return self.n

    host: Any = _Host(_Counts(7))
    assert send_flow.engine_counter(host, threading.Event())("a" * 30) == 7
    host = _Host(_Counts(0))  # a backend that cannot count (an OpenAI-compatible server)
    assert send_flow.engine_counter(host, threading.Event())("a" * 30) == 10
    monkeypatch.setattr(send_flow, "COUNT_WAIT_S", 0.1)
    busy = _Host(_Counts(7), runs=False)
    count = send_flow.engine_counter(busy, threading.Event())
    assert count("a" * 30) == 10 and count("b" * 30) == 10
    assert busy.posted == 1  # once the engine was found busy, not asked again
