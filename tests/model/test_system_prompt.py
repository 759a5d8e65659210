"""The system prompt: per chat, global default, per-model default; on the real model."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.chat.session_cache import RestoreResult
from app.chat.store import ConversationStore
from app.config.model_prefs import FILE_NAME, ModelPrefsStore, model_key
from app.config.paths import data_dirs
from app.config.setting_records import SamplingParams
from app.config.settings import AppSettings
from tests.fakes.engine import FakeEngine
from tests.real_window import ONE_THREAD, close, evaluated, send
from tests.real_window import open_window as _open_window
from ui.engine.worker import EngineClient
from ui.window.main_window import MainWindow

TURN = "<start_of_turn>user\n"


# One thread: on this 2-core machine shared with other runs, llama.cpp's two threads
# wait on each other at every step (measured: 15x slower than one under load).
def open_window(
    qtbot: QtBot, root: Path, model_path: Path, settings: AppSettings | None = None
) -> MainWindow:
    # The default model is a base model: these tests use its chat turns.
    return _open_window(qtbot, root, model_path, settings, chat_turns=True)


def test_chat_system_prompt_reaches_the_model_and_survives_reopen(
    qtbot: QtBot, tmp_path: Path, model_path: Path
) -> None:
    root = tmp_path / "data"
    win = open_window(qtbot, root, model_path)
    try:
        bar = win.prompt_controls.bar
        assert not bar.expanded
        win.prompt_controls.prompt_action.trigger()  # Chat → System prompt…
        assert bar.expanded and bar.editor.isVisible()
        qtbot.keyClicks(bar.editor, "Answer in French.")
        assert "Answer in French." in bar.summary.text()
        send(qtbot, win, "Hello")
        assert evaluated(win).startswith(f"{TURN}Answer in French.\n\nHello<end_of_turn>\n")
        conv_id = win.conversation.id
        store = win.store
        assert store.load(conv_id).system_prompt == "Answer in French."

        # Changed mid-conversation: the next reply reads everything again with it...
        bar.editor.setPlainText("Answer in German.")
        send(qtbot, win, "Again")
        second = win.reply_metrics[-1]
        assert second.cached_tokens < 8
        assert evaluated(win).startswith(f"{TURN}Answer in German.\n\nHello<end_of_turn>\n")
        # ...and the turns after it reuse the cache as before.
        send(qtbot, win, "More")
        third = win.reply_metrics[-1]
        assert third.cached_tokens >= second.prompt_tokens
        qtbot.waitUntil(lambda: store.load(conv_id).system_prompt == "Answer in German.")

        # A new chat has the default (none); reopening restores the chat's own prompt.
        win.new_chat()
        assert win.conversation.system_prompt == "" and bar.text() == ""
        with qtbot.waitSignal(win.conversationOpened, timeout=30_000) as opened:
            win.open_conversation(conv_id)
        result: RestoreResult = opened.args[0]
        assert result.restored  # its cache was made with this prompt
        assert bar.text() == "Answer in German."

        # Changed after the cache was saved: the saved cache must not be used as is.
        bar.editor.setPlainText("Answer in Italian.")
        win.new_chat()  # saves the chat with its new prompt
        assert store.load(conv_id).system_prompt == "Answer in Italian."
        with qtbot.waitSignal(win.conversationOpened, timeout=30_000):
            win.open_conversation(conv_id)
        send(qtbot, win, "Last")
        last = win.reply_metrics[-1]
        assert last.cached_tokens < 8
        text = evaluated(win)
        assert text.startswith(f"{TURN}Answer in Italian.\n\nHello") and "German" not in text
    finally:
        close(win)


def test_defaults_for_new_chats_the_model_before_the_global(
    qtbot: QtBot, tmp_path: Path, model_path: Path
) -> None:
    root = tmp_path / "data"
    win = open_window(qtbot, root, model_path)
    dirs = win.dirs
    key = model_key(model_path, model_path.stat().st_size)
    try:
        controls = win.prompt_controls
        bar = controls.bar
        bar.expand()
        bar.editor.setPlainText("Be brief.")
        qtbot.mouseClick(bar.global_button, Qt.MouseButton.LeftButton)
        assert AppSettings.load_from(dirs.settings_file).system_prompt == "Be brief."
        win.new_chat_action.trigger()
        assert win.conversation.system_prompt == "Be brief." and bar.text() == "Be brief."
        assert "the default for new chats" in bar.summary.text()
        send(qtbot, win, "Hi")
        assert evaluated(win).startswith(f"{TURN}Be brief.\n\nHi")

        win.new_chat()
        bar.editor.setPlainText("Talk like a pirate.")
        assert bar.clear_button.isHidden()
        qtbot.mouseClick(bar.model_button, Qt.MouseButton.LeftButton)
        assert ModelPrefsStore(root / FILE_NAME).get(key).system_prompt == "Talk like a pirate."
        assert not bar.clear_button.isHidden()
        win.new_chat()
        assert win.conversation.system_prompt == "Talk like a pirate."
        assert "this model's default" in bar.summary.text()
        send(qtbot, win, "Hi")
        assert evaluated(win).startswith(f"{TURN}Talk like a pirate.\n\nHi")
    finally:
        close(win)

    # Next start: the global default is in the settings, the model's in model_prefs.json.
    settings = AppSettings.load_from(dirs.settings_file)
    settings.load, settings.sampling = ONE_THREAD, SamplingParams.greedy(4)
    win = open_window(qtbot, root, model_path, settings)
    try:
        bar = win.prompt_controls.bar
        assert win.conversation.system_prompt == "Talk like a pirate."
        assert bar.text() == "Talk like a pirate."
        qtbot.mouseClick(bar.clear_button, Qt.MouseButton.LeftButton)
        assert ModelPrefsStore(root / FILE_NAME).get(key).system_prompt is None
        win.new_chat()
        assert win.conversation.system_prompt == "Be brief."
    finally:
        close(win)


def test_prompt_typed_then_switching_chats_is_saved_with_its_chat(
    qtbot: QtBot, tmp_path: Path
) -> None:
    """On the fake engine (fast): typing is applied at once and saved with the chat, and
    never leaks into the chat opened next."""
    fake = FakeEngine(delay=0.0)
    dirs = data_dirs(tmp_path / "data")
    store = ConversationStore(dirs.root)
    client = EngineClient(dirs.models, engine_factory=lambda: fake, store=store)
    win = MainWindow(client, AppSettings(), dirs, store)
    qtbot.addWidget(win)
    win.show()
    try:
        model = tmp_path / "model.gguf"
        model.write_bytes(b"fake model")
        with qtbot.waitSignal(win.modelReady, timeout=5000):
            win.load_model(model)
        bar = win.prompt_controls.bar
        with qtbot.waitSignal(win.replyEnded, timeout=5000):
            qtbot.keyClicks(win.chat_input, "first")
            qtbot.keyClick(win.chat_input, Qt.Key.Key_Return)
        first = win.conversation.id
        bar.expand()
        qtbot.keyClicks(bar.editor, "Be terse.")
        win.new_chat()  # before the save delay: the switch saves it
        assert store.load(first).system_prompt == "Be terse."
        assert win.conversation.system_prompt == "" and bar.text() == ""
        qtbot.wait(1000)  # the delayed save must not touch the new chat
        assert win.conversation.system_prompt == ""
        with qtbot.waitSignal(win.replyEnded, timeout=5000):
            qtbot.keyClicks(win.chat_input, "second")
            qtbot.keyClick(win.chat_input, Qt.Key.Key_Return)
        assert fake.requests[-1][0].role == "user"  # no system message was sent
        win.open_conversation(first)
        qtbot.waitUntil(lambda: bar.text() == "Be terse.")
        with qtbot.waitSignal(win.replyEnded, timeout=5000):
            qtbot.keyClicks(win.chat_input, "third")
            qtbot.keyClick(win.chat_input, Qt.Key.Key_Return)
        assert fake.requests[-1][0].role == "system"
        assert fake.requests[-1][0].content == "Be terse."
    finally:
        close(win)
