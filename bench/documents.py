"""Documents: embedding speed, retrieval latency at 100k chunks, and recall on a labelled set.

Prints one JSON object:

- ``embed_tokens_per_s``: tokens per second this app's ``Embedder`` (the default
  all-MiniLM-L6-v2 F16) embeds the bench corpus's chunks at; ``llama_cpp_tokens_per_s``
  the same chunks through llama-cpp-python's own ``Llama(embedding=True).embed`` with the
  same n_ctx, n_batch and threads, rounds alternating in the same run (median of
  ``--rounds`` each); ``embed_speed_vs_llama_cpp`` = ours ÷ theirs (goal ≥ 0.9);
- ``hybrid_ms`` / ``vector_ms`` / ``bm25_ms``: ``DocumentIndex.search`` over
  ``--chunks`` synthetic chunks (random unit vectors, Zipf-distributed words, in 1000
  files, all of them searched) with a real query embedding, median of 20 (goal < 50 ms
  hybrid); ``matrix_build_ms``: the first search after a write (the float32 matrix
  read from the float16 vectors); ``fill_s``: writing the synthetic index;
- ``recall_at_5_vector`` / ``_bm25`` / ``_hybrid``: of 24 labelled questions about 12
  short documents (``bench/documents_corpus.py``), the share whose answering passage
  (its document, holding the answer phrase) is among the top 5; ``recall_at_1_*``: is
  the first.

    .venv/bin/python bench/documents.py [--rounds 3] [--threads 2] [--chunks 100000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.documents.chunking import Chunk, chunk_document
from app.documents.index import DocumentIndex, Mode
from app.documents.parse import Block, ParsedDocument
from app.engine.local.embedder import N_CTX, Embedder
from app.models.default_embedder import ensure_default_embedder
from bench.documents_corpus import DOCUMENTS, QUESTIONS
from bench.guarded import use_native_guard

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / ".cache" / "bench-documents"
MAX_CHARS = 200  # about a paragraph: each document has several chunks, so recall means something
FILES = 1000


def corpus(folder: Path) -> list[tuple[ParsedDocument, list[Chunk]]]:
    out = []
    for name, paragraphs in DOCUMENTS.items():
        path = folder / name
        path.write_text("\n\n".join(paragraphs), encoding="utf-8")
        blocks, line = [], 1
        for text in paragraphs:
            blocks.append(Block(text, None, line))
            line += text.count("\n") + 2
        doc = ParsedDocument(str(path), "markdown", name, tuple(blocks), None)
        out.append((doc, chunk_document(doc, max_chars=MAX_CHARS, overlap_chars=60)))
    return out


def throughput(model: Path, texts: Sequence[str], threads: int, rounds: int) -> dict[str, Any]:
    from tests.native import llama

    ours = Embedder.load(model, n_threads=threads)
    tokens = sum(min(ours.count_tokens(t), ours.max_tokens) for t in texts)
    theirs = llama(  # the native guard's verdicts, as the app's embedder
        model,
        embedding=True,
        n_ctx=N_CTX,
        n_batch=N_CTX,
        n_ubatch=N_CTX,
        n_threads=threads,
        n_threads_batch=threads,
        n_gpu_layers=0,
        verbose=False,
    )
    mine: list[float] = []
    stock: list[float] = []
    ours.embed(texts[:4])
    theirs.embed(list(texts[:4]))
    for _ in range(rounds):
        mine.append(_timed(lambda: ours.embed(texts)))
        stock.append(_timed(lambda: theirs.embed(list(texts))))
    ours.close()
    theirs.close()
    a, b = tokens / statistics.median(mine), tokens / statistics.median(stock)
    return {
        "embed_texts": len(texts),
        "embed_tokens": tokens,
        "embed_tokens_per_s": round(a, 1),
        "llama_cpp_tokens_per_s": round(b, 1),
        "embed_speed_vs_llama_cpp": round(a / b, 3),
    }


def recall(model: Path, folder: Path, threads: int) -> dict[str, Any]:
    docs = corpus(folder)
    embedder = Embedder.load(model, n_threads=threads)
    index = DocumentIndex(folder / "documents.sqlite3")
    for doc, chunks in docs:
        vectors = embedder.embed([c.text for c in chunks])
        index.replace(doc, chunks, vectors, "0" * 64, embedder.name)
    paths = [doc.path for doc, _ in docs]
    found: dict[str, int] = {"vector": 0, "bm25": 0, "hybrid": 0}
    first: dict[str, int] = dict.fromkeys(found, 0)
    for question, name, phrase in QUESTIONS:
        vector = embedder.embed([question])[0]
        for mode in found:
            hits = index.search(question, vector, paths, k=5, mode=mode)  # type: ignore[arg-type]
            right = [h.name == name and phrase in h.chunk.text for h in hits]
            found[mode] += any(right)
            first[mode] += bool(right) and right[0]
    embedder.close()
    index.close()
    n_chunks = sum(len(c) for _, c in docs)
    out: dict[str, Any] = {"labelled_questions": len(QUESTIONS), "labelled_chunks": n_chunks}
    out.update({f"recall_at_5_{m}": round(v / len(QUESTIONS), 3) for m, v in found.items()})
    out.update({f"recall_at_1_{m}": round(v / len(QUESTIONS), 3) for m, v in first.items()})
    return out


def latency(model: Path, folder: Path, n_chunks: int) -> dict[str, Any]:
    embedder = Embedder.load(model, n_threads=1)
    query_text = "How do I reset the router to factory settings"
    query_vector = embedder.embed([query_text])[0]
    dim = embedder.dim
    embedder.close()
    rng = np.random.default_rng(31)
    vocab = [f"w{i}" for i in range(20_000)]
    weights = 1.0 / np.arange(1, len(vocab) + 1) ** 1.1
    weights /= weights.sum()
    index = DocumentIndex(folder / "big.sqlite3")
    per_file = max(1, n_chunks // FILES)
    started = time.perf_counter()
    paths = []
    for f in range(FILES):
        path = folder / f"f{f}.txt"
        path.write_text("x", encoding="utf-8")
        words = rng.choice(len(vocab), size=(per_file, 80), p=weights)
        chunks = [
            Chunk(i, " ".join(vocab[w] for w in row), None, i + 1, i + 1)
            for i, row in enumerate(words)
        ]
        vectors = rng.standard_normal((per_file, dim)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        doc = ParsedDocument(str(path), "text", path.name, (), None)
        index.replace(doc, chunks, vectors, "0" * 64, "bench")
        paths.append(str(path))
    fill = time.perf_counter() - started
    # The words of a real query mixed with common and rare synthetic ones.
    query = f"{query_text} {vocab[0]} {vocab[3]} {vocab[150]} {vocab[4000]} {vocab[12000]}"
    build = _timed(lambda: index.search(query, query_vector, paths, k=5, mode="vector"))
    out: dict[str, Any] = {
        "chunks": per_file * FILES,
        "files": FILES,
        "fill_s": round(fill, 1),
        "matrix_build_ms": round(build * 1000, 1),
    }
    modes: list[Mode] = ["hybrid", "vector", "bm25"]
    for mode in modes:

        def once(m: Mode = mode) -> object:
            return index.search(query, query_vector, paths, k=5, mode=m)

        times = [_timed(once) for _ in range(20)]
        out[f"{mode}_ms"] = round(statistics.median(times) * 1000, 1)
    index.close()
    return out


def _timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    use_native_guard()
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunks", type=int, default=100_000)
    args = ap.parse_args()
    model = ensure_default_embedder(DATA)
    out: dict[str, Any] = {"bench": "documents", "threads": args.threads, "chunk_chars": MAX_CHARS}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        texts = [c.text for _, chunks in corpus(folder) for c in chunks] * 4
        out.update(throughput(model, texts, args.threads, args.rounds))
        out.update(recall(model, folder, args.threads))
        out.update(latency(model, folder, args.chunks))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
