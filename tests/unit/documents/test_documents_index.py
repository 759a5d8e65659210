"""The document index: round trip, staleness, removal, search modes, damage."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.documents.chunking import chunk_document
from app.documents.index import DocumentIndex
from app.documents.parse import ParsedDocument
from app.util.errors import DocumentError
from app.util.hashing import sha256_file
from tests.fakes.documents import document, fake_embed
from tests.hypothesis_budget import examples

TOPICS = {
    "bees.txt": [
        "Honey bees live in hives with one queen.",
        "A worker bee visits flowers to collect nectar and pollen.",
    ],
    "rockets.txt": [
        "A rocket engine burns propellant to make thrust.",
        "Liquid oxygen is a common oxidiser for launch vehicles.",
    ],
    "bread.txt": [
        "Sourdough bread rises with wild yeast from a starter.",
        "Knead the dough and bake it in a hot oven.",
    ],
}


def add(index: DocumentIndex, folder: Path, name: str, paragraphs: list[str]) -> ParsedDocument:
    path = folder / name
    path.write_text("\n\n".join(paragraphs), encoding="utf-8")
    doc = document(str(path), paragraphs)
    chunks = chunk_document(doc, max_chars=70, overlap_chars=0)
    vectors = fake_embed([c.text for c in chunks])
    index.replace(doc, chunks, vectors, sha256_file(path), "fake")
    return doc


@pytest.fixture
def filled(tmp_path: Path) -> Iterator[tuple[DocumentIndex, Path]]:
    index = DocumentIndex(tmp_path / "documents.sqlite3")
    for name, paragraphs in TOPICS.items():
        add(index, tmp_path, name, paragraphs)
    yield index, tmp_path
    index.close()


def test_round_trip_keeps_records_and_chunks(filled: tuple[DocumentIndex, Path]) -> None:
    index, folder = filled
    path = str(folder / "bees.txt")
    record = index.record(path)
    assert record is not None
    assert (record.name, record.kind, record.n_chunks, record.model) == (
        "bees.txt",
        "text",
        2,
        "fake",
    )
    assert record.sha256 == sha256_file(Path(path))
    chunks = index.chunks(path)
    assert [(c.ord, c.line, c.end_line) for c in chunks] == [(0, 1, 1), (1, 3, 3)]
    assert chunks[1].text == TOPICS["bees.txt"][1]
    index.close()
    again = DocumentIndex(folder / "documents.sqlite3")
    assert again.chunks(path) == chunks and again.take_notes() == []
    again.close()


def test_is_current_follows_size_mtime_and_content(filled: tuple[DocumentIndex, Path]) -> None:
    index, folder = filled
    path = folder / "bread.txt"
    assert index.is_current(path, "fake")
    assert not index.is_current(path, "other-model")
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))  # touched, same bytes
    assert index.is_current(path, "fake")
    record = index.record(str(path))
    assert record is not None and record.mtime_ns == path.stat().st_mtime_ns  # stamp kept
    path.write_text("Rye bread is dense.", encoding="utf-8")
    assert not index.is_current(path, "fake")
    assert not index.is_current(folder / "missing.txt", "fake")


def test_replace_and_remove(filled: tuple[DocumentIndex, Path]) -> None:
    index, folder = filled
    path = str(folder / "rockets.txt")
    add(index, folder, "rockets.txt", ["Solid rocket boosters burn out quickly."])
    assert [c.text for c in index.chunks(path)] == ["Solid rocket boosters burn out quickly."]
    hits = index.search("oxygen oxidiser", None, [path], mode="bm25")
    assert hits == []  # the old chunks' words are gone from full text too
    index.remove(path)
    assert index.record(path) is None and index.chunks(path) == []
    assert index.search("rocket boosters", fake_embed(["rocket boosters"])[0], [path]) == []


@pytest.mark.parametrize("mode", ["hybrid", "vector", "bm25"])
def test_search_finds_the_answering_chunk(filled: tuple[DocumentIndex, Path], mode: str) -> None:
    index, folder = filled
    paths = [str(folder / n) for n in TOPICS]
    query = "Which oxidiser do launch vehicles use?"
    hits = index.search(query, fake_embed([query])[0], paths, k=3, mode=mode)  # type: ignore[arg-type]
    assert hits[0].name == "rockets.txt" and "oxidiser" in hits[0].chunk.text
    assert hits[0].chunk.line == 3
    if mode == "hybrid":
        assert hits[0].vector_rank is not None and hits[0].bm25_rank is not None
    if mode == "bm25":
        assert all(h.vector_rank is None for h in hits)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_search_without_vector_is_bm25_and_respects_paths(
    filled: tuple[DocumentIndex, Path],
) -> None:
    index, folder = filled
    bread = str(folder / "bread.txt")
    hits = index.search("yeast dough oven", None, [bread], k=5)
    assert hits and {h.path for h in hits} == {bread}
    assert (
        index.search(
            "yeast", fake_embed(["yeast"])[0], [str(folder / "bees.txt")], k=5, mode="bm25"
        )
        == []
    )
    vec_hits = index.search("yeast", fake_embed(["yeast"])[0], [str(folder / "bees.txt")], k=5)
    assert {h.path for h in vec_hits} == {str(folder / "bees.txt")}
    assert index.search("yeast", None, [], k=5) == []
    assert index.search("the of and", None, [bread]) == []  # stopwords only


@settings(
    max_examples=examples(80),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(st.text(max_size=200))
def test_any_query_text_never_raises(filled: tuple[DocumentIndex, Path], text: str) -> None:
    index, folder = filled
    paths = [str(folder / n) for n in TOPICS]
    for query in (text, text + ' "AND OR NEAR( * ^'):
        index.search(query, fake_embed([query])[0], paths, k=3)
        index.search(query, None, paths, k=3, mode="bm25")


def _garbage(path: Path) -> None:
    path.write_bytes(b"not a database at all " * 100)


def _directory(path: Path) -> None:
    path.mkdir()


def _link(path: Path) -> None:
    target = path.parent / "elsewhere.sqlite3"
    sqlite3.connect(target).close()
    path.symlink_to(target)


def _foreign(path: Path) -> None:
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE accounts(id INTEGER, secret TEXT)")
    db.commit()
    db.close()


def _newer(path: Path) -> None:
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    db.execute("INSERT INTO meta VALUES('schema', '99')")
    db.commit()
    db.close()


@pytest.mark.parametrize("spoil", [_garbage, _directory, _link, _foreign, _newer])
def test_a_bad_index_file_is_set_aside_and_rebuilt(tmp_path: Path, spoil: object) -> None:
    db_path = tmp_path / "documents.sqlite3"
    spoil(db_path)  # type: ignore[operator]
    index = DocumentIndex(db_path)
    doc = add(index, tmp_path, "bees.txt", TOPICS["bees.txt"])
    assert len(index.chunks(doc.path)) == 2
    notes = index.take_notes()
    assert len(notes) == 1 and "indexed again" in notes[0]
    assert (tmp_path / "documents.sqlite3.bad").exists() or (
        tmp_path / "documents.sqlite3.bad"
    ).is_symlink()
    assert db_path.is_file() and not db_path.is_symlink()
    if spoil is _link:
        assert sqlite3.connect(tmp_path / "elsewhere.sqlite3").execute(
            "SELECT count(*) FROM sqlite_master"
        ).fetchone() == (0,)  # nothing written through the link
    index.close()


def test_damage_found_later_is_repaired(filled: tuple[DocumentIndex, Path]) -> None:
    index, folder = filled
    index.close()
    db_path = folder / "documents.sqlite3"
    data = bytearray(db_path.read_bytes())
    data[100:4096] = b"\xff" * (4096 - 100)
    db_path.write_bytes(bytes(data))
    for side in ("-wal", "-shm"):
        (folder / f"documents.sqlite3{side}").unlink(missing_ok=True)
    fresh = DocumentIndex(db_path)
    assert fresh.record(str(folder / "bees.txt")) is None
    assert fresh.take_notes()
    fresh.close()


def test_vectors_are_reread_after_a_write(filled: tuple[DocumentIndex, Path]) -> None:
    index, folder = filled
    paths = [str(folder / n) for n in TOPICS]
    q = fake_embed(["sourdough starter"])[0]
    assert index.search("sourdough starter", q, paths, k=1, mode="vector")[0].name == "bread.txt"
    index.remove(str(folder / "bread.txt"))
    hits = index.search("sourdough starter", q, paths, k=1, mode="vector")
    assert hits and hits[0].name != "bread.txt"
    assert index.search("x", np.zeros(3, dtype=np.float32), paths, mode="vector") == []


def test_a_locked_index_is_not_set_aside(filled: tuple[DocumentIndex, Path]) -> None:
    index, folder = filled
    other = sqlite3.connect(folder / "documents.sqlite3", isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(DocumentError, match="busy"):
            add(index, folder, "late.txt", ["Written while another program holds the file."])
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert index.take_notes() == [] and not (folder / "documents.sqlite3.bad").exists()
    assert index.record(str(folder / "bees.txt")) is not None


def test_bm25_for_rare_documents_among_many_matches(
    filled: tuple[DocumentIndex, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    index, folder = filled
    monkeypatch.setattr("app.documents.index.BM25_SCAN", 1)  # the first scan finds too few
    for i in range(3):
        add(index, folder, f"more{i}.txt", ["Bees and bread and rockets everywhere."])
    bees = str(folder / "bees.txt")
    hits = index.search("bees bread rockets", None, [bees], k=5)
    assert [h.path for h in hits] == [bees]
