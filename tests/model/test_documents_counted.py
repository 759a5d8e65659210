"""Whole documents are counted with the model's tokenizer once read (issue 41): the
estimate picks the candidates, the count decides. The built-in embedding model, no chat
model: the counter stands in for the engine's."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.documents.library import DocumentLibrary
from app.engine.local.embed_worker import EmbedWorker
from tests.embed_model import embedder_path

NOTE = "The ferry leaves at seven in the morning from the north pier.\n"
ROOM = 400  # tokens: half for whole documents; the note's estimate (~37) fits


@pytest.fixture(scope="module")
def worker() -> Iterator[EmbedWorker]:
    w = EmbedWorker(embedder_path)
    yield w
    w.close()


def library(tmp_path: Path, worker: EmbedWorker) -> tuple[DocumentLibrary, list[str]]:
    path = tmp_path / "ferry.md"
    path.write_text(NOTE, encoding="utf-8")
    lib = DocumentLibrary(tmp_path / "data", worker)
    statuses = lib.add([path], lambda _p: None, threading.Event())
    assert [s.state for s in statuses] == ["ready"]
    return lib, [str(path)]


def test_a_document_the_tokenizer_finds_too_long_is_searched_not_given_whole(
    tmp_path: Path, worker: EmbedWorker
) -> None:
    lib, paths = library(tmp_path, worker)
    counted: list[str] = []
    estimated = lib.context_for(paths, "When does the ferry leave?", ROOM, set())
    assert [s.whole for s in estimated] == [True]

    def long_count(text: str) -> int:
        counted.append(text)
        return ROOM  # a tokenizer that splits this text finely: over half the room

    found = lib.context_for(paths, "When does the ferry leave?", ROOM, set(), count=long_count)
    assert counted == [estimated[0].text]
    assert found and not any(s.whole for s in found)  # its passage, retrieved
    fits = lib.context_for(paths, "When does the ferry leave?", ROOM, set(), count=len)
    assert [s.whole for s in fits] == [True]
