"""The target's side of speculative decoding (``GuessCheck``: a token and a drafter's
guesses evaluated in one batch and checked against the target's own samples), and
taking evaluated tokens back out of the cache (``take_back``), which llama.cpp refuses
on a recurrent state."""

from __future__ import annotations

from typing import Any

from app.engine.context_map import ContextMap
from app.engine.native.handles import HYBRID, RECURRENT, Native
from app.util.errors import DecodeError


def take_back(native: Native, cmap: ContextMap, n: int) -> bool:
    """Remove what was evaluated from position ``n`` on. Where llama.cpp refuses (a
    recurrent state cannot be cut back), the cache is emptied, so the next prompt is read
    whole rather than from a state that still holds it; returns False then."""
    if native.seq_rm(n):
        return True
    native.clear()
    cmap.clear()
    return False


class GuessCheck:
    """The target's side of speculative decoding: evaluate a token and its guesses in
    one batch, and sample each position to see how many guesses hold.

    The sampled token and up to ``length.next()`` guesses are evaluated in one
    batch, with logits for each position. Each position is then sampled with the
    target's own sampler chain, in order, and a guess is kept while it equals what
    was sampled; the first sample that differs is the next token. So every token
    of the reply is drawn from the target's distribution by the same sampler with
    the same random draws as plain decoding (greedy or sampled, penalties and
    grammars included): the drafter only decides how much is evaluated at once.
    What can differ is arithmetic: llama.cpp's CPU kernels round a batch of
    positions slightly differently from one token at a time, so logits differ in
    the last bits and a greedy choice between two near-equal tokens can flip (see
    docs/NOTES.md).
    """

    def __init__(
        self,
        native: Native,
        cmap: ContextMap,
        sampler: Any,
        k_max: int,
        stop_ids: frozenset[int],
    ) -> None:
        import llama_cpp

        self._native = native
        self._cmap = cmap
        self._sampler = sampler
        self._stop_ids = stop_ids
        self._batch = llama_cpp.llama_batch_init(k_max + 1, 0, 1)
        # A recurrent state cannot be cut back: it is copied out before each batch of
        # guesses, and a rejection puts it back and reads the kept tokens again.
        self._recurrent = native.memory_kind() in (RECURRENT, HYBRID)
        self._before: tuple[int, list[int], bytes] | None = None  # (n_past, batch, state)

    def close(self) -> None:
        import llama_cpp

        llama_cpp.llama_batch_free(self._batch)

    def reject(self, n: int) -> None:
        """Take the rejected guesses (from position ``n`` on) back out of the cache; a
        recurrent state goes back to its copy from before the batch and reads the kept
        tokens again (measured exact: the reply is the plain one).

        Raises:
            DecodeError: llama.cpp refused (the cache is emptied: never sampled from).
        """
        if self._before is not None:
            # Back to the state before the batch, then the kept tokens read again.
            start, batch, state = self._before
            native = self._native
            if (
                native.set_partial_state(state)
                and native.seq_rm(start)
                and native.decode(batch[: n - start]) == 0
            ):
                return
        if not take_back(self._native, self._cmap, n):
            raise DecodeError(
                "llama.cpp could not take the rejected guesses back out of the cache; "
                "the next message reads the conversation again."
            )

    def plain(self, token: int, n_past: int) -> None:
        """Evaluate ``token`` alone.

        Raises:
            DecodeError: llama.cpp failed (what it evaluated is removed).
        """
        rc = self._native.decode_one(token)
        if rc != 0:
            take_back(self._native, self._cmap, n_past)
            raise DecodeError(f"llama.cpp failed while generating (code {rc}).")

    def guesses(self, pending: int, draft: list[int], n_past: int, left: int) -> tuple[int, int]:
        """Evaluate ``pending`` and ``draft``; returns how many guesses the target's own
        samples agree with (at most ``left - 1``, the reply's room), and the next token.

        Raises:
            DecodeError: llama.cpp failed (what it evaluated is removed).
        """
        import llama_cpp

        if self._recurrent:
            self._before = (n_past, [pending, *draft], self._native.partial_state())
        batch = self._batch
        batch.n_tokens = 1 + len(draft)
        for i, tok in enumerate((pending, *draft)):
            batch.token[i] = tok
            batch.pos[i] = n_past + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = True
        native = self._native
        rc = llama_cpp.llama_decode(native.ctx, batch)
        if rc != 0:
            take_back(native, self._cmap, n_past)
            raise DecodeError(f"llama.cpp failed while generating (code {rc}).")
        if native.after_decode is not None:
            native.after_decode((pending, *draft))
        # Position i's logits follow [pending, d1..di]: sample, compare with d(i+1).
        sample, is_eog = llama_cpp.llama_sampler_sample, llama_cpp.llama_vocab_is_eog
        kept = 0
        nxt = sample(self._sampler, native.ctx, 0)
        for i, guess in enumerate(draft):
            if nxt != guess or nxt in self._stop_ids or is_eog(native.vocab, nxt):
                break
            kept += 1
            if kept >= left:
                break  # the reply ends with this guess: nothing to sample after it
            nxt = sample(self._sampler, native.ctx, i + 1)
        return kept, nxt
