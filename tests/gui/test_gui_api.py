"""The window's local API server (fake engine, real server on 127.0.0.1, port 0): the
dialog, the status-bar line and its Stop, a chat message waiting for an API request."""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Iterator
from typing import Any

import keyring
import openai
import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QPushButton
from pytestqt.qtbot import QtBot

from app.config.setting_records import ApiSettings
from app.remote import keys
from tests.fakes.engine import FakeEngine
from tests.fakes.keyring import MemoryKeyring
from tests.fakes.window import WindowFactory, close_window, send
from tests.model.test_gui import LONG_REPLY
from ui.api.api_status import KEY_ID
from ui.window import window_actions
from ui.window.main_window import MainWindow


@pytest.fixture()
def memory_keyring(monkeypatch: pytest.MonkeyPatch) -> Iterator[MemoryKeyring]:
    before = keyring.get_keyring()
    monkeypatch.setattr(keys, "_memory", {})
    backend = MemoryKeyring()
    keyring.set_keyring(backend)
    yield backend
    keyring.set_keyring(before)


@pytest.fixture()
def fake() -> FakeEngine:
    return FakeEngine(reply=LONG_REPLY, delay=0.01)


@pytest.fixture()
def window(
    qtbot: QtBot, make_window: WindowFactory, fake: FakeEngine, memory_keyring: MemoryKeyring
) -> Iterator[MainWindow]:
    win = make_window(fake)
    yield win
    close_window(qtbot, win)
    assert not [t for t in threading.enumerate() if t.name == "lamplight-api"]


def api_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "lamplight-api" and t.is_alive()]


def serve(win: MainWindow) -> str:
    assert win.api.start(ApiSettings(enabled=True, port=0)) == ""
    return win.api.url


class Streamer:
    """An API chat stream on a plain thread (the GUI thread keeps running Qt)."""

    def __init__(self, url: str, max_tokens: int) -> None:
        self.text = ""
        self.finish: Any = None
        self.error: BaseException | None = None
        self._client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=30)
        self._thread = threading.Thread(target=self._run, args=(max_tokens,), name="streamer")
        self._thread.start()

    def _run(self, max_tokens: int) -> None:
        try:
            stream = self._client.chat.completions.create(
                model="model",  # the fake model's file is model.gguf
                messages=[{"role": "user", "content": "Count."}],
                max_tokens=max_tokens,
                stream=True,
            )
            for chunk in stream:
                if chunk.choices:
                    self.text += chunk.choices[0].delta.content or ""
                    self.finish = chunk.choices[0].finish_reason or self.finish
        except BaseException as exc:  # reported by join()
            self.error = exc

    def join(self, check: bool = True) -> None:
        self._thread.join(30)
        self._client.close()
        assert not self._thread.is_alive()
        if check and self.error is not None:
            raise self.error


def test_the_dialog_turns_the_server_on_and_off(qtbot: QtBot, window: MainWindow) -> None:
    assert not window.api.label.isVisible() and not api_threads()  # off by default
    dialog = window_actions.show_api_dialog(window)
    dialog.port_box.setValue(0)
    dialog.enabled_box.setChecked(True)
    assert dialog.apply()
    url = window.api.url
    assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
    assert window.api.label.isVisible() and window.api.label.text() == f"API: {url}"
    assert url in dialog.status.text()
    assert window.settings.api.enabled and window.settings.api.port == 0
    qtbot.mouseClick(window.api.label, Qt.MouseButton.LeftButton)
    assert QGuiApplication.clipboard().text() == url
    with openai.OpenAI(base_url=url, api_key="x", max_retries=0) as c:
        assert [m.id for m in c.models.list()] == ["model"]

    dialog.enabled_box.setChecked(False)
    assert dialog.apply()
    assert not window.api.running and not window.api.label.isVisible()
    assert not api_threads()
    assert not window.settings.api.enabled


def test_a_network_address_needs_a_key(window: MainWindow, memory_keyring: MemoryKeyring) -> None:
    dialog = window_actions.show_api_dialog(window)
    dialog.host_edit.setText("0.0.0.0")
    dialog.port_box.setValue(0)
    dialog.enabled_box.setChecked(True)
    assert not dialog.apply()
    assert "key" in dialog.status.text().lower()
    assert not window.api.running and window.settings.api == ApiSettings()  # nothing saved

    key_edit = dialog.key_edit
    generate = dialog.findChild(QPushButton, "apiKeyGenerate")
    assert isinstance(generate, QPushButton)
    generate.click()
    assert key_edit.text().startswith("lamplight-") and len(key_edit.text()) > 40
    assert key_edit.echoMode() == key_edit.EchoMode.Normal  # shown after Generate
    assert dialog.apply(), dialog.status.text()
    assert window.api.running and window.settings.api.host == "0.0.0.0"
    assert memory_keyring.values[(keys.SERVICE, KEY_ID)] == key_edit.text()
    assert key_edit.text() not in window.settings.to_json()  # never in the settings file
    with (
        openai.OpenAI(
            base_url=window.api.url.replace("0.0.0.0", "127.0.0.1"), api_key="x", max_retries=0
        ) as c,
        pytest.raises(openai.AuthenticationError),
    ):
        c.models.list()


def test_a_busy_port_is_a_message_not_a_crash(window: MainWindow) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        dialog = window_actions.show_api_dialog(window)
        dialog.port_box.setValue(port)
        dialog.enabled_box.setChecked(True)
        assert not dialog.apply()
        assert f"Port {port}" in dialog.status.text() and "in use" in dialog.status.text()
        assert not dialog.enabled_box.isChecked() and not window.api.running
        # At start-up, with the server switched on in the settings: a notice.
        window.settings.api = ApiSettings(enabled=True, port=port)
        window.start_engine(window.session.model.path if window.session.model else None)
        assert "did not start" in window.transcript.toPlainText()
    assert not api_threads()


def test_the_status_line_shows_a_request_and_stops_it(qtbot: QtBot, window: MainWindow) -> None:
    url = serve(window)
    streamer = Streamer(url, max_tokens=2000)
    label = window.api.label
    qtbot.waitUntil(lambda: "replying to 127.0.0.1" in label.text(), timeout=5000)
    qtbot.waitUntil(
        lambda: re.search(r" · [1-9][0-9]* tokens$", label.text()) is not None, timeout=5000
    )
    assert window.api.stop_button.isVisible()
    qtbot.mouseClick(window.api.stop_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not streamer._thread.is_alive(), timeout=5000)
    streamer.join(check=False)
    # Cut short: the client is told so (an error event, no [DONE]), not "stop".
    assert isinstance(streamer.error, openai.APIError), streamer.error
    assert streamer.error.code == "request_stopped" and streamer.finish is None
    assert streamer.text.startswith("w0 w1") and "w1999" not in streamer.text
    qtbot.waitUntil(lambda: label.text() == f"API: {url}", timeout=2000)
    assert not window.api.stop_button.isVisible()


def test_a_chat_message_waits_for_the_api_request(
    qtbot: QtBot, window: MainWindow, fake: FakeEngine
) -> None:
    url = serve(window)
    # 300 tokens, 10 ms apart: the request still runs when the window's message is sent,
    # however busy the machine (40 ended first twice on a loaded two-core CI machine).
    streamer = Streamer(url, max_tokens=300)
    qtbot.waitUntil(lambda: window.api.running_job() is not None, timeout=5000)
    fake.reply = "Only the window's reply."  # read when the next job starts
    with qtbot.waitSignal(window.replyEnded, timeout=20000) as blocker:
        send(qtbot, window, "Hello from the window")
        assert "Waiting for the API request from 127.0.0.1" in window.transcript.toPlainText()
        assert window.status_speed.text() == "waiting for the API request…"
    assert blocker.args == ["finished"]
    streamer.join()
    assert streamer.text == " ".join(f"w{i}" for i in range(300))  # all of it, in order
    assert streamer.finish in ("stop", "length")  # the fake reports its limit as an end
    assert [m.content for m in window.conversation.messages] == [
        "Hello from the window",
        "Only the window's reply.",
    ]
    shown = window.transcript.toPlainText()
    assert "Only the window's reply." in shown and "w1 w2" not in shown


def test_closing_the_window_stops_the_server_first(
    qtbot: QtBot, make_window: WindowFactory, fake: FakeEngine, memory_keyring: MemoryKeyring
) -> None:
    win = make_window(fake)
    url = serve(win)
    streamer = Streamer(url, max_tokens=2000)
    qtbot.waitUntil(lambda: win.api.running_job() is not None, timeout=5000)
    assert api_threads()
    win.close()
    assert not api_threads() and not win.client.engine_thread.isRunning()
    streamer.join(check=False)  # ended (cut off, or stopped), not hanging
    assert "w1999" not in streamer.text
