"""Checkpoints of a recurrent state (issue 43): what lets a hybrid or recurrent model
rewind.

Attention caches are cut back to any token (``llama_memory_seq_rm``); a recurrent
state cannot be: it holds the whole past in one state per sequence, and llama.cpp
refuses the cut. So, like llama-server's context checkpoints, the recurrent part of
sequence 0 is copied out (``Native.partial_state``: kilobytes on the test models, some
megabytes per layer on a real one) at the end of each prompt read, every ``EVERY``
tokens inside a long one, and at the end of each reply. A rewind to token ``n`` puts
back the nearest checkpoint at or before ``n``, cuts the attention layers back to it
(llama.cpp accepts the cut once the state is there), and the caller reads on from
there: measured on mamba2, lfm2 and qwen35, the logits afterwards are those of a read
from scratch, exactly.

Bounded: at most ``MAX_KEPT`` checkpoints and ``MAX_BYTES`` in all, the earliest
dropped first (rewinds come near the end: a regenerate, the next turn, an edit of the
last message).
"""

from __future__ import annotations

from app.engine.native.handles import Native

MAX_KEPT = 8
MAX_BYTES = 768 * 1024 * 1024
EVERY = 2048  # tokens between checkpoints inside a long prompt


class Checkpoints:
    """The recurrent state of KV sequence 0 at some token counts."""

    def __init__(self, native: Native) -> None:
        self._native = native
        self._saved: dict[int, bytes] = {}  # token count -> the recurrent part there

    @property
    def positions(self) -> list[int]:
        return sorted(self._saved)

    def take(self, n: int) -> None:
        """Keep the state as it is now, after the cache's first ``n`` tokens."""
        if n <= 0 or n in self._saved:
            return
        data = self._native.partial_state()
        if not data:
            return
        self._saved[n] = data
        self._bound()

    def due(self, n: int) -> bool:
        """Whether a long read has gone ``EVERY`` tokens past the last checkpoint."""
        return n - self._nearest(n) >= EVERY

    def restore(self, n: int) -> int:
        """Put back the nearest checkpoint at or before token ``n`` and forget the later
        ones; the token count it holds (0: none was early enough, nothing changed)."""
        at = self._nearest(n)
        if not at or not self._native.set_partial_state(self._saved[at]):
            return 0
        self.forget_after(at)
        return at

    def saved(self) -> tuple[tuple[int, bytes], ...]:
        """Every checkpoint, in token order (for a snapshot)."""
        return tuple(sorted(self._saved.items()))

    def load(self, saved: tuple[tuple[int, bytes], ...], n_tokens: int) -> None:
        """Take ``saved`` (from a snapshot of ``n_tokens`` tokens) as the checkpoints;
        any past the tokens is left out, and the bounds hold."""
        self._saved = {n: bytes(data) for n, data in saved if 0 < n <= n_tokens and data}
        self._bound()

    def forget_after(self, n: int) -> None:
        for p in [p for p in self._saved if p > n]:
            del self._saved[p]

    def clear(self) -> None:
        self._saved.clear()

    def _nearest(self, n: int) -> int:
        """The latest checkpoint at or before token ``n`` (0: none)."""
        return max((p for p in self._saved if p <= n), default=0)

    def _bound(self) -> None:
        """At most ``MAX_KEPT`` and ``MAX_BYTES``: the earliest go first."""
        while len(self._saved) > MAX_KEPT or sum(map(len, self._saved.values())) > MAX_BYTES:
            del self._saved[min(self._saved)]
