"""Speculative decoding with a draft model (and prompt lookup) on the real default model.

Two drafts: ``draft_path``, the target's first 4 blocks (a genuinely smaller model
whose guesses almost always fail), and the target file itself, whose guesses are
kept nearly always, so the accept and rewind paths run too.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from app.config.setting_records import SamplingParams
from app.engine.backend import Finished
from app.engine.chat_message import ChatMessage
from app.engine.local.draft import length as draft_length
from app.engine.local.engine import Engine
from app.util.errors import DraftError
from tests.near_tie import worst_gap

PARAGRAPH = (
    "Lamplight keeps every conversation on disk together with its key-value cache, so a "
    "long chat reopens at once and the next reply starts without reading the history again."
)
PROMPTS = (
    f"Rewrite this paragraph with one word changed:\n\n{PARAGRAPH}",
    "Write a short story about a lighthouse keeper.",
)
GREEDY = SamplingParams.greedy(32)
DRAFT = replace(GREEDY, draft_model=True, adaptive_draft=False, draft_len=6)


@pytest.fixture()
def engine(one_engine: Engine) -> Iterator[Engine]:
    one_engine.reset()
    yield one_engine
    one_engine.set_draft(None)


def reply(
    engine: Engine, messages: list[ChatMessage], params: SamplingParams, stop_after: int = 0
) -> Finished:
    stop = threading.Event()
    for n, event in enumerate(engine.generate(messages, params, stop), 1):
        if isinstance(event, Finished):
            return event
        if stop_after and n >= stop_after:
            stop.set()
    raise AssertionError("no Finished event")


class Spy:
    """Wraps a drafter and counts what it was told and what it proposed."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.kind = inner.kind
        self.proposed = 0
        self.kept = 0
        self.observed = 0
        self.reads: list[int] = []  # catch-ups read before guessing

    def __getattr__(self, name: str) -> Any:
        # The drafter's own figures (ms, round_ms, lag, read_n, read_ms), read through.
        return getattr(self.inner, name)

    def sync(self, tokens: Any, stop: Any = None) -> None:
        self.inner.sync(tokens, stop)

    def observe(self, tokens: Any) -> None:
        self.observed += len(tokens)
        self.inner.observe(tokens)

    def propose(self, k: int, read_limit: int = 0) -> list[int]:
        out: list[int] = self.inner.propose(k, read_limit)
        if self.inner.read_n:
            self.reads.append(self.inner.read_n)
        self.proposed += len(out)
        return out

    def rewind(self, n_kept: int) -> None:
        self.kept += n_kept
        self.inner.rewind(n_kept)


def test_greedy_with_a_draft_equals_batched_reevaluation(
    engine: Engine, model_path: Path, draft_path: Path
) -> None:
    info = engine.set_draft(model_path)
    assert info is not None and engine.draft_info == info and info.n_ctx == 2048
    for prompt in PROMPTS:
        msgs = [ChatMessage("user", prompt)]
        plain = reply(engine, msgs, GREEDY)
        n_prompt = plain.metrics.prompt_tokens
        plain_gap = worst_gap(engine, n_prompt)  # one-token decoding meets the same bar
        done = reply(engine, msgs, DRAFT)
        m = done.metrics
        assert m.draft_kind == "model" and m.generated_tokens == 32
        assert m.accepted_tokens > 16 and m.draft_ms > 0
        # Identical to plain decoding but for near-ties: both pass the same check.
        gap = worst_gap(engine, n_prompt)
        print(f"near-tie gaps: plain {plain_gap:.3f}, drafted {gap:.3f}", done.text == plain.text)
    # The genuinely smaller draft: its guesses fail, the reply is the target's.
    engine.set_draft(draft_path)
    done = reply(engine, [ChatMessage("user", PROMPTS[0])], DRAFT)
    assert done.metrics.drafted_tokens > 0
    assert done.metrics.accepted_tokens < done.metrics.drafted_tokens / 2
    worst_gap(engine, done.metrics.prompt_tokens)


def test_acceptance_figures_add_up(
    engine: Engine, model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.engine.local import reply_decode

    engine.set_draft(model_path)
    spies: list[Spy] = []
    real_decode = reply_decode.decode

    def spying_decode(job: Any) -> Any:
        spies.append(Spy(job.drafter))
        job.drafter = spies[-1]
        return real_decode(job)

    monkeypatch.setattr(reply_decode, "decode", spying_decode)
    for params in (DRAFT, replace(DRAFT, draft_model=False, speculative=True)):
        engine.reset()
        m = reply(engine, [ChatMessage("user", PROMPTS[0])], params).metrics
        spy = spies[-1]
        assert m.drafted_tokens == spy.proposed and m.accepted_tokens == spy.kept
        assert 0 < m.accepted_tokens <= m.drafted_tokens
        # Every token is a kept guess or one the target sampled itself (the last one
        # may end the reply before the drafter hears of it).
        assert m.generated_tokens - m.accepted_tokens - spy.observed in (0, 1)
        assert m.draft_kind == spy.kind and m.draft_len_final == params.draft_len


def test_stop_and_regenerate_with_a_draft(engine: Engine, model_path: Path) -> None:
    engine.set_draft(model_path)
    msgs = [ChatMessage("user", PROMPTS[0])]
    params = replace(DRAFT, max_tokens=48)
    stopped = reply(engine, msgs, params, stop_after=10)
    assert stopped.metrics.stop_reason == "cancelled"
    assert 5 <= stopped.metrics.generated_tokens < 48
    tokens = engine.cached_tokens
    assert engine.draft_tokens[: len(tokens) - 8] == tokens[: len(tokens) - 8]
    first = reply(engine, msgs, params)  # regenerate: the same messages again
    again = reply(engine, msgs, params)
    assert first.text == again.text and again.metrics.evaluated_tokens <= 1
    assert again.metrics.accepted_tokens > 0
    n_prompt = again.metrics.prompt_tokens
    # The draft's cache follows the target's: what it holds beyond the shared prefix
    # is only its last guesses.
    tokens = engine.cached_tokens
    shared = next(
        (i for i, (a, b) in enumerate(zip(engine.draft_tokens, tokens, strict=False)) if a != b),
        min(len(tokens), len(engine.draft_tokens)),
    )
    assert shared >= len(tokens) - 2
    worst_gap(engine, n_prompt)


def test_a_follow_up_after_a_snapshot_restore_with_a_draft(
    engine: Engine, model_path: Path
) -> None:
    msgs = [ChatMessage("user", PROMPTS[0])]
    first = reply(engine, msgs, GREEDY)
    saved = engine.export_state()
    engine.reset()
    engine.set_draft(model_path)  # an empty draft cache meets a restored target cache
    engine.import_state(saved)
    follow = [*msgs, ChatMessage("assistant", first.text), ChatMessage("user", "Again, please.")]
    done = reply(engine, follow, DRAFT)
    m = done.metrics
    assert m.cached_tokens >= len(saved.tokens) - 1 and m.generated_tokens == 32
    assert m.accepted_tokens > 0
    assert engine.draft_tokens[: m.prompt_tokens] == engine.cached_tokens[: m.prompt_tokens]
    worst_gap(engine, m.prompt_tokens)


def test_a_draft_with_another_vocabulary_is_refused(
    engine: Engine, model_path: Path, draft_path: Path, tmp_path: Path
) -> None:
    from tests.draft_model import vocab_variant

    engine.set_draft(draft_path)
    other = vocab_variant(model_path, tmp_path / "other.gguf", tokens={1000: "lamplight"})
    with pytest.raises(DraftError) as err:
        engine.set_draft(other)
    assert str(err.value).endswith(".") and "\n" not in str(err.value)
    info = engine.draft_info
    assert info is not None and info.path == draft_path  # the previous draft stays
    with pytest.raises(DraftError, match=r"not loaded|not found|cannot"):
        engine.set_draft(tmp_path / "missing.gguf")
    assert engine.set_draft(None) is None and engine.draft_info is None
    assert engine.capabilities.draft_model


Round = tuple[int, int, int, int]
"""One drafting round as the adaptive length saw it: (length before, guesses drafted,
guesses kept, length after)."""


def record_rounds(monkeypatch: pytest.MonkeyPatch) -> list[Round]:
    rounds: list[Round] = []
    real_round = draft_length.DraftLength.round

    def spy(self: draft_length.DraftLength, drafted: int, kept: int, *args: Any) -> None:
        before = self.k
        real_round(self, drafted, kept, *args)
        rounds.append((before, drafted, kept, self.k))

    monkeypatch.setattr(draft_length.DraftLength, "round", spy)
    return rounds


def assert_shrinks_where_guesses_fail(
    rounds: list[Round], final: int, k_max: int, idle: tuple[int, ...] = (0,)
) -> None:
    """What the adaptive length guarantees for any acceptance and any measured costs.

    A spell of drafting starts with a probe of ``PROBE`` guesses; a round drafts at most
    the length it was given, and the next is at most twice it (growth is earned); once
    the recent rounds (``RUNS``) kept no guess, no length can beat plain decoding, so
    the length is 0; and the reply ends at 0 unless its recent guesses were kept (at one
    of ``idle`` if it never drafted). Which guesses are kept depends on the text, and so
    on the CPU's rounding (docs/NOTES.md).
    """
    for i, (before, drafted, kept, after) in enumerate(rounds):
        assert 0 <= kept <= drafted <= (before or min(draft_length.PROBE, k_max)), rounds[i]
        assert after <= min(k_max, 2 * (before or drafted)), rounds[i]
        recent = rounds[max(0, i + 1 - draft_length.RUNS) : i + 1]
        if not any(r[2] for r in recent):
            assert after == 0, rounds[i]
    recent = rounds[-draft_length.RUNS :]
    if not any(r[2] for r in recent):
        assert final == 0 if rounds else final in idle, (final, rounds)


def test_adaptive_length_shrinks_where_drafts_fail(
    engine: Engine, draft_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine.set_draft(draft_path)
    rounds = record_rounds(monkeypatch)
    msgs = [ChatMessage("user", PROMPTS[1])]
    params = replace(GREEDY, max_tokens=48, draft_model=True)
    fixed = reply(engine, msgs, replace(params, adaptive_draft=False)).metrics
    # The smaller draft's guesses fail: most of a fixed length's are thrown away.
    assert fixed.accepted_tokens * 4 < fixed.drafted_tokens
    rounds.clear()
    engine.reset()
    adaptive = reply(engine, msgs, params).metrics
    assert_shrinks_where_guesses_fail(rounds, adaptive.draft_len_final, params.draft_len)
    # Where (here, whether) it probes depends on measured costs; either way it throws
    # away a fraction of the guesses a fixed length does.
    wasted = adaptive.drafted_tokens - adaptive.accepted_tokens
    assert wasted * 4 < fixed.drafted_tokens - fixed.accepted_tokens, (wasted, rounds)
    # Prompt lookup on sampled text with nothing to repeat: it stops drafting too.
    rounds.clear()
    engine.reset()
    hot = SamplingParams(temperature=1.5, seed=3, max_tokens=48, speculative=True)
    lookup = reply(engine, msgs, hot).metrics
    # (Lookup starts at 4 and keeps that while nothing matches: it never drafted.)
    assert_shrinks_where_guesses_fail(rounds, lookup.draft_len_final, hot.draft_len, (0, 4))


def test_adaptive_length_grows_on_repetitive_text(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Timing decides too; pin the costs to a machine where batches are cheap.
    monkeypatch.setattr(draft_length.DraftCosts, "batch", lambda self, n: 10.0 + 0.5 * n)
    # The reply's loss is counted from real step times against that pinned plain cost,
    # so lift the budget too (tests/unit/engine/test_draft_length.py checks it).
    monkeypatch.setattr(draft_length, "ALLOWANCE", 1e6)
    asked: list[int] = []
    real_next = draft_length.DraftLength.next

    def next_k(self: draft_length.DraftLength, lag: int = 0) -> int:
        asked.append(real_next(self, lag))
        return asked[-1]

    monkeypatch.setattr(draft_length.DraftLength, "next", next_k)
    prompt = PROMPTS[0]
    params = replace(GREEDY, max_tokens=64, speculative=True, draft_len=8)
    m = reply(engine, [ChatMessage("user", prompt)], params).metrics
    first = next(k for k in asked if k > 0)  # after the plain steps (if not measured yet)
    assert m.draft_kind == "lookup" and max(asked) > first == 4
    assert m.accepted_tokens > 16


def test_a_new_draft_reads_only_recent_text_until_it_has_paid(
    engine: Engine, model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.engine.local import reply_decode

    # Afford a probe at once (the budget, with real timings, waits a few hundred tokens).
    monkeypatch.setattr(draft_length, "BUDGET", 1.0)
    spies: list[Spy] = []
    real_decode = reply_decode.decode

    def spying_decode(job: Any) -> Any:
        spies.append(Spy(job.drafter))
        job.drafter = spies[-1]
        return real_decode(job)

    monkeypatch.setattr(reply_decode, "decode", spying_decode)
    engine._draft.costs.clear()  # the shared engine remembers earlier tests' drafts
    info = engine.set_draft(model_path)  # agrees with the target: its guesses are kept
    assert info is not None
    costs = engine._draft.costs[f"model:{info.path}"]
    assert costs.read_prior > 0.0 and costs.guess_prior > 0.0  # timed as it loaded
    assert not costs.proven and costs.draft_ms == 0.0  # priors only price a probe
    msgs = [ChatMessage("user", " ".join([PARAGRAPH] * 5) + "\n\nSay it again.")]
    params = replace(GREEDY, max_tokens=24, draft_model=True)  # adaptive
    m = reply(engine, msgs, params).metrics
    assert m.prompt_tokens > 2 * draft_length.TAIL and m.accepted_tokens > 0
    drafter = engine._draft.drafter
    assert drafter is not None
    # It read only the last TAIL tokens, behind a BOS sink, not the whole prompt.
    assert spies[-1].reads[0] == draft_length.TAIL
    assert m.prompt_tokens - draft_length.TAIL < drafter.base < m.prompt_tokens
    assert drafter._sink == 1
    target = engine.cached_tokens
    assert engine.draft_tokens[:32] == target[drafter.base : drafter.base + 32]
    assert costs.read_ms > 0 and costs.draft_ms > 0.0
    # Once drafting has paid it reads what it lacks from where it stands, never less.
    costs.proven, costs.unpaid_replies = True, 0
    # As if on a machine where it pays (here a draft as big as the model cannot).
    monkeypatch.setattr(draft_length.DraftCosts, "batch", lambda self, n: 10.0 + 0.5 * n)
    costs.draft_ms = 0.5
    base = drafter.base
    m2 = reply(engine, [*msgs, ChatMessage("assistant", "x"), ChatMessage("user", "More.")], params)
    assert m2.metrics.drafted_tokens > 0 and drafter.base == base
    assert spies[-1].inner is drafter
