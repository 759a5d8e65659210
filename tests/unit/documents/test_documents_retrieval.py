"""Chunking positions, the FTS query, cosine top-k and rank fusion."""

from __future__ import annotations

import sqlite3

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from app.documents.chunking import chunk_document
from app.documents.parse import Block, ParsedDocument
from app.documents.retrieval import fts_query, rrf, terms, top_k_cosine
from tests.fakes.documents import document
from tests.hypothesis_budget import examples


def lines_of(text: str, first: int, last: int) -> str:
    return "\n".join(text.split("\n")[first - 1 : last])


def test_small_blocks_pack_into_one_chunk_with_their_lines() -> None:
    doc = document("/d/a.txt", ["Alpha one.\nAlpha two.", "Beta.", "Gamma\nGamma\nGamma."])
    chunks = chunk_document(doc, max_chars=900)
    assert len(chunks) == 1
    c = chunks[0]
    assert (c.ord, c.page, c.line, c.end_line) == (0, None, 1, 8)
    assert c.text == "Alpha one.\nAlpha two.\n\nBeta.\n\nGamma\nGamma\nGamma."


def test_chunks_never_cross_pages_and_count_lines_per_page() -> None:
    blocks = (
        Block("Page one text.", 1, 1),
        Block("More on one.", 1, 3),
        Block("Page two starts\nhere.", 2, 1),
        Block("Two again.", 2, 4),
    )
    doc = ParsedDocument("/d/b.pdf", "pdf", "b", blocks, 2)
    chunks = chunk_document(doc)
    assert [(c.page, c.line, c.end_line) for c in chunks] == [(1, 1, 3), (2, 1, 4)]
    assert [c.ord for c in chunks] == [0, 1]


def test_a_long_block_is_split_at_sentences_and_lines_advance() -> None:
    sentences = [f"Sentence number {i} says something." for i in range(40)]
    text = "\n".join(sentences)  # one sentence a line, from line 5
    doc = ParsedDocument("/d/c.txt", "text", "c", (Block(text, None, 5),), None)
    chunks = chunk_document(doc, max_chars=200, overlap_chars=0)
    assert len(chunks) > 5
    assert all(len(c.text) <= 200 for c in chunks)
    for c in chunks:
        # every chunk is exactly the lines it claims, in the document's numbering
        assert c.text == lines_of("\n" * 4 + text, c.line, c.end_line)
    assert chunks[0].line == 5 and chunks[-1].end_line == 5 + 39
    assert [c.line for c in chunks[1:]] == [c.end_line + 1 for c in chunks[:-1]]


def test_the_next_chunk_starts_with_the_tail_of_the_block_before() -> None:
    first = " ".join(f"word{i}" for i in range(60))  # ~ 400 chars
    second = "The second block is here."
    doc = document("/d/e.txt", [first, second])
    chunks = chunk_document(doc, max_chars=420, overlap_chars=50)
    assert len(chunks) == 2
    assert chunks[1].text.endswith(second)
    assert chunks[1].text.startswith("word5")
    assert first.endswith(chunks[1].text.split("\n\n")[0])
    assert len(chunks[1].text.split("\n\n")[0]) <= 50
    assert (chunks[1].line, chunks[1].end_line) == (1, 3)


def test_chunking_is_deterministic_and_skips_blank_blocks() -> None:
    doc = document("/d/f.txt", ["  ", "x " * 700, "\n\n", "end"])
    assert chunk_document(doc, 300) == chunk_document(doc, 300)
    assert all(c.text.strip() for c in chunk_document(doc, 300))


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(st.text(min_size=0, max_size=400), min_size=0, max_size=6), st.integers(16, 300))
def test_chunks_are_bounded_and_their_lines_are_real(texts: list[str], max_chars: int) -> None:
    doc = document("/d/g.txt", texts)
    full = "\n\n".join(texts)
    total_lines = full.count("\n") + 1
    for c in chunk_document(doc, max_chars, overlap_chars=max_chars // 4):
        assert len(c.text) <= max_chars
        assert 1 <= c.line <= c.end_line <= total_lines


def test_fts_query_quotes_and_ors_terms_without_stopwords() -> None:
    assert fts_query("What is the Café budget for 2025?") == '"cafe" OR "budget" OR "2025"'
    assert fts_query("the of and") == ""
    assert fts_query("alpha beta gamma", lambda t: t == "beta") == '"alpha" OR "gamma"'
    assert fts_query("alpha", lambda t: True) == '"alpha"'  # never nothing
    assert len(terms(" ".join(f"w{i}" for i in range(50)))) == 50
    assert fts_query(" ".join(f"w{i}" for i in range(50))).count(" OR ") == 15


@settings(max_examples=examples(200), deadline=None)
@given(st.text(max_size=300))
def test_any_text_makes_a_query_fts5_accepts(text: str) -> None:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE t USING fts5(x, tokenize='unicode61 remove_diacritics 2')")
    db.execute("INSERT INTO t VALUES('some words AND OR NEAR here')")
    query = fts_query(text + ' "AND OR NEAR( * ^ -x col:y')
    if query:
        db.execute("SELECT rowid FROM t WHERE t MATCH ?", (query,)).fetchall()
    db.close()


def test_top_k_cosine_orders_by_cosine_then_row() -> None:
    m = np.array([[1, 0], [0, 1], [0.6, 0.8], [1, 0]], dtype=np.float32)
    assert top_k_cosine(m, np.array([1, 0], dtype=np.float32), 3) == [
        (0, 1.0),
        (3, 1.0),
        (2, 0.6000000238418579),
    ]
    assert top_k_cosine(m, np.zeros(2, dtype=np.float32), 3) == []
    assert top_k_cosine(m, np.ones(3, dtype=np.float32), 3) == []  # wrong dimension
    assert len(top_k_cosine(m, np.array([0, 2], dtype=np.float32), 10)) == 4


def test_rrf_sums_reciprocal_ranks() -> None:
    fused = rrf([[1, 2, 3], [3, 4]], k=60)
    assert [i for i, _ in fused] == [3, 1, 2, 4]
    assert fused[0][1] == 1 / 63 + 1 / 61
    assert rrf([]) == []
    assert rrf([[5, 5, 6]]) == [(5, 1 / 61), (6, 1 / 62)]  # a repeat counts once
