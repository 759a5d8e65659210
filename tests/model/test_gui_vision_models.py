"""Vision models in the window: the projector goes with the load, the status bar says
"sees images", the model manager pairs by hand and marks and downloads vision repos."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox
from pytestqt.qtbot import QtBot

from app.chat.store import ConversationStore
from app.config.paths import DataDirs, data_dirs
from app.config.settings import AppSettings
from app.engine.backend import ModelInfo
from app.models.downloader import FileFetcher
from app.models.downloads import DownloadQueue
from app.models.hub import HubClient
from app.models.library import Library
from tests.conftest import TEST_LOAD
from tests.fakes.engine import FakeEngine
from tests.hub_server import HubServer, serving_hub
from tests.vision_model import projector_path
from ui.engine.worker import EngineClient
from ui.models import projector_choice
from ui.models.hub_workers import HubServices
from ui.window.main_window import MainWindow

LOADS: list[str] = []  # the mmproj of each load the fake engine saw
PATHS: list[str] = []  # and the model path it was asked for


class SeeingEngine(FakeEngine):
    """A fake engine that reports the projector it was given, as the real one does."""

    def load(self, path: str, config: Any, progress: Any = None) -> ModelInfo:
        info = super().load(path, config, progress)
        LOADS.append(config.mmproj)
        PATHS.append(str(path))
        self._model = replace(info, projector=Path(config.mmproj).name if config.mmproj else "")
        return self._model


@pytest.fixture()
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[HubServer]:
    with serving_hub(monkeypatch, tmp_path / "hf-home") as server:
        server.add_repo(
            "acme/seer-GGUF",
            {
                "seer-Q4_K_M.gguf": b"GGUF" + b"\1" * 500,
                "mmproj-seer-f16.gguf": b"GGUF" + b"\2" * 300,
            },
            downloads=9,
        )
        server.add_repo("acme/text-GGUF", {"text-Q4_0.gguf": b"GGUF" + b"\0" * 100}, downloads=5)
        yield server


@pytest.fixture()
def dirs(tmp_path: Path, model_path: Path) -> DataDirs:
    d = data_dirs(tmp_path / "data")
    d.models.mkdir(parents=True, exist_ok=True)
    (d.models / "gemma-3-270m-Q4_K_M.gguf").symlink_to(model_path)
    (d.models / "mmproj-gemma-3-270m-F16.gguf").symlink_to(projector_path())
    return d


@pytest.fixture()
def window(qtbot: QtBot, dirs: DataDirs, hub: HubServer) -> Iterator[MainWindow]:
    LOADS.clear()
    store = ConversationStore(dirs.root)
    services = HubServices(
        HubClient(),
        Library(dirs.models, dirs.root / "library.json", hf_cache=False),
        DownloadQueue(dirs.models, dirs.root / "downloads.json", FileFetcher(read_timeout=5)),
    )
    client = EngineClient(dirs.models, engine_factory=SeeingEngine, store=store)
    win = MainWindow(client, AppSettings(load=TEST_LOAD), dirs, store, services)
    qtbot.addWidget(win)
    win.show()
    yield win
    win.close()
    qtbot.waitUntil(lambda: win.closed, timeout=15_000)


def _load(qtbot: QtBot, win: MainWindow, model: Path) -> str:
    with qtbot.waitSignal(win.modelReady, timeout=10_000):
        win.load_model(model)
    return win.model_status.label.text()


def test_a_paired_model_loads_with_its_projector_and_says_so(
    qtbot: QtBot, window: MainWindow, dirs: DataDirs, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = dirs.models / "gemma-3-270m-Q4_K_M.gguf"
    text = _load(qtbot, window, model)
    assert LOADS[-1] == str(dirs.models / "mmproj-gemma-3-270m-F16.gguf")
    assert "sees images" in text
    assert "mmproj-gemma-3-270m-F16.gguf" in window.model_status.label.toolTip()

    # Unpaired by hand: reloaded without it, and the status bar says nothing of images.
    assert projector_choice._store(window.ctx, window, model, "") == ""
    assert "sees images" not in _load(qtbot, window, model)
    assert LOADS[-1] == ""

    # A projector that does not fit is refused with the reason, and not remembered.
    warnings: list[str] = []
    monkeypatch.setattr(QMessageBox, "warning", lambda _p, _t, text: warnings.append(text))
    wide = projector_path(width=1024)
    assert projector_choice.choose_file(window.ctx, window, model, wide) is None
    assert "1024-wide" in warnings[-1]
    assert projector_choice.pairs(window.ctx).get(model) == ""
    assert projector_choice.choose_file(window.ctx, window, model, projector_path()) is not None
    assert "sees images" in _load(qtbot, window, model)
    assert LOADS[-1] == str(projector_path())


def test_the_manager_offers_pairing_and_marks_vision_repos(
    qtbot: QtBot,
    window: MainWindow,
    dirs: DataDirs,
    hub: HubServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hub.add_repo(
        "acme/seer-GGUF",
        {"seer-Q4_K_M.gguf": b"GGUF" + b"\1" * 500, "mmproj-seer-f16.gguf": b"GGUF" + b"\2" * 300},
        tags=["image-text-to-text"],
        downloads=9,
    )
    window.manager_action.trigger()
    m = window.model_manager
    assert m is not None
    qtbot.waitUntil(lambda: m.library_table.rowCount() == 2, timeout=10_000)
    rows = {m.library_table.item(r, 0).text(): r for r in range(2)}
    projector_row = next(r for t, r in rows.items() if "mmproj" in t)
    m.library_table.selectRow(projector_row)
    assert not m.load_button.isEnabled() and not m.projector_button.isEnabled()
    asked: list[Path] = []
    monkeypatch.setattr(  # the dialog itself is modal
        projector_choice, "choose_projector", lambda _c, _p, model: asked.append(model)
    )
    m.library_table.selectRow(1 - projector_row)
    assert m.projector_button.isEnabled()
    m.projector_button.click()
    assert asked == [dirs.models / "gemma-3-270m-Q4_K_M.gguf"]

    m.tabs.setCurrentIndex(0)
    qtbot.keyClicks(m.search_box, "GGUF")
    qtbot.keyClick(m.search_box, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: m.results.count() == 2, timeout=10_000)
    texts = {m.results.item(i).text().split("\n")[0]: i for i in range(2)}
    assert "acme/seer-GGUF · vision" in texts and "acme/text-GGUF" in texts
    m.results.setCurrentRow(texts["acme/seer-GGUF · vision"])
    qtbot.waitUntil(lambda: m.repo_files.rowCount() == 1, timeout=10_000)
    assert "mmproj-seer-f16.gguf is downloaded with the model" in m.repo_title.text()
    m.repo_files.selectRow(0)
    m.download_selected()
    queue = window.services.queue if window.services else None
    assert queue is not None
    assert [j.name for j in queue.jobs] == ["seer-Q4_K_M.gguf", "mmproj-seer-f16.gguf"]
    qtbot.waitUntil(lambda: all(j.state == "done" for j in queue.jobs), timeout=10_000)
    folder = {Path(j.result_path).parent for j in queue.jobs}
    assert len(folder) == 1


def test_the_embedded_default_model_still_loads(qtbot: QtBot, window: MainWindow) -> None:
    """``load_model(None)`` asks for the embedded default by its name, not a path (a
    path of "" would be the current folder), with no projector."""
    _load(qtbot, window, None)  # type: ignore[arg-type]
    assert LOADS[-1] == "" and PATHS[-1].endswith(".gguf")  # the assembled default
    assert window.loaded_model.info is not None
    assert "sees images" not in window.model_status.label.text()
