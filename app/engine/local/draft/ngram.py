"""Prompt-lookup drafting: guess the next tokens from where the latest n-gram last occurred."""

from __future__ import annotations

import itertools
from collections.abc import Iterable

NGRAM_SIZES = (4, 3, 2)
SHORT_MATCH_TOKENS = {3: 4, 2: 2}
"""The most tokens drafted after a match of only 3 or 2 tokens. Short matches guess far
worse (measured on greedy replies here: 91-95% of tokens kept after a 4-gram, 50-75%
after a bigram; sampled text less), and a failed long draft costs a wide batch."""


class NgramIndex:
    """For each n-gram, where it was last followed by a known token. Appends are O(1)."""

    def __init__(self, tokens: Iterable[int] = (), sizes: tuple[int, ...] = NGRAM_SIZES) -> None:
        self.sizes = sizes
        self.tokens: list[int] = []
        self._next: dict[tuple[int, ...], int] = {}
        for t in tokens:
            self.append(t)

    def append(self, token: int) -> None:
        m = len(self.tokens)
        for n in self.sizes:
            if m >= n:
                # The n-gram ending just before position m is followed by the token at m.
                self._next[tuple(self.tokens[m - n : m])] = m
        self.tokens.append(token)

    def draft(self, k: int) -> list[int]:
        """Up to ``k`` tokens that followed the longest recent n-gram matching the end."""
        h = self.tokens
        for n in self.sizes:
            if len(h) < n:
                continue
            at = self._next.get(tuple(h[-n:]))
            if at is not None:
                draft = h[at : at + min(k, SHORT_MATCH_TOKENS.get(n, k))]
                # An image's pseudo-tokens are no text to propose: the draft ends there.
                return list(itertools.takewhile(lambda t: t >= 0, draft))
        return []
