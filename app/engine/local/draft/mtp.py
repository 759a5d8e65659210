"""Drafting with the model's own next-token layers (MTP): ``MtpDrafter``.

The next-token block reads every token the target reads, each paired with the target's
hidden row of the position before (``tap``, called by ``Native`` after each of the
target's batches: prompt reads, single tokens, guess checks and re-reads after a
rejection alike). To guess, it reads the token the target is about to read, with the
target's last row, and chains its own guesses: each with the row the block gave out
for it. Guesses are never kept in its cache: ``tap`` reads what the target checked.

Only the guesses come from here: the target checks each (``GuessCheck``), so a reply
is the plain one whatever the block guesses, and on a hybrid target a rejection goes
back through its recurrent-state copy as for any drafter. Where the block's cache
misses positions (pictures, a reopened chat, a context shift), it guesses worse until
it has read on; it never makes a reply wrong.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from app.engine.local.draft.drafters import P_MIN
from app.engine.native.handles import Native
from app.engine.native.nextn import NextnContext

log = logging.getLogger(__name__)

ROWS_KEPT = 256  # target rows kept by position: a rewind re-reads from a nearby one


class MtpDrafter:
    """A ``Drafter`` over ``NextnContext``; ``tap`` must see every target batch."""

    kind = "mtp"
    lag = 0  # it reads along with the target: nothing to catch up before guessing
    read_n = 0
    read_ms = 0.0

    def __init__(self, target: Native, n_threads: int, p_min: float = P_MIN) -> None:
        import numpy as np

        self._target = target
        self._nx = NextnContext(target, n_threads)
        self._zero = np.zeros(self._nx.n_embd, np.float32)
        self._rows: dict[int, Any] = {}  # target position -> its hidden row
        self._next: int | None = None  # the token the target reads next (observed)
        self.p_min = p_min
        self.ms = 0.0
        self.round_ms = 0.0

    def close(self) -> None:
        self._nx.close()
        self._rows.clear()

    def tap(self, tokens: Sequence[int]) -> None:
        """The target just read ``tokens`` (ending at its last position): read them here,
        each with the row of the position before."""
        n = len(tokens)
        rows = self._nx.target_rows(n)
        pos0 = self._target.seq_pos_max() - n + 1
        self._nx.seq_rm(pos0)
        if rows is None or pos0 < 0 or min(tokens) < 0:
            return  # no rows (or picture embeddings): this stretch goes unread here
        before = [self._rows.get(pos0 - 1, self._zero), *rows[:-1]]
        if self._nx.read(tokens, pos0, before) != 0:
            log.warning("the next-token layers failed to read %d tokens", n)
            self._nx.seq_rm(pos0)
            return
        for p in [p for p in self._rows if p >= pos0]:
            del self._rows[p]  # later positions were taken back
        for i in range(n):
            self._rows[pos0 + i] = rows[i]
        while len(self._rows) > ROWS_KEPT:
            del self._rows[min(self._rows)]

    # -- Drafter -----------------------------------------------------------------------

    def sync(self, tokens: Sequence[int], stop: threading.Event | None = None) -> None:
        del tokens, stop  # it reads along with the target (``tap``)
        self._next = None
        self.ms = 0.0

    def observe(self, tokens: Sequence[int]) -> None:
        if tokens:
            self._next = tokens[-1]

    def propose(self, k: int, read_limit: int = 0) -> list[int]:
        del read_limit
        t0 = time.perf_counter()
        draft: list[int] = []
        if k > 0 and self._next is not None:
            pos = self._target.seq_pos_max() + 1  # where the observed token goes
            self._nx.seq_rm(pos)  # guesses checked and rejected last round
            tok, row = self._next, self._rows.get(pos - 1, self._zero)
            while len(draft) < k and row is not None:
                got = self._nx.guess(tok, pos + len(draft), row)
                if got is None or got[1] < self.p_min:
                    break
                tok, _p, row = got
                draft.append(tok)
            self._nx.seq_rm(pos)  # the target's check reads them back (``tap``)
        self._next = None
        self.round_ms = (time.perf_counter() - t0) * 1000
        self.ms += self.round_ms
        return draft

    def rewind(self, n_kept: int) -> None:
        del n_kept  # the check's batch was read by ``tap``; the next one cuts it back
