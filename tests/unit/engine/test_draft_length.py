"""The adaptive draft length (``app/engine/local/draft/length.py``): pure Python, no model."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.local.draft.length import (
    ALLOWANCE,
    BUDGET,
    PLAIN_SAMPLES,
    PROBE,
    PROBE_AFTER,
    PROBE_MAX,
    RETRY,
    TAIL,
    DraftCosts,
    DraftLength,
    expected_tokens,
)
from tests.hypothesis_budget import examples


def cheap(n: int) -> float:
    """A GPU-like step: each extra token in a batch costs 5% of a plain step."""
    return 10.0 * (1.0 + 0.05 * (n - 1))


def cpu(n: int) -> float:
    """This machine's CPU shape (measured): a batch of two costs several plain steps."""
    return {1: 12.0, 2: 45.0, 3: 53.0}.get(n, 53.0 + 6.0 * (n - 3))


def simulate(
    length: DraftLength, alpha: float, step_ms: object, tokens: int = 400, seed: int = 1
) -> tuple[float, int, list[int]]:
    """Drive ``length`` as the decode loop does, with guesses kept with probability
    ``alpha`` and steps costing ``step_ms(n)``. Returns tokens per ms over plain's,
    guesses drafted, and the ks asked for."""
    assert callable(step_ms)
    rng = random.Random(seed)
    made, ms, drafted, ks = 0, 0.0, 0, []
    while made < tokens:
        k = length.next()
        ks.append(k)
        if k == 0:
            length.plain(step_ms(1))
            made, ms = made + 1, ms + step_ms(1)
            continue
        kept = 0
        while kept < k and rng.random() < alpha:
            kept += 1
        cost = step_ms(k + 1)
        length.round(k, kept, cost, 0.0)
        made, ms, drafted = made + kept + 1, ms + cost, drafted + k
    return made / ms * step_ms(1), drafted, ks


def test_expected_tokens() -> None:
    assert expected_tokens(0.0, 8) == 1.0
    assert expected_tokens(1.0, 8) == 9.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert expected_tokens(2.0, 3) == 4.0 and expected_tokens(-1.0, 3) == 1.0  # clamped


def test_costs_table_interpolates_and_is_optimistic_beyond_what_was_measured() -> None:
    c = DraftCosts()
    assert c.batch(5) == pytest.approx(1.4)  # nothing measured: a prior
    c.add_batch(1, 10.0)
    c.add_batch(3, 30.0)
    c.add_batch(9, 60.0)
    assert c.plain_ms == 10.0 and c.plain_n == 1
    assert c.batch(2) == pytest.approx(20.0) and c.batch(6) == pytest.approx(45.0)
    assert c.batch(17) == 60.0  # a longer draft gets tried when acceptance is high
    c.add_batch(3, 25.0)  # the second of a shape: the fastest so far (the first built its graph)
    assert c.batch(3) == 25.0
    c.add_batch(3, 3000.0)  # one step stalled by another process: counted as 3x at most
    assert c.batch(3) == pytest.approx(0.8 * 25.0 + 0.2 * 75.0)


def test_plain_steps_come_first_to_measure_what_drafting_must_beat() -> None:
    length = DraftLength(8)
    for _ in range(PLAIN_SAMPLES):
        assert length.next() == 0
        length.plain(10.0)
    assert length.next() > 0


def test_fixed_length_when_not_adaptive() -> None:
    length = DraftLength(6, adaptive=False)
    for _ in range(20):
        assert length.next() == 6
        length.round(6, 0, 100.0, 50.0)
    assert length.k == 6


def test_grows_on_accepted_drafts_where_batches_are_cheap() -> None:
    length = DraftLength(8)
    speed, _, ks = simulate(length, 1.0, cheap)
    assert length.k == 8 and speed > 3.0
    # Growth is earned: at most doubling per round.
    drafting = [k for k in ks if k > 0]
    assert all(b <= 2 * max(a, PROBE) for a, b in itertools.pairwise(drafting))


def test_shrinks_to_plain_decoding_when_drafts_fail_and_probes_back_off() -> None:
    length = DraftLength(8)
    speed, drafted, ks = simulate(length, 0.0, cheap, tokens=600)
    assert length.k == 0
    assert speed > 0.95  # never much slower than plain decoding
    # Once it stopped, only probes of PROBE guesses, ever further apart.
    first_plain = ks.index(0, PLAIN_SAMPLES)
    probes = [i for i, k in enumerate(ks) if k > 0 and i > first_plain]
    assert first_plain < 10
    assert all(ks[i] == PROBE for i in probes)
    gaps = [b - a for a, b in itertools.pairwise(probes)]
    assert gaps == sorted(gaps) and gaps[-1] >= PROBE_MAX // 2
    assert drafted < 40


def test_a_probe_that_succeeds_brings_drafting_back() -> None:
    length = DraftLength(8)
    simulate(length, 0.0, cheap, tokens=200)
    assert length.k == 0
    simulate(length, 1.0, cheap, tokens=200 + PROBE_MAX)
    assert length.k == 8


def test_does_not_draft_where_batches_cost_more_than_they_save() -> None:
    # 60% acceptance does not pay for a CPU batch that costs four plain steps.
    speed, _, _ = simulate(DraftLength(8), 0.6, cpu)
    assert speed > 0.95
    # Near-perfect acceptance does, with long drafts (the batch's cost per token falls).
    length = DraftLength(16)
    speed, _, _ = simulate(length, 0.99, cpu, tokens=600)
    assert speed > 1.2 and length.k >= 8


def test_a_slow_drafter_is_not_worth_it() -> None:
    length = DraftLength(8)
    for _ in range(PLAIN_SAMPLES):
        length.plain(10.0)
    for _ in range(10):
        k = length.next() or PROBE
        length.round(k, k, cheap(k + 1), 12.0 * k)  # the draft costs more than the target
    assert length.k == 0


@settings(max_examples=examples(150), deadline=None)
@given(
    k_max=st.integers(0, 16),
    adaptive=st.booleans(),
    events=st.lists(
        st.tuples(
            st.booleans(),
            st.integers(-2, 20),
            st.integers(-2, 20),
            st.floats(-10.0, 1e6, allow_nan=False),
            st.floats(-10.0, 1e6, allow_nan=False),
        ),
        max_size=60,
    ),
)
def test_any_history_gives_a_sane_length(
    k_max: int, adaptive: bool, events: list[tuple[bool, int, int, float, float]]
) -> None:
    length = DraftLength(k_max, adaptive)
    for is_plain, drafted, kept, ms, draft_ms in events:
        k = length.next()
        assert 0 <= k <= k_max
        if not adaptive:
            assert k == k_max
        if is_plain:
            length.plain(ms, draft_ms)
        else:
            length.round(drafted, kept, ms, draft_ms)
        assert 0.0 <= length.alpha <= 1.0
        assert 0 <= length.k <= k_max
        c = length.costs
        assert all(v >= 0.0 for v in c.batch_ms.values()) and c.draft_ms >= 0.0
    assert PROBE_AFTER <= PROBE_MAX


def test_a_draft_model_that_did_not_pay_rests_and_retries_every_retry_th_reply() -> None:
    costs = DraftCosts()
    first = DraftLength(8, costs=costs, reads_prompt=True)
    _, drafted, _ = simulate(first, 0.0, cpu, tokens=600)  # long enough to afford a probe
    first.finish()
    assert drafted > 0 and costs.unpaid_replies == 1 and not costs.proven
    drafted_per_reply = []
    for _ in range(RETRY):
        length = DraftLength(8, costs=costs, reads_prompt=True)
        _, drafted, _ = simulate(length, 0.0, cpu, tokens=600)
        drafted_per_reply.append(drafted)
        assert length.resting == (drafted == 0)
        length.finish()
    # Replies 2..RETRY rest; the RETRY-th unpaid one drafts (and probes) again.
    assert drafted_per_reply[: RETRY - 1] == [0] * (RETRY - 1) and drafted_per_reply[-1] > 0
    # A reply where drafting paid resets the count; prompt lookup never rests.
    paid = DraftLength(8, costs=DraftCosts(unpaid_replies=RETRY), reads_prompt=True)  # a retry
    costs = paid.costs
    simulate(paid, 1.0, cheap, tokens=200)
    paid.finish()
    assert costs.unpaid_replies == 0 and costs.proven
    costs.unpaid_replies = 3
    assert not DraftLength(8, costs=costs).resting


class Draft:
    """A simulated draft model with its own costs: ms per token read, ms per guess, and
    what it lags behind the target (everything committed since its last proposal)."""

    def __init__(self, read_ms: float, guess_ms: float, prompt: int) -> None:
        self.read_ms, self.guess_ms, self.lag = read_ms, guess_ms, prompt
        self.reads: list[int] = []


def reply(
    length: DraftLength,
    draft: Draft,
    alpha: float,
    step_ms: object,
    tokens: int,
    seed: int = 1,
) -> tuple[float, float, int]:
    """One reply with a draft model, driven as ``loop_draft`` drives it. Returns what
    drafting cost over plain decoding (ms), the plain time (ms), and guesses drafted."""
    assert callable(step_ms)
    rng = random.Random(seed)
    plain = step_ms(1)
    made, loss, drafted = 0, 0.0, 0
    while made < tokens:
        k = length.next(draft.lag)
        if k == 0:
            length.plain(plain)
            made, draft.lag = made + 1, draft.lag + 1
            continue
        limit = length.read_limit
        read = min(draft.lag, limit) if limit else draft.lag
        read_ms, guesses_ms = read * draft.read_ms, k * draft.guess_ms
        length.read(read, read_ms)
        draft.reads.append(read)
        kept = 0
        while kept < k and rng.random() < alpha:
            kept += 1
        verify = step_ms(k + 1)
        length.round(k, kept, verify, guesses_ms, read_ms + guesses_ms)
        loss += read_ms + guesses_ms + verify - (kept + 1) * plain
        made, drafted, draft.lag = made + kept + 1, drafted + k, 1
    length.finish()
    return loss, made * plain, drafted


def test_a_new_draft_model_costs_its_first_reply_at_most_the_budget() -> None:
    # The 4-block test draft here: reads 0.5 ms a token, guesses in 6 ms, never agrees.
    costs = DraftCosts(read_prior=0.5, guess_prior=6.0)
    draft = Draft(0.5, 6.0, prompt=90)
    short = DraftLength(16, costs=costs, reads_prompt=True)
    assert short.k == 0 and short.read_limit == TAIL
    loss, _, drafted = reply(short, draft, 0.0, cpu, tokens=100)
    # Too short to afford a probe: it drafted nothing, and that says nothing of the draft.
    assert drafted == 0 and loss == 0.0 and costs.unpaid_replies == 0
    longer = DraftLength(16, costs=costs, reads_prompt=True)
    loss, plain_ms, drafted = reply(longer, draft, 0.0, cpu, tokens=1000)
    assert drafted > 0 and 0.0 < loss <= BUDGET * plain_ms + ALLOWANCE * cpu(1)
    assert costs.unpaid_replies == 1  # it was tried and did not pay: the next replies rest


def test_a_draft_model_that_pays_is_found_and_then_starts_at_once() -> None:
    costs = DraftCosts(read_prior=0.1, guess_prior=0.5)
    draft = Draft(0.1, 0.5, prompt=500)  # a small draft that agrees, on a GPU-like target
    first = DraftLength(16, costs=costs, reads_prompt=True)
    loss, plain_ms, drafted = reply(first, draft, 0.9, cheap, tokens=300)
    assert drafted > 0 and loss < 0.0 and costs.proven  # it gained, in its first reply
    assert draft.reads[0] == TAIL  # that first probe read only the recent text
    second = DraftLength(16, costs=costs, reads_prompt=True)
    assert second.read_limit == 0 and second.k > 0  # proven: reads all, drafts at once
    loss2, plain2, _ = reply(second, Draft(0.1, 0.5, prompt=40), 0.9, cheap, tokens=300)
    assert loss2 / plain2 < loss / plain_ms  # no budget to earn before drafting


@settings(max_examples=examples(200), deadline=None)
@given(
    alpha=st.floats(0.0, 1.0),
    plain=st.floats(2.0, 200.0),
    extra=st.floats(0.02, 3.0),  # each further batch position, as a share of a plain step
    guess=st.floats(0.02, 1.0),  # a guess, as a share of a plain step (a smaller model)
    read=st.floats(0.005, 0.3),  # a token read, as a share of a plain step
    prompt=st.integers(1, 4000),
    tokens=st.integers(1, 1500),
    k_max=st.integers(1, 16),
    priors=st.booleans(),
    lookup=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_drafting_never_costs_a_reply_much_more_than_the_budget(
    alpha: float,
    plain: float,
    extra: float,
    guess: float,
    read: float,
    prompt: int,
    tokens: int,
    k_max: int,
    priors: bool,
    lookup: bool,
    seed: int,
) -> None:
    """A new draft model, or prompt lookup (free guesses, nothing to read)."""

    def step(n: int) -> float:
        return plain * (1.0 + extra * (n - 1))

    if lookup:
        guess = read = 0.0
    costs = DraftCosts()
    if priors:  # timed at load; without them the controller assumes the worst it allows
        costs.read_prior, costs.guess_prior = read * plain, guess * plain
    length = DraftLength(k_max, costs=costs, reads_prompt=not lookup)
    draft = Draft(read * plain, guess * plain, prompt)
    loss, plain_ms, _ = reply(length, draft, alpha, step, tokens, seed)
    # The budget and allowance, plus at most one round it could not foresee (a spell ends
    # after a round that took it over budget).
    one_round = TAIL * read * plain + k_max * guess * plain + step(k_max + 1)
    if lookup:  # its probes start within the allowance, not priced: one more round
        one_round *= 2
    assert loss <= BUDGET * plain_ms + ALLOWANCE * plain + one_round
