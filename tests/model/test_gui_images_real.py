"""A picture from the chat, end to end on the real engine with the test projector
(issue 30): the model and its mmproj in one folder are paired on load, a picture is
attached and sent, the follow-up reads only its own words, and the chat reopened from
its snapshot goes on without encoding the picture again."""

from __future__ import annotations

from pathlib import Path

from pytestqt.qtbot import QtBot

from app.config.setting_records import SamplingParams
from tests.model.test_gui_real import reopen_and_send, send
from tests.real_window import real_window
from tests.vision_model import IMAGE_TOKENS, image_bytes, projector_path


def paired_model(tmp_path: Path, model_path: Path) -> Path:
    """The default model with the test projector beside it (links, no copies)."""
    folder = tmp_path / "vision-model"
    folder.mkdir()
    model = folder / model_path.name
    model.symlink_to(model_path)
    (folder / "mmproj-gemma-3-270m-F16.gguf").symlink_to(projector_path())
    return model


def test_a_picture_is_read_once_and_resumes_from_the_snapshot(
    qtbot: QtBot, tmp_path: Path, model_path: Path
) -> None:
    model = paired_model(tmp_path, model_path)
    with real_window(qtbot, tmp_path, model, SamplingParams.greedy(16)) as win:
        info = win.loaded_model.info
        assert info is not None and info.projector == "mmproj-gemma-3-270m-F16.gguf"
        assert "sees images" in win.status_model.text() + win.status_model.toolTip()
        assert win.images.image_action.isEnabled()
        picture = tmp_path / "red.png"
        picture.write_bytes(image_bytes((200, 30, 30)))
        win.images.add_files([picture])
        qtbot.waitUntil(lambda: len(win.images.chips) == 1 and not win.images.busy, timeout=10_000)
        qtbot.waitUntil(lambda: win.images.counts is not None, timeout=10_000)
        assert win.images.counts == [IMAGE_TOKENS + 2]
        with qtbot.waitSignal(win.replyEnded, timeout=120_000):
            send(qtbot, win, "What is in this picture?")
        assert not win.images.chips  # sent: the strip is empty again
        session = win.session
        first = session.conversation.messages[-2]
        assert first.role == "user" and len(first.images) == 1
        metrics = session.conversation.messages[-1].message_metrics()
        assert metrics is not None and metrics.evaluated_tokens > IMAGE_TOKENS

        with qtbot.waitSignal(win.replyEnded, timeout=120_000):
            send(qtbot, win, "And its colour?")
        follow = session.conversation.messages[-1].message_metrics()
        assert follow is not None and follow.evaluated_tokens <= 20, follow

        again = reopen_and_send(qtbot, win, "Thanks.")
        assert again.evaluated_tokens <= 20, again
        assert again.cached_tokens > IMAGE_TOKENS
