"""Drafters for speculative decoding: who guesses the next tokens for the target to check.

A drafter follows the sequence the target has committed (``sync`` at the start of
a reply and after a context shift, ``observe`` as tokens are committed) and
proposes up to ``k`` tokens that may follow it. After the target has verified a
proposal, ``rewind(n_kept)`` says how many of its tokens were kept: they join the
sequence, the rest are forgotten. The drafters never change what the target
samples; they only decide what is verified in one batch.

- :class:`NgramDrafter` (prompt lookup): the tokens that followed the latest
  n-gram where it last occurred. Free when nothing matches.
- :class:`ModelDrafter`: a small model with the target's vocabulary, in a second
  ``llama_cpp.Llama`` on the same (worker) thread with its own small KV cache. It
  evaluates what the target committed that it lacks in one batch, then decodes
  greedily, one token at a time, until ``k`` tokens or its confidence falls below
  ``p_min``. Its KV cache keeps the longest prefix it shares with the target's
  sequence, so turns, regenerations, edits and snapshot restores cost only the
  tokens that differ. Asked to read at most ``read_limit`` tokens, it starts over
  from the sequence's last ``read_limit`` tokens (behind a BOS token, which models
  attend to as a sink) instead of reading everything it lacks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol

from app.engine.context_map import common_prefix
from app.engine.local.draft.ngram import NgramIndex
from app.engine.native.handles import Native

log = logging.getLogger(__name__)

P_MIN = 0.3
"""A draft model stops guessing when its top token's probability falls below this."""
PREFILL_TOKENS = 4
"""A catch-up longer than this is the draft's prompt reading, not per-round cost."""


class Drafter(Protocol):
    """Guesses the tokens after the target's committed sequence."""

    kind: str  # "lookup" or "model" (MessageMetrics.draft_kind)
    ms: float  # time spent drafting since the last ``sync`` (MessageMetrics.draft_ms)
    round_ms: float  # the last ``propose``, less a long catch-up (the controller's cost)
    read_n: int  # tokens the last ``propose`` read before guessing, when that was a catch-up
    read_ms: float  # ... and the time it took

    @property
    def lag(self) -> int:
        """Tokens the next ``propose`` would read before its first guess."""

    def sync(self, tokens: Sequence[int], stop: threading.Event | None = None) -> None:
        """The target's sequence is now ``tokens`` (a new reply, or after a context shift)."""

    def observe(self, tokens: Sequence[int]) -> None:
        """The target committed ``tokens`` after the sequence."""

    def propose(self, k: int, read_limit: int = 0) -> list[int]:
        """Up to ``k`` tokens that may follow the sequence (fewer, or none, is fine),
        reading at most ``read_limit`` tokens first (0: whatever it lacks)."""

    def rewind(self, n_kept: int) -> None:
        """The first ``n_kept`` tokens of the last proposal were committed; forget the rest."""


class NgramDrafter:
    """Prompt-lookup drafting over :class:`NgramIndex` (no model, no cost on a miss)."""

    kind = "lookup"

    lag = 0  # reads nothing: the index is updated as tokens are committed
    read_n = 0
    read_ms = 0.0

    def __init__(self) -> None:
        self.ms = 0.0
        self.round_ms = 0.0
        self._index = NgramIndex()
        self._last: list[int] = []

    def sync(self, tokens: Sequence[int], stop: threading.Event | None = None) -> None:
        del stop
        self._index = NgramIndex(tokens)
        self._last = []
        self.ms = 0.0

    def observe(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            self._index.append(t)

    def propose(self, k: int, read_limit: int = 0) -> list[int]:
        del read_limit
        t0 = time.perf_counter()
        self._last = self._index.draft(k) if k > 0 else []
        self.round_ms = (time.perf_counter() - t0) * 1000
        self.ms += self.round_ms
        return self._last

    def rewind(self, n_kept: int) -> None:
        self.observe(self._last[:n_kept])
        self._last = []


class ModelDrafter:
    """A draft model (``llama_cpp.Llama``) that guesses greedily for the target.

    ``llm`` is owned by this object (``close`` frees it). Its KV sequence 0 holds
    the ``sink`` (nothing, or a BOS token when ``base`` > 0), then
    ``seq[base:base + len(kv)]`` for the first ``match`` tokens of ``kv``, then
    guesses not (yet) committed. When the sequence outgrows the draft's context,
    or a read is limited, the draft restarts later in the sequence (``base`` moves
    on): a draft only needs recent text to guess well.
    """

    kind = "model"

    def __init__(self, llm: Any, p_min: float = P_MIN) -> None:
        import llama_cpp
        import numpy as np

        self.llm = llm
        self.native = native = Native(llm)
        self.p_min = p_min
        self.ms = 0.0
        self.round_ms = 0.0
        self.read_n = 0
        self.read_ms = 0.0
        self._ctx = native.ctx
        self._mem = native.memory
        self._n_ctx = native.n_ctx()
        self._n_batch = native.n_batch
        self._n_vocab = native.n_vocab()
        self._n_swa = native.n_swa()
        vocab = native.vocab
        bos = int(llama_cpp.llama_vocab_bos(vocab))
        self._bos = bos if bos >= 0 and llama_cpp.llama_vocab_get_add_bos(vocab) else -1
        self._buf = np.empty(self._n_vocab, dtype=np.float32)
        self._one = (llama_cpp.llama_token * 1)()
        self._seq: list[int] = []
        self._kv: list[int] = []
        self._sink = 0  # tokens before seq[base] in the cache (a BOS when base > 0)
        self._base = 0
        self._match = 0
        self._last: list[int] = []
        self._stop: threading.Event | None = None

    @property
    def cached_tokens(self) -> list[int]:
        """A copy of the tokens in the draft's KV cache after the sink (for tests)."""
        return list(self._kv)

    @property
    def base(self) -> int:
        """The target position the draft's first cached sequence token stands for."""
        return self._base

    @property
    def lag(self) -> int:
        if not self._seq:
            return 0
        return max(1, len(self._seq) - self._base - self._match)

    def close(self) -> None:
        if self.llm is not None:
            self.llm.close()
        self.llm = None
        self._kv = []
        self._seq = []

    def clear(self) -> None:
        """Forget everything in the draft's cache."""
        import llama_cpp

        llama_cpp.llama_memory_clear(self._mem, True)
        self._kv = []
        self._sink = 0
        self._base = 0
        self._match = 0

    def warm(self) -> tuple[float, float]:
        """Run the draft once so its weights are paged in and its graphs built before a
        reply needs them; returns (ms per token read, ms per guess), measured after."""
        import llama_cpp

        tok = self._bos if self._bos >= 0 else 0
        n = max(1, min(32, self._n_batch, self._n_ctx // 4))
        arr = (llama_cpp.llama_token * n)(*([tok] * n))
        timings = []
        for _ in range(2):  # the first pass pages the weights in and builds the graphs
            llama_cpp.llama_memory_clear(self._mem, True)
            t0 = time.perf_counter()
            llama_cpp.llama_decode(self._ctx, llama_cpp.llama_batch_get_one(arr, n))
            t1 = time.perf_counter()
            self._one[0] = tok
            llama_cpp.llama_decode(self._ctx, llama_cpp.llama_batch_get_one(self._one, 1))
            timings.append(((t1 - t0) * 1000 / n, (time.perf_counter() - t1) * 1000))
        self.clear()
        return timings[-1]

    # -- Drafter -----------------------------------------------------------------------

    def sync(self, tokens: Sequence[int], stop: threading.Event | None = None) -> None:
        self._stop = stop
        self._seq = list(tokens)
        self._last = []
        self.ms = 0.0
        if self._base and self._base >= len(self._seq):
            self.clear()
        self._match = common_prefix(self._kv, self._seq[self._base :])

    def observe(self, tokens: Sequence[int]) -> None:
        kv = self._kv
        for t in tokens:
            i = len(self._seq) - self._base
            self._seq.append(t)
            if self._match == i and i < len(kv) and kv[i] == t:
                self._match += 1

    def rewind(self, n_kept: int) -> None:
        self.observe(self._last[:n_kept])
        self._last = []
        self._trim()

    def propose(self, k: int, read_limit: int = 0) -> list[int]:
        import llama_cpp
        import numpy as np

        t0 = time.perf_counter()
        self._last = []
        self.round_ms = 0.0
        self.read_n = 0
        self.read_ms = 0.0
        if k <= 0 or not self._seq:
            return []
        if read_limit > 0 and self.lag > read_limit:
            self._restart(len(self._seq) - read_limit)
        elif self._sink + len(self._seq) - self._base + k + 1 > self._n_ctx:
            self._restart(len(self._seq) - self._n_ctx // 2)
        if self._match == len(self._seq) - self._base:
            self._match -= 1  # the last token is evaluated again for its logits
        self._trim()
        todo = self._seq[self._base + len(self._kv) :]
        if not self._evaluate(todo):
            return []
        t_guess = time.perf_counter()
        buf = self._buf
        row_ptr = llama_cpp.llama_get_logits_ith(self._ctx, -1)
        draft: list[int] = []
        while True:
            row = np.ctypeslib.as_array(row_ptr, shape=(self._n_vocab,))
            tok = int(row.argmax())
            if self.p_min > 0.0:
                np.subtract(row, row[tok], out=buf)
                np.exp(buf, out=buf)
                if 1.0 / float(buf.sum()) < self.p_min:
                    break
            draft.append(tok)
            if len(draft) >= k:
                break
            self._one[0] = tok
            rc = llama_cpp.llama_decode(self._ctx, llama_cpp.llama_batch_get_one(self._one, 1))
            if rc != 0:
                self._fail(rc)
                break
            self._kv.append(tok)
            row_ptr = llama_cpp.llama_get_logits_ith(self._ctx, -1)
        t1 = time.perf_counter()
        self.ms += (t1 - t0) * 1000
        # A long catch-up (the prompt, after a new message) is the draft's prompt reading.
        if len(todo) > PREFILL_TOKENS:
            self.read_n, self.read_ms = len(todo), (t_guess - t0) * 1000
        self.round_ms = (t1 - (t_guess if len(todo) > PREFILL_TOKENS else t0)) * 1000
        self._last = draft
        return draft

    # -- internals -----------------------------------------------------------------------

    def _restart(self, base: int) -> None:
        """Start the cache over at ``seq[base]``, behind a BOS sink when base > 0."""
        import llama_cpp

        self.clear()
        self._base = max(0, base)
        if self._base > 0 and self._bos >= 0:
            self._one[0] = self._bos
            rc = llama_cpp.llama_decode(self._ctx, llama_cpp.llama_batch_get_one(self._one, 1))
            if rc == 0:
                self._sink = 1
            else:
                llama_cpp.llama_memory_clear(self._mem, True)

    def _trim(self) -> None:
        """Drop the draft's cached tokens after the prefix it shares with the sequence."""
        import llama_cpp

        n = self._match
        if n >= len(self._kv):
            return
        at = self._sink + n
        pos_min = llama_cpp.llama_memory_seq_pos_min(self._mem, 0)
        window_gone = at > 0 and self._n_swa > 0 and pos_min > max(0, at - self._n_swa)
        if window_gone or not llama_cpp.llama_memory_seq_rm(self._mem, 0, at, -1):
            self._restart(self._base)  # evaluated again from ``base`` by the next proposal
            return
        del self._kv[n:]

    def _evaluate(self, tokens: Sequence[int]) -> bool:
        """Append ``tokens`` to the draft's cache in batches; False when stopped or failed."""
        import llama_cpp

        for start in range(0, len(tokens), self._n_batch):
            if start and self._stop is not None and self._stop.is_set():
                return False
            chunk = tokens[start : start + self._n_batch]
            arr = (llama_cpp.llama_token * len(chunk))(*chunk)
            rc = llama_cpp.llama_decode(self._ctx, llama_cpp.llama_batch_get_one(arr, len(chunk)))
            if rc != 0:
                self._fail(rc)
                return False
            self._kv.extend(chunk)
            self._match = len(self._kv)
        return True

    def _fail(self, rc: int) -> None:
        """A failed draft evaluation only costs the guesses: start the draft over."""
        log.warning("draft model evaluation failed (code %d); its cache is cleared", rc)
        self._restart(self._base)
