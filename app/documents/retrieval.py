"""The arithmetic of retrieval: the full-text query, cosine top-k, and rank fusion.

Pure functions; the index (``app.documents.index``) runs them against its tables.

- ``fts_query``: what the user typed as an FTS5 query. Every term is quoted (so no
  operator syntax gets through) and the terms are OR-ed (BM25 ranks the chunks that
  have more of them first). Stopwords are dropped, and so are terms the index finds in
  too many chunks (``too_common``): FTS5 is slow on them (150+ ms over 100k chunks)
  and they say little about which passage is meant.
- ``top_k_cosine``: rows of an L2-normalised float32 matrix nearest a query vector.
- ``rrf``: reciprocal rank fusion (Cormack, Clarke & Büttcher, SIGIR 2009), k = 60.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

QUERY_CHARS = 2_000  # of the question; the rest does not choose passages
QUERY_TERMS = 16
RRF_K = 60
# FTS5's unicode61 tokenizer: letters, digits and private-use characters make tokens;
# everything else (the underscore too) separates them.
_TOKEN = re.compile(r"[^\W_]+", re.UNICODE)
_STOPWORDS = """
a about above after again against all am an and any are as at be because been before
being below between both but by can could did do does doing down during each few for
from further had has have having he her here hers herself him himself his how i if in
into is it its itself just me more most my myself no nor not now of off on once only or
other our ours ourselves out over own same she should so some such than that the their
theirs them themselves then there these they this those through to too under until up
very was we were what when where which while who whom why will with would you your yours
yourself yourselves tell say said please give show explain describe document documents
file files text
"""
STOPWORDS = frozenset(_STOPWORDS.split())


def terms(text: str) -> list[str]:
    """The distinct search terms of ``text`` as FTS5 stores them (lower case, accents
    removed), stopwords left out, in order of first appearance."""
    seen: dict[str, None] = {}
    for token in _TOKEN.findall(text[:QUERY_CHARS]):
        term = _fold(token)
        if term and term not in STOPWORDS:
            seen.setdefault(term, None)
    return list(seen)


def fts_query(text: str, too_common: Callable[[str], bool] | None = None) -> str:
    """An FTS5 query for ``text``: its terms quoted and OR-ed, at most ``QUERY_TERMS``.

    ``too_common(term)`` says which terms to leave out; when it would leave none, the
    first term stays (better a slow search than none). "" when ``text`` has no terms.
    """
    found = terms(text)
    kept = [t for t in found if too_common is None or not too_common(t)]
    if not kept and found:
        kept = found[:1]
    return " OR ".join(_quote(t) for t in kept[:QUERY_TERMS])


def top_k_cosine(
    matrix: npt.NDArray[np.float32],
    vector: npt.NDArray[np.float32],
    k: int,
    mask: npt.NDArray[np.bool_] | None = None,
) -> list[tuple[int, float]]:
    """The ``k`` rows of ``matrix`` (L2-normalised rows) with the highest cosine to
    ``vector``, as (row, cosine), best first; ties by row. ``mask``: only those rows
    (the product is taken over all rows: cheaper than copying the chosen ones out)."""
    if k <= 0 or matrix.shape[0] == 0:
        return []
    query = np.asarray(vector, dtype=np.float32).reshape(-1)
    norm = float(np.linalg.norm(query))
    if norm == 0.0 or not np.isfinite(norm) or query.shape[0] != matrix.shape[1]:
        return []
    scores = matrix @ (query / norm)
    candidates = np.arange(scores.shape[0]) if mask is None else np.flatnonzero(mask)
    if candidates.size > k:
        if mask is not None:
            scores = np.where(mask, scores, -np.inf).astype(np.float32)
        candidates = np.argpartition(-scores, k - 1)[:k]
    order = sorted(candidates.tolist(), key=lambda r: (-float(scores[r]), r))
    return [(r, float(scores[r])) for r in order]


def rrf(rankings: Sequence[Sequence[int]], k: int = RRF_K) -> list[tuple[int, float]]:
    """Reciprocal rank fusion of ``rankings`` (each a list of ids, best first): every id
    scores the sum of 1 / (k + rank) over the lists it is in (rank from 1). Best first;
    equal scores keep the order of first appearance (so pass the vector list first to
    break ties by cosine)."""
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(dict.fromkeys(ranking), start=1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    first = {item: i for i, item in enumerate(scores)}
    return sorted(scores.items(), key=lambda kv: (-kv[1], first[kv[0]]))


def _fold(token: str) -> str:
    """Lower case without accents, as ``remove_diacritics 2`` indexes it."""
    decomposed = unicodedata.normalize("NFD", token.lower())
    return "".join(c for c in decomposed if not unicodedata.combining(c))


def _quote(term: str) -> str:
    return '"' + term.replace('"', '""') + '"'
