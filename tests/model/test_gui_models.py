"""The model manager window against the local Hub server, down to loading the real model."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QMessageBox, QProgressBar
from pytestqt.qtbot import QtBot

from app.chat.store import ConversationStore
from app.config.paths import data_dirs
from app.config.settings import AppSettings
from app.models.downloader import FileFetcher
from app.models.downloads import DownloadQueue
from app.models.hub import HubClient
from app.models.library import Library
from tests.conftest import TEST_LOAD
from tests.fakes.engine import FakeEngine
from tests.fakes.window import close_window, hub_services
from tests.hub_server import HubServer, serving_hub
from tests.real_window import open_window
from ui.engine.worker import EngineClient
from ui.models.hub_workers import HubServices
from ui.models.model_manager import ModelManager
from ui.window.main_window import MainWindow


@pytest.fixture()
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, model_path: Path) -> Iterator[HubServer]:
    with serving_hub(monkeypatch, tmp_path / "hf-home") as server:
        server.add_repo(
            "google/gemma-3-270m-GGUF",
            {"gemma-3-270m-Q4_K_M.gguf": model_path},
            downloads=1000,
            likes=10,
        )
        server.add_repo("acme/small-GGUF", {"small-Q8_0.gguf": b"GGUF" + b"\0" * 64}, downloads=5)
        yield server


@pytest.fixture()
def window(qtbot: QtBot, tmp_path: Path, hub: HubServer) -> Iterator[MainWindow]:
    dirs = data_dirs(tmp_path / "data")
    services = hub_services(dirs)
    win = open_window(qtbot, dirs.root, None, AppSettings(load=TEST_LOAD), services=services)
    yield win
    close_window(qtbot, win)


def manager(qtbot: QtBot, win: MainWindow) -> ModelManager:
    win.manager_action.trigger()
    m = win.model_manager
    assert m is not None and m.isVisible() and m.objectName() == "modelManager"
    return m


def test_search_download_and_load(qtbot: QtBot, window: MainWindow, hub: HubServer) -> None:
    m = manager(qtbot, window)
    qtbot.keyClicks(m.search_box, "gemma")
    qtbot.keyClick(m.search_box, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: m.results.count() == 1, timeout=10_000)
    assert "google/gemma-3-270m-GGUF" in m.results.item(0).text()
    m.results.setCurrentRow(0)
    qtbot.waitUntil(lambda: m.repo_files.rowCount() == 1, timeout=10_000)
    assert m.repo_files.item(0, 1).text() == "Q4_K_M"
    assert "MB" in m.repo_files.item(0, 2).text()
    assert m.repo_files.item(0, 3).text() in ("fits", "tight", "too big")

    hub.throttle(60 * 1024 * 1024)  # slow enough to see the bar move
    m.repo_files.selectRow(0)
    assert m.download_button.isEnabled()
    qtbot.mouseClick(m.download_button, Qt.MouseButton.LeftButton)
    assert m.tabs.currentIndex() == 2 and m.downloads_page.table.rowCount() == 1
    bar = m.downloads_page.table.cellWidget(0, 1)
    assert isinstance(bar, QProgressBar)
    qtbot.waitUntil(lambda: 0 < bar.value() < 1000, timeout=20_000)
    qtbot.waitUntil(lambda: "MB/s" in m.downloads_page.table.item(0, 2).text(), timeout=20_000)
    assert "left" in m.downloads_page.table.item(0, 2).text()
    qtbot.waitUntil(lambda: bar.value() == 1000, timeout=60_000)
    qtbot.waitUntil(lambda: m.library_table.rowCount() == 1, timeout=10_000)
    assert "Gemma 3 270m" in m.library_table.item(0, 0).text()
    assert m.library_table.item(0, 3).text() == "Q4_K_M"

    m.library_table.selectRow(0)
    with qtbot.waitSignal(window.modelReady, timeout=60_000) as blocker:
        qtbot.mouseClick(m.load_button, Qt.MouseButton.LeftButton)
    assert blocker.args[0].name == "Gemma 3 270m"


def test_hub_errors_show_in_the_window(qtbot: QtBot, window: MainWindow, hub: HubServer) -> None:
    m = manager(qtbot, window)
    hub.remove_repo("acme/small-GGUF")  # listed a moment ago, gone when opened
    m._details_request = m._services.details("acme/small-GGUF")
    qtbot.waitUntil(lambda: "not found on the Hub" in m.repo_title.text(), timeout=10_000)
    assert not m.download_button.isEnabled()


def test_an_offline_search_says_so_in_seconds(qtbot: QtBot, tmp_path: Path) -> None:
    """Offline, "Searching…" stood for about a minute (the Hub library's retries, with no
    connect timeout); now the window says the Hub could not be reached at once."""
    with HubServer() as stopped:  # its port now refuses: the Hub is out of reach
        url = stopped.url
    dirs = data_dirs(tmp_path / "data")
    store = ConversationStore(dirs.root)
    services = HubServices(
        HubClient(endpoint=url),
        Library(dirs.models, dirs.root / "library.json", hf_cache=False),
        DownloadQueue(dirs.models, dirs.root / "downloads.json", FileFetcher(read_timeout=5)),
    )
    client = EngineClient(dirs.models, engine_factory=lambda: FakeEngine(), store=store)
    win = MainWindow(client, AppSettings(), dirs, store, services)
    qtbot.addWidget(win)
    win.show()
    try:
        m = manager(qtbot, win)
        qtbot.keyClicks(m.search_box, "gemma")
        started = time.monotonic()
        qtbot.keyClick(m.search_box, Qt.Key.Key_Return)
        assert m.discover_status.text() == "Searching…"
        qtbot.waitUntil(
            lambda: "could not reach the Hub" in m.discover_status.text(), timeout=10_000
        )
        assert time.monotonic() - started < 5
        assert "Are you online?" in m.discover_status.text()
    finally:
        win.close()
        qtbot.waitUntil(lambda: win.closed, timeout=15_000)


def test_invalid_files_are_listed_with_a_reason_and_can_be_deleted(
    qtbot: QtBot, window: MainWindow, monkeypatch: pytest.MonkeyPatch
) -> None:
    models = window.dirs.models
    (models / "broken.gguf").write_bytes(b"junk")
    m = manager(qtbot, window)
    qtbot.waitUntil(lambda: m.library_table.rowCount() == 1, timeout=10_000)
    assert "invalid" in m.library_table.item(0, 7).text()
    m.library_table.selectRow(0)
    assert not m.load_button.isEnabled() and m.delete_button.isEnabled()
    # Show in folder where nothing opens folders: the folder is named, not nothing.
    monkeypatch.setattr(QDesktopServices, "openUrl", lambda _url: False)
    m.show_selected()
    assert m.path_note is not None and m.path_note.isVisible()
    assert "opened the model's folder" in m.path_note.text()
    assert str(models) in m.path_note.text()
    m.path_note.close()
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Yes)
    m.delete_selected()
    assert not (models / "broken.gguf").exists()
    qtbot.waitUntil(lambda: m.library_table.rowCount() == 0, timeout=10_000)


def test_a_loaded_model_is_deleted_only_once_the_engine_let_go_of_it(
    qtbot: QtBot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.fakes.engine import FakeEngine

    dirs = data_dirs(tmp_path / "data")
    dirs.models.mkdir(parents=True, exist_ok=True)
    target = dirs.models / "junk.gguf"  # listed as invalid, deletable; the fake loads it
    target.write_bytes(b"junk")
    there_at_unload: list[bool] = []

    class Recording(FakeEngine):
        def unload(self) -> None:
            there_at_unload.append(target.exists())
            super().unload()

    store = ConversationStore(dirs.root)
    services = HubServices(
        HubClient(),
        Library(dirs.models, dirs.root / "library.json", hf_cache=False),
        DownloadQueue(dirs.models, dirs.root / "downloads.json", FileFetcher(read_timeout=5)),
    )
    client = EngineClient(dirs.models, engine_factory=Recording, store=store)
    win = MainWindow(client, AppSettings(load=TEST_LOAD), dirs, store, services)
    qtbot.addWidget(win)
    try:
        with qtbot.waitSignal(win.modelReady, timeout=10_000):
            win.load_model(target)
        m = manager(qtbot, win)
        qtbot.waitUntil(lambda: m.library_table.rowCount() == 1, timeout=10_000)
        assert "(loaded)" in m.library_table.item(0, 0).text()
        m.library_table.selectRow(0)
        monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Yes)
        m.delete_selected()
        qtbot.waitUntil(lambda: not target.exists(), timeout=10_000)
        assert there_at_unload and there_at_unload[-1]  # unloaded first, then deleted
        assert win.loaded_model.info is None and win.session.model is None
    finally:
        win.close()
