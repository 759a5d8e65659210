"""Which text the tokens in the KV cache encode, so a new prompt reuses them exactly.

Re-tokenizing a whole conversation does not always give back the tokens the
model generated (a reply may be "Hel"+"lo" where the tokenizer says "Hello").
Matching the new prompt's *text* against the cached text at known token
boundaries, and tokenizing only the rest, keeps every cached token usable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class ContextMap:
    """Tokens in KV sequence 0 and marks ``(n_tokens, n_chars)`` where
    ``tokens[:n_tokens]`` encode exactly ``text[:n_chars]``."""

    tokens: list[int] = field(default_factory=list)
    text: str = ""
    marks: list[tuple[int, int]] = field(default_factory=lambda: [(0, 0)])

    def clear(self) -> None:
        self.tokens = []
        self.text = ""
        self.marks = [(0, 0)]

    def match(self, text: str) -> tuple[int, int]:
        """The longest mark whose text is a prefix of ``text``."""
        limit = _common_prefix_len(self.text, text)
        best = (0, 0)
        for n, c in self.marks:
            if c <= limit and n <= len(self.tokens):
                best = (n, c)
        return best

    def keep_marks(self, n_tokens: int) -> None:
        """Forget marks past ``n_tokens`` (and the text they vouched for)."""
        self.marks = [m for m in self.marks if m[0] <= n_tokens] or [(0, 0)]
        self.text = self.text[: self.marks[-1][1]]

    def truncate(self, n_tokens: int) -> None:
        del self.tokens[n_tokens:]
        self.keep_marks(n_tokens)

    def mark_at(self, n_tokens: int, n_chars: int) -> None:
        """``tokens[:n_tokens]`` encode ``text[:n_chars]`` (a boundary inside the cache)."""
        if (n_tokens, n_chars) not in self.marks:
            self.marks.append((n_tokens, n_chars))
            self.marks.sort()

    def char_mark(self, n_chars: int) -> int | None:
        """The token count of the mark at ``n_chars`` characters, if there is one."""
        return next((n for n, c in self.marks if c == n_chars and n <= len(self.tokens)), None)

    def drop(self, n_a: int, n_b: int, c_a: int, c_b: int) -> None:
        """Forget tokens ``[n_a, n_b)``, which encode ``text[c_a:c_b]``; the rest close up."""
        dn, dc = n_b - n_a, c_b - c_a
        del self.tokens[n_a:n_b]
        self.text = self.text[:c_a] + self.text[c_b:]
        # The mark at the cut's end closes up onto the one at its start: kept once.
        kept = {(n, c) for n, c in self.marks if n <= n_a and c <= c_a}
        kept.update((n - dn, c - dc) for n, c in self.marks if n >= n_b and c >= c_b)
        self.marks = sorted(kept)

    def mark(self, text: str) -> None:
        """All tokens so far encode ``text``."""
        self.text = text
        if self.marks[-1][0] == len(self.tokens):
            self.marks[-1] = (len(self.tokens), len(text))
        else:
            self.marks.append((len(self.tokens), len(text)))


def common_prefix(a: Sequence[object], b: Sequence[object]) -> int:
    """Length of the shared prefix of two token lists (or strings)."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _common_prefix_len(a: str, b: str) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] holds, a[:hi] == b[:hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo
