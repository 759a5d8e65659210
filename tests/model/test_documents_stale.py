"""A document saved while it is being indexed (issue 40, item 7): the index never keeps
text read from one version of the file under the stamp of another. The real reader
child and the built-in embedding model; the file changes between the read and the
record, through the library's reader."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from app.documents import library as library_module
from app.documents.library import READS, DocumentLibrary
from app.documents.parse import ParsedDocument
from app.engine.local.embed_worker import EmbedWorker
from tests.embed_model import embedder_path

OLD = "The ferry leaves at seven in the morning.\n"
NEW = "The ferry leaves at nine in the evening.\n"


@pytest.fixture(scope="module")
def worker() -> Iterator[EmbedWorker]:
    w = EmbedWorker(embedder_path)
    yield w
    w.close()


def saving_during_reads(
    monkeypatch: pytest.MonkeyPatch, path: Path, versions: list[str]
) -> list[int]:
    """Each read of ``path`` (the real reader child) is followed by a save of the next of
    ``versions``, as an editor saving while the file is indexed; the reads, counted."""
    real: Callable[..., ParsedDocument] = library_module.parse_bounded
    reads = [0]

    def read_then_save(p: Path, cancel: threading.Event | None = None) -> ParsedDocument:
        doc = real(p, cancel)
        if reads[0] < len(versions):
            st = os.stat(path)
            path.write_text(versions[reads[0]], encoding="utf-8")
            # Whatever the clock's grain: the save is seen as one.
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        reads[0] += 1
        return doc

    monkeypatch.setattr(library_module, "parse_bounded", read_then_save)
    return reads


def indexed_text(lib: DocumentLibrary, path: Path) -> str:
    return " ".join(c.text for c in lib.index.chunks(str(path)))


def add(lib: DocumentLibrary, path: Path) -> None:
    statuses = lib.add([path], lambda _p: None, threading.Event())
    assert [s.state for s in statuses] == ["ready"]


def test_a_file_saved_during_indexing_is_read_again(
    tmp_path: Path, worker: EmbedWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "ferry.md"
    path.write_text(OLD, encoding="utf-8")
    lib = DocumentLibrary(tmp_path / "data", worker)
    reads = saving_during_reads(monkeypatch, path, [NEW])
    add(lib, path)
    assert reads[0] == 2  # the save was noticed, and the file read again
    assert "nine in the evening" in indexed_text(lib, path)
    model = worker.info().result(60)[0]
    assert lib.index.is_current(path, model)
    add(lib, path)
    assert reads[0] == 2  # now it is current: not read again


def test_a_file_that_keeps_changing_is_never_taken_as_current(
    tmp_path: Path, worker: EmbedWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "ferry.md"
    path.write_text(OLD, encoding="utf-8")
    lib = DocumentLibrary(tmp_path / "data", worker)
    versions = [f"The ferry leaves at {h} o'clock.\n" for h in range(1, READS + 1)]
    reads = saving_during_reads(monkeypatch, path, versions)
    add(lib, path)
    assert reads[0] == READS  # bounded
    model = worker.info().result(60)[0]
    # What was indexed was read from an earlier version: the next add reads it again.
    assert not lib.index.is_current(path, model)
    add(lib, path)
    assert reads[0] == READS + 1
    assert f"{READS} o'clock" in indexed_text(lib, path)
    assert lib.index.is_current(path, model)
