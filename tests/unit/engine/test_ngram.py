"""Prompt lookup's n-gram index (``app/engine/local/draft/ngram.py``): pure Python, no model."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.local.draft.ngram import SHORT_MATCH_TOKENS, NgramIndex
from tests.hypothesis_budget import examples


def test_a_long_match_drafts_what_followed_it() -> None:
    text = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1, 2, 3, 4]
    assert NgramIndex(text).draft(6) == [5, 6, 7, 8, 9, 10]


def test_short_matches_draft_less() -> None:
    # Only the last 2 tokens (7, 8) occurred before: a bigram match drafts at most 2.
    assert NgramIndex([7, 8, 20, 21, 22, 23, 9, 7, 8]).draft(8) == [20, 21][: SHORT_MATCH_TOKENS[2]]
    # A trigram match (5, 7, 8) at most 4.
    tri = NgramIndex([5, 7, 8, 20, 21, 22, 23, 24, 9, 5, 7, 8]).draft(8)
    assert tri == [20, 21, 22, 23][: SHORT_MATCH_TOKENS[3]]
    assert NgramIndex([1, 2, 3]).draft(4) == []  # nothing repeats


@settings(max_examples=examples(200), deadline=None)
@given(tokens=st.lists(st.integers(0, 5), max_size=200), k=st.integers(0, 16))
def test_a_draft_is_what_followed_an_earlier_match(tokens: list[int], k: int) -> None:
    draft = NgramIndex(tokens).draft(k)
    assert len(draft) <= k
    if draft:  # some earlier position holds the same tail followed by exactly this draft
        n = len(tokens)
        assert any(
            tokens[at - m : at] == tokens[n - m :] and tokens[at : at + len(draft)] == draft
            for m in (4, 3, 2)
            for at in range(m, n)
        )
