"""Greedy replies compared across batch shapes: the same up to a near-tie.

On the CPU backend a token's logits depend slightly on how the tokens before it were
batched (docs/NOTES.md, "Batch shape changes llama.cpp's arithmetic"): a prompt read in
one batch or in chunks, a reply decoded one token at a time or verified in draft
batches. By how much, and so where a greedy choice flips, depends on the CPU's kernels
and the build: a reply that matches another batch shape on one machine parts from it
on another. Tests that compare batch shapes therefore check what our code decides
exactly (tokens evaluated, the cached tokens) and, for the replies:

- ``worst_gap``: every token of a cached greedy reply is the argmax of one batched
  evaluation of prompt and reply, or within ``NEAR_TIE`` of it, and at most
  ``MAX_NEAR_TIES`` are such near-ties;
- ``same_up_to_near_tie``: two greedy replies to the same prompt tokens agree up to
  their first difference, and there both choices were within ``NEAR_TIE`` of the top.

Not a bound on the logits themselves: measured here, the top logits move by up to ~1.3
between a prompt read in one batch and one token at a time, more than one wrong token
170 positions back moves them (0.85); what stays small is the gap between a greedy
choice and the top logit of another shape. A cache that holds a wrong token gives a
reply that is not the greedy reply of its own tokens, and fails ``worst_gap``.

The helpers evaluate tokens in one batch (at most the context's ``n_batch``) from an
empty cache, and leave the engine's cache empty. With a repetition penalty the logits
are penalized the way llama.cpp's penalties sampler does (over the last
``repeat_last_n`` tokens, prompt included), so the check follows the choices greedy
sampling made. ``reply_nll`` scores a reply under one batched evaluation, for caches
that are not the same computation as a fresh read (a shifted one).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from app.config.setting_records import SamplingParams
from app.engine.local.engine import Engine

NEAR_TIE = 0.75
"""Logits: a greedy choice this close to the top one may flip with the batch shape. How
far batch shapes move logits depends on the build and the CPU: the first measurements
(docs/NOTES.md) saw ~0.2 and greedy flips at gaps of 0.04; with the llama.cpp build
installed now (its AVX2 kernels, on this AMD EPYC), the difference between two of the
top five logits moves by up to 0.71 between one batch and chunks of 7 or single tokens
(median 0.22), and drafted replies part from one batched evaluation at gaps up to
0.41. A wrong key or value in the cache gives gaps of several units (4.8 to 12.7 for
one wrong token)."""

MAX_NEAR_TIES = 4
"""Reply tokens that may be near-ties rather than the argmax, per reply (three in one
32-token drafted reply seen here)."""

GREEDY = SamplingParams.greedy()


def batched_rows(engine: Engine, tokens: Sequence[int], first: int) -> Any:
    """The logits rows for positions ``first`` to ``len(tokens) - 1`` (an ``(n, n_vocab)``
    array), from one batch of ``tokens`` evaluated in an empty cache. Empties the cache."""
    import llama_cpp

    llm = engine.llama
    ctx = engine.native.ctx
    n = len(tokens)
    assert 0 <= first < n <= llama_cpp.llama_n_batch(ctx)  # one batch, or llama.cpp aborts
    engine.reset()
    batch = llama_cpp.llama_batch_init(n, 0, 1)
    try:
        batch.n_tokens = n
        for i, tok in enumerate(tokens):
            batch.token[i] = tok
            batch.pos[i] = i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = i >= first
        assert llama_cpp.llama_decode(ctx, batch) == 0
        rows = np.stack(
            [
                np.ctypeslib.as_array(
                    llama_cpp.llama_get_logits_ith(ctx, i), shape=(llm.n_vocab(),)
                ).copy()
                for i in range(first, n)
            ]
        )
    finally:
        llama_cpp.llama_batch_free(batch)
        engine.reset()
    return rows


def penalized(rows: Any, tokens: Sequence[int], first: int, params: SamplingParams) -> Any:
    """``rows`` (positions ``first`` on) as greedy sampling with ``params`` saw them: the
    repeat penalty on the tokens of the last ``repeat_last_n`` positions up to each row's."""
    if params.repeat_penalty == 1.0 or params.repeat_last_n == 0:
        return rows
    assert params.presence_penalty == 0.0 and params.frequency_penalty == 0.0
    last_n = params.repeat_last_n if params.repeat_last_n > 0 else len(tokens)
    out = rows.copy()
    for i, row in enumerate(out):
        pos = first + i
        seen = np.unique(np.asarray(tokens[max(0, pos + 1 - last_n) : pos + 1]))
        vals = row[seen]
        row[seen] = np.where(vals <= 0, vals * params.repeat_penalty, vals / params.repeat_penalty)
    return out


def reply_gaps(
    engine: Engine, tokens: Sequence[int], n_prompt: int, params: SamplingParams = GREEDY
) -> list[float]:
    """How far below the top (penalized) logit of one batched evaluation each reply token
    ``tokens[n_prompt:]`` was. Empties the cache."""
    if len(tokens) <= n_prompt:
        engine.reset()
        return []
    rows = penalized(batched_rows(engine, tokens, n_prompt - 1), tokens, n_prompt - 1, params)
    reply = tokens[n_prompt:]
    return [float(rows[i].max()) - float(rows[i][tok]) for i, tok in enumerate(reply)]


def assert_greedy(gaps: list[float]) -> float:
    """The reply was greedy up to near-ties; returns its largest gap."""
    assert max(gaps, default=0.0) <= NEAR_TIE, gaps
    assert sum(g > 0 for g in gaps) <= MAX_NEAR_TIES, gaps
    return max(gaps, default=0.0)


def worst_gap(engine: Engine, n_prompt: int, params: SamplingParams = GREEDY) -> float:
    """Check the cached reply against one batched evaluation of prompt and reply.

    Every reply token in the cache must be the argmax of the logits that one batch
    gives at the position before it, or within ``NEAR_TIE`` of the top logit (a
    near-tie), and at most ``MAX_NEAR_TIES`` may be such near-ties. Returns the largest
    gap. Empties the cache.
    """
    return assert_greedy(reply_gaps(engine, engine.cached_tokens, n_prompt, params))


def first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    """The first index where ``a`` and ``b`` differ (the shorter length if one is a
    prefix of the other)."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def same_up_to_near_tie(
    engine: Engine,
    a: Sequence[int],
    b: Sequence[int],
    n_prompt: int,
    params: SamplingParams = GREEDY,
) -> int:
    """Two greedy replies to the same prompt, from two batch shapes, agree but for a near-tie.

    ``a`` and ``b`` are prompt and reply tokens (what the cache held after each reply,
    replies of the same length limit). The prompts must be the same tokens, and each
    reply must pass ``worst_gap``'s check. Where the replies part, one batched
    evaluation of the shared tokens has both choices within ``NEAR_TIE`` of its top
    logit (where one reply ended there instead, its top two logits are that close).
    Returns how many reply tokens agree (-1: all of both). Empties the cache.
    """
    assert list(a[:n_prompt]) == list(b[:n_prompt]), "the two prompts are different tokens"
    for seq in {tuple(a), tuple(b)}:
        assert_greedy(reply_gaps(engine, seq, n_prompt, params))
    at = first_difference(a, b)
    if at == len(a) == len(b):
        return -1
    rows = batched_rows(engine, a[:at], at - 1)
    row = penalized(rows, a[:at], at - 1, params)[0]
    top = float(row.max())
    chosen = [seq[at] for seq in (a, b) if at < len(seq)]
    for tok in chosen:
        assert top - float(row[tok]) <= NEAR_TIE, (at - n_prompt, tok, top - float(row[tok]))
    if len(chosen) < 2:  # one reply ended here (an end of turn, a stop): a near-tie too
        second = float(np.partition(row, -2)[-2])
        assert top - second <= NEAR_TIE, (at - n_prompt, top - second)
    return at - n_prompt


def reply_nll(
    engine: Engine, tokens: Sequence[int], n_prompt: int, params: SamplingParams = GREEDY
) -> float:
    """The reply's mean negative log-likelihood per token (nats) under one batched
    evaluation of ``tokens`` (penalized as sampling saw it). Empties the cache."""
    if len(tokens) <= n_prompt:
        engine.reset()
        return 0.0
    rows = penalized(batched_rows(engine, tokens, n_prompt - 1), tokens, n_prompt - 1, params)
    total = 0.0
    for row, tok in zip(rows, tokens[n_prompt:], strict=False):
        top = float(row.max())
        total += top + float(np.log(np.exp(row - top).sum())) - float(row[tok])
    return total / (len(tokens) - n_prompt)


def token_text(engine: Engine, tokens: Sequence[int], strict: bool = False) -> str:
    """The text ``tokens`` encode, special tokens included. With ``strict``, a token list
    that ends inside a UTF-8 character raises ``UnicodeDecodeError``."""
    data: bytes = engine.llama.detokenize(list(tokens), special=True)
    return data.decode("utf-8", "strict" if strict else "replace")
