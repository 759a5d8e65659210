"""Recommended embedding models: downloaded into ``<data>/embedders`` (a named download
folder of the shared queue), checked as an embedder and chosen for documents; never
loaded as a chat model. Against the local Hub server with the real ``huggingface_hub``."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from app.config.paths import data_dirs
from app.models.default_embedder import embedders_dir
from app.models.download_control import Control
from app.models.download_errors import DownloadError
from app.models.downloader import FileFetcher, ProgressFn
from app.models.downloads import DownloadQueue
from app.models.embedders import choose_embedder, chosen_embedder
from app.models.hub import HubClient
from app.models.library import Library
from app.models.quant import GgufChoice, RepoFile
from app.models.recommended import Recommended, RecommendedList, parse_entry
from tests.embed_model import embedder_path
from tests.hub_server import HubServer, serving_hub
from tests.model.test_recommended import click
from ui.models import recommended_view
from ui.models.hub_workers import HubServices
from ui.models.model_manager import ModelManager

REPO = "lamplight-test/tiny-embed-GGUF"
FILE = "tiny-embed-F16.gguf"


class WritingFetcher(FileFetcher):
    """Writes ``size`` bytes to ``dest`` at once: the queue's bookkeeping, not the network."""

    def fetch(
        self,
        repo_id: str,
        path: str,
        dest: Path,
        size: int,
        sha256: str | None,
        control: Control,
        progress: ProgressFn | None = None,
        revision: str = "main",
    ) -> Path:
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(b"G" * size)
        return dest


def _choice(name: str = FILE, size: int = 8) -> GgufChoice:
    return GgufChoice(name, "F16", (RepoFile(name, size, None),))


# -- the queue's named folders ------------------------------------------------------------------


def test_a_job_downloads_flat_into_its_named_folder(tmp_path: Path) -> None:
    models, state, embedders = tmp_path / "models", tmp_path / "d.json", tmp_path / "embedders"
    queue = DownloadQueue(models, state, WritingFetcher(), {"embedders": embedders})
    job = queue.add(REPO, _choice(), folder="embedders")
    # The same file for the models folder is another target: no clash.
    chat = queue.add(REPO, _choice())
    assert chat is not job and len(queue.jobs) == 2
    with pytest.raises(DownloadError, match="no download folder named"):
        queue.add(REPO, _choice("other-F16.gguf"), folder="elsewhere")
    assert queue.add(REPO, _choice(), folder="embedders") is job  # one writer per file
    queue.run_next(lambda _j: None)
    queue.run_next(lambda _j: None)
    assert job.state == "done" and Path(job.result_path) == (embedders / FILE).resolve()
    assert (embedders / FILE).is_file() and (
        models / "lamplight-test__tiny-embed-GGUF" / FILE
    ).is_file()
    saved = json.loads(state.read_text())["jobs"]
    assert [j["folder"] for j in saved] == ["embedders", ""]

    # Saved and read back: the folder is a name; a queue that does not know it fails the job.
    again = DownloadQueue(models, state, WritingFetcher())
    assert [j.folder for j in again.jobs] == ["embedders", ""]
    stale = again.add(REPO, _choice("second-F16.gguf"))
    assert stale.folder == ""
    again.jobs[0].state = "queued"
    again.run_next(lambda _j: None)
    assert again.jobs[0].state == "failed" and "does not know" in again.jobs[0].error


@pytest.mark.parametrize("folder", ["../up", "/etc", "Embedders", "x" * 40, 5, None, ""])
def test_a_saved_job_with_a_hostile_folder_is_dropped(tmp_path: Path, folder: object) -> None:
    state = tmp_path / "d.json"
    job = {
        "repo_id": REPO,
        "name": FILE,
        "files": [{"path": FILE, "size": 8, "sha256": None}],
        "id": "a" * 32,
        "state": "paused",
        "folder": folder,
    }
    state.write_text(json.dumps({"version": 1, "jobs": [job]}))
    queue = DownloadQueue(tmp_path / "models", state, WritingFetcher())
    assert len(queue.jobs) == (1 if folder == "" else 0)


def test_a_symlink_planted_in_the_folder_cannot_redirect_a_download(tmp_path: Path) -> None:
    embedders, outside = tmp_path / "embedders", tmp_path / "outside"
    embedders.mkdir()
    outside.mkdir()
    os.symlink(outside / FILE, embedders / FILE)
    queue = DownloadQueue(tmp_path / "models", tmp_path / "d.json", WritingFetcher())
    queue.add_folder("embedders", embedders)
    with pytest.raises(DownloadError, match="outside"):
        queue.add(REPO, _choice(), folder="embedders")
    with pytest.raises(ValueError):
        queue.add_folder("../bad", outside)


# -- the Recommended tab ---------------------------------------------------------------------------


def _entry(size: int) -> Recommended:
    return parse_entry(
        {
            "id": "test-embed",
            "kind": "embedder",
            "name": "Test Embed",
            "description": "The test embedder under another name.",
            "repo": REPO,
            "file": FILE,
            "quant": "F16",
            "params": 22_000_000,
            "size": size,
            "context": 512,
            "license": "apache-2.0",
            "layers": 6,
            "kv_dim": 384,
            "vocab": 30522,
        }
    )


@pytest.fixture()
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[HubServer]:
    with serving_hub(monkeypatch, tmp_path / "hf-home") as server:
        yield server


@pytest.fixture()
def services(tmp_path: Path) -> Iterator[HubServices]:
    dirs = data_dirs(tmp_path / "data")
    s = HubServices(
        HubClient(),
        Library(dirs.models, dirs.root / "library.json", hf_cache=False),
        DownloadQueue(dirs.models, dirs.root / "downloads.json", FileFetcher(read_timeout=5)),
    )
    yield s
    s.shutdown()


def _manager(
    qtbot: QtBot, services: HubServices, entry: Recommended, monkeypatch: pytest.MonkeyPatch
) -> ModelManager:
    monkeypatch.setattr(
        recommended_view, "bundled_list", lambda: RecommendedList((), embedders=(entry,))
    )
    m = ModelManager(services, None, 4096)
    qtbot.addWidget(m)
    m.show()
    m.show_recommended()
    return m


def test_download_puts_the_embedder_in_its_folder_and_chooses_it(
    qtbot: QtBot, hub: HubServer, services: HubServices, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = embedder_path()  # the real MiniLM GGUF (about 46 MB)
    hub.add_repo(REPO, {FILE: source})
    entry = _entry(source.stat().st_size)
    loads: list[str] = []
    chosen: list[str] = []
    services.installs.ready.connect(loads.append)
    services.installs.embedderChosen.connect(chosen.append)
    m = _manager(qtbot, services, entry, monkeypatch)
    data = services.data_dir
    try:
        row = m.recommended.embedder_rows[entry.id]
        line = m.recommended.embedder_line
        assert row.button.text() == "Download" and row.kind_badge.isVisibleTo(row)
        assert line.label.text() == "Embedding model: built-in (all-MiniLM-L6-v2)"
        assert not line.button.isVisibleTo(line)
        click(qtbot, row.button)
        done = "Installed — documents will be indexed with Test Embed"
        qtbot.waitUntil(lambda: row.status_text == done, timeout=60_000)
        target = embedders_dir(data) / FILE
        assert target.stat().st_size == source.stat().st_size
        assert chosen == [str(target.resolve())] and loads == []  # never loaded to chat
        assert chosen_embedder(data) == target
        assert not any(services.queue.models_dir.rglob("*.gguf"))
        assert row.button.text() == "In use" and not row.button.isEnabled()
        assert services.installs.in_use(entry)
        assert line.label.text() == "Embedding model: Test Embed"

        # "Use built-in": the row offers it again, and one click chooses it.
        click(qtbot, line.button)
        assert chosen[-1] == "" and not (embedders_dir(data) / "chosen.json").exists()
        assert line.label.text() == "Embedding model: built-in (all-MiniLM-L6-v2)"
        assert row.button.text() == "Use for documents" and row.button.isEnabled()
        click(qtbot, row.button)
        assert row.status_text == done and row.button.text() == "In use"
        assert loads == [] and chosen[-1] == str(target) and len(chosen) == 3
        # A choice made elsewhere shows when the tab is shown again.
        choose_embedder(data, None)
        m.recommended.refresh()
        assert row.button.text() == "Use for documents" and not line.button.isVisibleTo(line)
    finally:
        m.close()


def test_a_download_that_is_not_an_embedder_is_refused_and_deleted(
    qtbot: QtBot, hub: HubServer, services: HubServices, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = b"GGUF" + bytes(4096)  # a damaged GGUF: fails the embedder checks
    hub.add_repo(REPO, {FILE: body})
    entry = _entry(len(body))
    loads: list[str] = []
    services.installs.ready.connect(loads.append)
    m = _manager(qtbot, services, entry, monkeypatch)
    try:
        row = m.recommended.embedder_rows[entry.id]
        click(qtbot, row.button)
        qtbot.waitUntil(lambda: "cannot be used for documents" in row.status_text, timeout=20_000)
        assert "The downloaded file was deleted." in row.status_text
        assert not (embedders_dir(services.data_dir) / FILE).exists()
        assert not (embedders_dir(services.data_dir) / "chosen.json").exists()
        assert row.button.text() == "Retry" and loads == []
        assert not services.installs.in_use(entry)
    finally:
        m.close()
