"""Images in the window with a fake engine: attach (button, paste, drop), chips, the
token count, sending, thumbnails in the transcript, the viewer, a model without vision."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QImage
from PySide6.QtWidgets import QApplication, QFileDialog
from pytestqt.qtbot import QtBot

from app.chat.composer import NO_VISION
from tests.fakes.engine import IMAGE_TOKENS, VISION_CAPABILITIES, FakeEngine
from tests.fakes.window import WindowFactory
from tests.hypothesis_budget import examples
from ui.chat.image_attach import MAX_ATTACHMENTS, tokens_text
from ui.chat.image_viewer import MISSING, ImageViewer, read_image
from ui.window.main_window import MainWindow


def png(width: int = 40, height: int = 30, color: str = "yellow") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, "PNG")
    return out.getvalue()


@pytest.fixture()
def fake() -> FakeEngine:
    engine = FakeEngine()
    engine.caps = VISION_CAPABILITIES
    return engine


def files(tmp_path: Path, *names: str) -> list[Path]:
    out = []
    for i, name in enumerate(names):
        p = tmp_path / name
        p.write_bytes(png(40 + i, 30, ("red", "green", "blue", "white")[i % 4]))
        out.append(p)
    return out


def attach(qtbot: QtBot, win: MainWindow, n: int) -> None:
    qtbot.waitUntil(lambda: len(win.images.chips) == n and not win.images.busy, timeout=5000)


def test_tokens_text() -> None:
    assert tokens_text([64]) == "This image uses 64 tokens"
    assert tokens_text([64, 64, 64]) == "3 images use 192 tokens"
    assert tokens_text([]) == "" and tokens_text([0]) == ""


def test_attach_by_button_shows_chips_and_tokens(
    qtbot: QtBot, window: MainWindow, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    picked = files(tmp_path, "cat.png", "dog.png")
    monkeypatch.setattr(
        QFileDialog, "getOpenFileNames", lambda *a, **k: ([str(p) for p in picked], "")
    )
    assert window.images.image_action.isEnabled()
    window.images.image_action.trigger()
    attach(qtbot, window, 2)
    assert window.images.strip.isVisible()
    assert "cat.png" in window.images.chips[0].label.text()
    qtbot.waitUntil(lambda: window.images.counts is not None, timeout=5000)
    assert window.images.strip.tokens.text().startswith(f"2 images use {2 * IMAGE_TOKENS} tokens")
    assert window.send_button.isEnabled()  # pictures alone make a message


def test_remove_a_chip(qtbot: QtBot, window: MainWindow, tmp_path: Path) -> None:
    window.images.add_files(files(tmp_path, "a.png", "b.png"))
    attach(qtbot, window, 2)
    qtbot.mouseClick(window.images.chips[0].remove_button, Qt.MouseButton.LeftButton)
    assert [c.part.name for c in window.images.chips] == ["b.png"]
    qtbot.waitUntil(lambda: window.images.counts == [IMAGE_TOKENS], timeout=5000)
    assert window.images.strip.tokens.text().startswith("This image uses 64 tokens")


def test_paste_image_data_and_files(qtbot: QtBot, window: MainWindow, tmp_path: Path) -> None:
    window.chat_input.setPlainText("look: ")
    mime = QMimeData()
    mime.setData("image/png", png())
    QApplication.clipboard().setMimeData(mime)
    window.chat_input.paste()
    attach(qtbot, window, 1)
    assert window.chat_input.toPlainText() == "look: "
    assert window.images.chips[0].part.mime == "image/png"
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in files(tmp_path, "x.jpg.png")])
    QApplication.clipboard().setMimeData(mime)
    window.chat_input.paste()
    attach(qtbot, window, 2)
    assert window.chat_input.toPlainText() == "look: "  # no path pasted as text


def drop(widget: object, paths: list[Path]) -> None:
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    left, none = Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier
    # A drop goes to the widget that took the drag's enter (Qt's drag manager).
    enter = QDragEnterEvent(QPoint(5, 5), Qt.DropAction.CopyAction, mime, left, none)
    QApplication.sendEvent(widget, enter)  # type: ignore[arg-type]
    event = QDropEvent(QPointF(5, 5), Qt.DropAction.CopyAction, mime, left, none)
    QApplication.sendEvent(widget, event)  # type: ignore[arg-type]


def test_drop_on_input_and_transcript(qtbot: QtBot, window: MainWindow, tmp_path: Path) -> None:
    drop(window.chat_input.viewport(), files(tmp_path, "one.png"))
    attach(qtbot, window, 1)
    drop(window.transcript.viewport(), files(tmp_path, "x.png", "two.png", "three.png")[1:])
    attach(qtbot, window, 3)
    assert window.chat_input.toPlainText() == ""


def test_bad_file_keeps_other_chips_and_text(
    qtbot: QtBot, window: MainWindow, tmp_path: Path
) -> None:
    window.chat_input.setPlainText("my words")
    good = files(tmp_path, "good.png")
    bad = tmp_path / "bad.png"
    bad.write_bytes(png()[:60])  # truncated
    window.images.add_files([*good, bad])
    qtbot.waitUntil(lambda: not window.images.busy, timeout=5000)
    assert [c.part.name for c in window.images.chips] == ["good.png"]
    note = window.images.strip.note.text()
    assert "bad.png was not attached" in note
    assert window.images.strip.note.isVisible()
    assert window.chat_input.toPlainText() == "my words"


def test_a_failed_attach_shows_its_note_without_an_empty_chip_row(
    qtbot: QtBot, window: MainWindow, tmp_path: Path
) -> None:
    """Before: after a failed attach the strip showed its empty chip row (its full
    height) above the note."""
    images = window.images
    strip = images.strip
    bad = tmp_path / "bad.png"
    bad.write_bytes(png()[:60])  # truncated
    images.add_files([bad])
    qtbot.waitUntil(lambda: not images.busy, timeout=5000)
    assert not images.chips and "bad.png was not attached" in strip.note.text()
    assert strip.isVisible() and strip.note.isVisible()
    assert not strip.area.isVisible() and not strip.tokens.isVisible()
    assert strip.sizeHint().height() < strip.area.height()  # the note's room, no more
    images.add_files(files(tmp_path, "good.png"))
    attach(qtbot, window, 1)
    assert strip.area.isVisible() and strip.tokens.isVisible()
    images.remove(images.chips[0])
    assert not strip.isVisible()  # nothing left: no room taken


def test_at_most_eight(qtbot: QtBot, window: MainWindow, tmp_path: Path) -> None:
    names = [f"p{i}.png" for i in range(MAX_ATTACHMENTS + 1)]
    window.images.add_files(files(tmp_path, *names))
    qtbot.waitUntil(lambda: not window.images.busy, timeout=5000)
    assert len(window.images.chips) == MAX_ATTACHMENTS
    assert f"at most {MAX_ATTACHMENTS}" in window.images.strip.note.text()


def test_send_passes_images_and_shows_thumbnail_and_viewer(
    qtbot: QtBot, window: MainWindow, fake: FakeEngine, tmp_path: Path
) -> None:
    window.images.add_files(files(tmp_path, "cat.png"))
    attach(qtbot, window, 1)
    digest = window.images.chips[0].part.digest
    qtbot.keyClicks(window.chat_input, "what is this?")
    with qtbot.waitSignal(window.replyEnded, timeout=5000):
        qtbot.keyClick(window.chat_input, Qt.Key.Key_Return)
    assert not window.images.chips and not window.images.strip.isVisible()
    sent = fake.requests[-1][-1]
    assert [i.digest for i in sent.images] == [digest]
    assert window.conversation.messages[0].images[0]["digest"] == digest
    html = window.transcript.toHtml()
    assert f"lamplight-image:{digest}" in html
    assert window.transcript.images.activate(0, 0)
    viewer = window.transcript.images.viewer
    assert isinstance(viewer, ImageViewer)
    qtbot.waitUntil(viewer.isVisible, timeout=3000)
    assert viewer.image.width() == 40 and viewer.copy_button.isEnabled()
    viewer.toggle_zoom()
    assert not viewer.fitted
    viewer.copy_image()
    assert QApplication.clipboard().image().width() == 40
    viewer.close()


def test_reopened_chat_shows_images_and_missing_placeholder(
    qtbot: QtBot, window: MainWindow, tmp_path: Path
) -> None:
    window.images.add_files(files(tmp_path, "a.png", "b.png"))
    attach(qtbot, window, 2)
    digests = [c.part.digest for c in window.images.chips]
    with qtbot.waitSignal(window.replyEnded, timeout=5000):
        window.send()
    conv_id = window.conversation.id
    path = window.store.images.path(digests[1])
    assert path is not None
    path.unlink()
    window.transcript.images.cache = type(window.transcript.images.cache)()
    window.new_chat()
    with qtbot.waitSignal(window.conversationOpened, timeout=5000):
        window.open_conversation(conv_id)
    html = window.transcript.toHtml()
    assert all(d in html for d in digests)
    assert MISSING in html  # the tooltip of the placeholder
    assert window.transcript.images.activate(0, 1)
    viewer = window.transcript.images.viewer
    assert viewer is not None and MISSING in viewer.label.text()
    viewer.close()


def test_non_vision_model_disables_and_explains(
    make_window: WindowFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    win = make_window(FakeEngine())
    assert not win.images.image_action.isEnabled()
    assert win.images.image_action.toolTip() == NO_VISION
    win.chat_input.setPlainText("keep me")
    drop(win.chat_input.viewport(), files(tmp_path, "a.png"))
    assert not win.images.chips and not win.images.busy
    assert NO_VISION in win.images.strip.note.text()
    mime = QMimeData()
    mime.setImageData(QImage(png(), "PNG"))  # type: ignore[call-overload]
    mime.setText(" and this")
    QApplication.clipboard().setMimeData(mime)
    win.chat_input.moveCursor(win.chat_input.textCursor().MoveOperation.End)
    win.chat_input.paste()
    assert win.chat_input.toPlainText() == "keep me and this"  # the text still pastes


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=400), cut=st.integers(0, 200), flip=st.integers(0, 255))
def test_thumbnails_of_hostile_bytes_never_raise(data: bytes, cut: int, flip: int) -> None:
    good = bytearray(png(8, 8))
    if cut < len(good):
        good[cut] ^= flip
    for blob in (data, bytes(good), bytes(good[:cut])):
        image = read_image(blob, 64)
        assert image.isNull() or max(image.width(), image.height()) <= 64
