"""The Local API server dialog refuses what the server would (issue 26): every web
origin without a key, a body limit over the server's; it shows the address bound
(fake engine, real server on 127.0.0.1, port 0)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import keyring
import pytest
from PySide6.QtWidgets import QPushButton
from pytestqt.qtbot import QtBot

from app.api.config import MAX_BODY_MB
from app.config.setting_records import ApiSettings
from app.remote import keys
from tests.fakes.engine import FakeEngine
from tests.fakes.keyring import MemoryKeyring
from tests.fakes.window import WindowFactory, close_window
from ui.window import window_actions
from ui.window.main_window import MainWindow


@pytest.fixture()
def window(
    qtbot: QtBot, make_window: WindowFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[MainWindow]:
    before = keyring.get_keyring()
    monkeypatch.setattr(keys, "_memory", {})
    keyring.set_keyring(MemoryKeyring())
    win = make_window(FakeEngine(reply="Hi.", delay=0.01))
    try:
        yield win
    finally:
        close_window(qtbot, win)
        keyring.set_keyring(before)
    assert not [t for t in threading.enumerate() if t.name.startswith("lamplight-api")]


def test_every_origin_needs_a_key_in_the_dialog(window: MainWindow) -> None:
    dialog = window_actions.show_api_dialog(window)
    dialog.port_box.setValue(0)
    dialog.origins_edit.setText("*")
    dialog.enabled_box.setChecked(True)
    assert not dialog.apply()
    assert "any web page" in dialog.status.text() and "API key" in dialog.status.text()
    assert not window.api.running and window.settings.api == ApiSettings()  # nothing saved
    generate = dialog.findChild(QPushButton, "apiKeyGenerate")
    assert isinstance(generate, QPushButton)
    generate.click()
    assert dialog.apply(), dialog.status.text()
    assert window.api.running and window.settings.api.cors_origins == ("*",)


def test_the_body_limit_and_the_address_shown(window: MainWindow) -> None:
    window.settings.api = ApiSettings(max_body_mb=100)  # beyond the server's limit
    dialog = window_actions.show_api_dialog(window)
    assert dialog.body_box.maximum() == MAX_BODY_MB and dialog.body_box.value() == MAX_BODY_MB
    dialog.host_edit.setText("localhost")
    dialog.port_box.setValue(0)
    dialog.enabled_box.setChecked(True)
    assert dialog.apply(), dialog.status.text()
    assert window.settings.api.max_body_mb == MAX_BODY_MB
    url = window.api.url
    assert url.startswith("http://127.0.0.1:")  # bound there; localhost may be ::1
    assert url in dialog.status.text() and window.api.label.text() == f"API: {url}"
    # At start-up, a saved limit over the server's is a message, not a server.
    window.api.stop()
    assert f"at most {MAX_BODY_MB} MB" in window.api.start(
        ApiSettings(enabled=True, port=0, max_body_mb=100)
    )
    assert not window.api.running


def test_the_prompt_cache_shows_its_size_and_clears(qtbot: QtBot, window: MainWindow) -> None:
    """The window's data folder holds two saved openings: the dialog says so, and Clear
    empties the folder (on the engine's thread)."""
    from app.host import prompt_cache

    host = window.api.gateway.host
    folder = host._core.store.snapshots_dir.parent / prompt_cache.FOLDER  # type: ignore[union-attr]
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("pa.k1.lpkv", "pb.k2.lpkv"):
        (folder / name).write_bytes(b"x" * (3 << 20))
    dialog = window_actions.show_api_dialog(window)
    assert dialog.cache_label.text() == "2 saved prompts, 6 MB"
    assert dialog.clear_cache.isEnabled()
    dialog.clear_cache.click()
    assert dialog.cache_label.text() == "empty" and not dialog.clear_cache.isEnabled()
    qtbot.waitUntil(lambda: not list(folder.glob("*.lpkv")), timeout=5000)
