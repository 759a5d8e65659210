"""How many tokens to draft next: an adaptive draft length from measured acceptance and cost.

Speculative decoding pays for itself only when the tokens it keeps outweigh what
the drafting and the wider verification batch cost. :class:`DraftLength` keeps

- ``alpha``, the recent per-token acceptance (a guess is kept with probability
  ``alpha`` if the one before it was): an exponentially weighted count of kept
  guesses over guesses tried, so a few rounds move it;
- :class:`DraftCosts`, measured times in ms (kept by the engine across replies,
  since they are facts about the machine and the models): a target step per
  number of tokens it evaluates, and the drafter's time per guess.

With ``k`` guesses a round yields ``1 + E[min(run, k)]`` tokens, where ``run`` is how
many guesses in a row the model keeps. Once a round is seen, that expectation comes
from the recent rounds themselves (up to ``RUNS`` of them; a probe that keeps all its
guesses starts them afresh): prompt lookup's runs are all-or-nothing (a copied span is
kept whole, or its first guess fails), which the geometric ``1 + alpha + ... +
alpha**k`` of a per-token rate badly underrates. A round that kept every guess counts
as a run of at least ``k`` (the draft length cut it, not a miss). A round costs
``batch(k + 1) + draft * k``; the next ``k`` is the one with the best expected tokens
per ms, raised at most to double the last one (growth is earned), and 0 (plain
one-token decoding) when no ``k`` beats plain decoding by ``MARGIN``. At 0 it probes
again with ``PROBE`` guesses after ``probe_after`` plain tokens, waiting twice as long
after each probe that fails, and after a spell of drafting shorter than
``SPELL_PAID`` rounds (up to ``PROBE_MAX``).

Every reply has a budget: what drafting has lost in it so far over plain decoding
(reading, guessing and the wider batch, less the tokens kept) may be at most
``BUDGET`` of the reply's plain time plus ``ALLOWANCE`` plain steps
(:meth:`allowed_ms`). A spell of drafting that goes over it ends; prompt lookup
probes (cheap: no reading, free guesses) only while the reply is within it.

A draft model (``reads_prompt``) costs time before it can guess at all: it reads
what it has not seen. Until it has paid in a reply (``DraftCosts.proven``), and
whenever it is not drafting, it starts a probe only when the loss so far plus what
the probe would lose if it kept nothing stays within the budget. So a new draft
model that cannot pay costs a reply about the budget at most, and one that can
starts drafting once the reply has earned the probe. Such a probe reads only the
last ``TAIL`` tokens (:attr:`read_limit`), so a long conversation does not make
trying a draft dear.

Pure Python with no llama.cpp: the decode loop calls :meth:`next`, then
:meth:`plain` or :meth:`round` with what happened.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

DECAY = 0.7  # weight of the past per round for alpha
COST_DECAY = 0.8  # ... per measurement for the costs
MARGIN = 0.03  # drafting must promise at least 3% over plain decoding
PROBE = 2  # guesses in a probe round (one that keeps both lets drafting grow again)
PROBE_AFTER = 16  # plain tokens before the first probe
PROBE_MAX = 128  # the longest wait between probes
RETRY = 8  # a draft model that did not pay drafts again only every RETRY-th reply
SPELL_PAID = 4  # rounds a spell of drafting lasts before the wait between probes resets
PLAIN_SAMPLES = 2  # plain steps measured before the first draft
REMEASURE = 64  # rounds between plain steps that re-measure the plain cost
RUNS = 16  # recent rounds whose kept runs estimate the next round's
WARMUP = 2  # first measurements of a batch size: llama.cpp builds a graph for a new shape
PRIOR_ALPHA = 0.6
PRIOR_EXTRA = 0.1  # an extra batch token's cost as a share of a plain step, until measured
TINY = 1e-3  # ms: a floor for costs measured as nothing
OUTLIER = 3.0  # a measurement counts as at most this many times the estimate
BUDGET = 0.02  # what drafting may lose in a reply, as a share of its plain time ...
ALLOWANCE = 3.0  # ... plus this many plain steps (a first failed round, a probe)
TAIL = 64  # tokens a draft model reads for a probe until it has paid (it needs recent text)
READ_PRIOR = 0.3  # a draft's read per token as a share of a plain step, until measured


@dataclass
class DraftCosts:
    """Measured costs in ms (exponential moving averages; absent or 0: not measured yet).

    ``batch_ms[n]`` is a target step that evaluates ``n`` tokens and samples them
    (``n == 1``: a plain step). It is a table, not a line: on a CPU a batch of two
    can cost several one-token steps (another matrix kernel) while each further
    token costs little, so the best draft length depends on its shape.
    """

    batch_ms: dict[int, float] = field(default_factory=dict)
    batch_n: dict[int, int] = field(default_factory=dict)  # measurements per size
    draft_ms: float = 0.0  # the drafter's time per guess (per proposal when it guessed none)
    plain_n: int = 0  # how many plain steps were measured
    read_ms: float = 0.0  # the drafter's time per token read before guessing (a draft model)
    # Replies since drafting last paid (a spell of SPELL_PAID rounds), for a drafter
    # whose every reply starts by reading the prompt (a draft model): see ``RETRY``.
    unpaid_replies: int = 0
    proven: bool = False  # drafting has paid in some reply (it then starts without a budget)
    # Timed once when a draft model loads (``ModelDrafter.warm``): used only to price a
    # probe until the real reads and guesses are measured, never to rule drafting out.
    read_prior: float = 0.0
    guess_prior: float = 0.0

    @property
    def plain_ms(self) -> float:
        return self.batch_ms.get(1, 0.0)

    def add_batch(self, n: int, ms: float) -> None:
        old = self.batch_ms.get(n, 0.0)
        seen = self.batch_n.get(n, 0)
        self.batch_n[n] = seen + 1
        ms = max(ms, 0.0)
        if 0 < seen < WARMUP:
            # The first step of a new batch shape also builds its graph (several times a
            # step here); the fastest of the first few is what the shape costs.
            self.batch_ms[n] = min(old, ms)
        else:
            if old > 0.0:
                ms = min(ms, OUTLIER * old)  # one slow step (another process) moves it a little
            self.batch_ms[n] = _ema(old, ms, old == 0.0)
        if n == 1:
            self.plain_n += 1

    def add_draft(self, ms: float) -> None:
        self.draft_ms = _ema(self.draft_ms, max(ms, 0.0), self.draft_ms == 0.0)

    def add_read(self, n: int, ms: float) -> None:
        if n > 0:
            per = max(ms, 0.0) / n
            self.read_ms = _ema(self.read_ms, per, self.read_ms == 0.0)

    def batch(self, n: int) -> float:
        """The estimated cost of a step evaluating ``n`` tokens.

        Between measured sizes: linear. Above the largest measured size: that size's
        cost (optimistic: a longer draft is tried when acceptance makes it worth it,
        and the try measures it). With no batch measured: ``PRIOR_EXTRA`` of a plain
        step per extra token.
        """
        known = self.batch_ms
        if n in known:
            return known[n]
        plain = known.get(1, 1.0)
        sizes = sorted(m for m in known if m > 1)
        if not sizes:
            return plain * (1.0 + PRIOR_EXTRA * (n - 1))
        lower = max((m for m in [1, *sizes] if m < n), default=1)
        upper = min((m for m in sizes if m > n), default=0)
        lo = known.get(lower, plain)
        if upper:
            return lo + (known[upper] - lo) * (n - lower) / (upper - lower)
        return lo


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens a round with ``k`` guesses yields on average: 1 + alpha + ... + alpha**k."""
    a = min(max(alpha, 0.0), 1.0)
    if a >= 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


class DraftLength:
    """The adaptive draft length for one reply (see the module docstring).

    ``k_max`` is the most guesses per round (``SamplingParams.draft_len``); with
    ``adaptive`` False every round drafts ``k_max``. ``costs`` carries the
    measured costs over from earlier replies (it is updated in place).
    """

    def __init__(
        self,
        k_max: int,
        adaptive: bool = True,
        costs: DraftCosts | None = None,
        *,
        reads_prompt: bool = False,
        alpha: float = PRIOR_ALPHA,
        probe_after: int = PROBE_AFTER,
    ) -> None:
        self.k_max = max(0, int(k_max))
        self.adaptive = adaptive
        self.costs = costs if costs is not None else DraftCosts()
        self._hits = 2.0 * alpha  # weighted kept guesses ...
        self._tries = 2.0  # ... over weighted guesses tried
        self._probe_after = max(1, probe_after)
        self._plain_run = 0  # plain tokens since drafting stopped (or the last probe)
        self._rounds = 0  # rounds since the plain cost was last measured
        self._probing = False
        self._spell = 0  # rounds since drafting last started
        self._runs: deque[tuple[int, int]] = deque(maxlen=RUNS)  # (drafted, kept) per round
        self.k = min(self.k_max, 4) if adaptive else self.k_max
        self._paid = False
        self._reads = adaptive and reads_prompt
        self._tried = False  # a round drafted in this reply
        self._made = 0  # reply tokens so far
        self._loss = 0.0  # ms drafting cost this reply over plain decoding (< 0: it gained)
        # A draft model reads each new prompt before its first guess (~0.1 s for a short
        # one here): after replies where drafting never paid, skip that cost but on
        # every RETRY-th reply, so a draft that fits later text still gets its chance.
        if adaptive and reads_prompt and self.costs.unpaid_replies == 0 and self.cannot_pay():
            self.costs.unpaid_replies = 1  # measured useless: rest as after a reply that was
        unpaid = self.costs.unpaid_replies
        self._resting = adaptive and reads_prompt and unpaid > 0 and unpaid % RETRY != 0
        self._retry = adaptive and reads_prompt and unpaid > 0 and unpaid % RETRY == 0
        if adaptive and (self._resting or (self.cannot_pay() and not self._retry)):
            self.k = 0  # measured in earlier replies: only plain decoding pays
        if self._reads and (self._retry or not self.costs.proven):
            self.k = 0  # not known to pay: probe when the reply can afford it

    @property
    def alpha(self) -> float:
        return self._hits / self._tries

    @property
    def read_limit(self) -> int:
        """The most tokens the drafter may read before a guess (0: no limit): a draft
        model not yet known to pay starts from the recent text (``TAIL``)."""
        return TAIL if self._reads and not self.costs.proven else 0

    def next(self, lag: int = 0) -> int:
        """Guesses to ask for in the next step (0: a plain one-token step). ``lag`` is
        how many tokens the drafter would read first."""
        if not self.adaptive or self.k_max == 0:
            return self.k_max
        if self._resting:
            return 0
        c = self.costs
        if c.plain_n < PLAIN_SAMPLES or self._rounds >= REMEASURE:
            return 0  # measure what drafting has to beat
        if self.k > 0:
            return self.k
        if self._reads:
            start = (self._retry or not self.cannot_pay()) and self.affordable(lag)
        else:
            # A probe costs prompt lookup little (no reading, free guesses): it may start
            # whenever the reply is within its allowance.
            start = self._plain_run >= self._probe_after and not self.cannot_pay()
            start = start and not self.over_budget()
        if start:
            self._probing = True
            return min(PROBE, self.k_max)
        return 0

    def allowed_ms(self, made: int) -> float:
        """What drafting may have lost by the time the reply has ``made`` tokens."""
        return (BUDGET * made + ALLOWANCE) * max(self.costs.batch(1), TINY)

    def affordable(self, lag: int = 0) -> bool:
        """Whether a probe that keeps nothing would leave this reply's loss to drafting
        within what is allowed (``allowed_ms``; see the module docstring)."""
        c = self.costs
        plain = max(c.batch(1), TINY)
        k = min(PROBE, self.k_max)
        read = 0.0
        guess = c.draft_ms
        if self._reads:
            limit = self.read_limit
            read_ms = c.read_ms or c.read_prior or READ_PRIOR * plain
            read = (min(lag, limit) if limit else lag) * read_ms
            guess = guess or c.guess_prior or plain
        # A batch size never measured counts as k + 1 plain steps (llama.cpp's CPU
        # kernels can make it that dear), not the optimistic prior ``batch`` uses.
        verify = c.batch(k + 1) if len(c.batch_ms) > 1 else (k + 1) * plain
        probe = read + k * guess + max(verify, plain) - plain
        return self._loss + probe <= self.allowed_ms(self._made + k + 1)

    def over_budget(self) -> bool:
        """Whether drafting has lost this reply more than it is allowed."""
        return self._loss > self.allowed_ms(self._made)

    def plain(self, ms: float, draft_ms: float = 0.0, spent_ms: float = 0.0) -> None:
        """A one-token step took ``ms``; a proposal that came back empty took ``draft_ms``
        (the drafter's own cost estimate) and ``spent_ms`` in all."""
        self.costs.add_batch(1, ms)
        self._rounds = 0
        self._made += 1
        self._loss += max(spent_ms, 0.0)
        if draft_ms > 0.0:
            self.costs.add_draft(draft_ms)
        if self.k == 0:
            self._plain_run += 1

    def read(self, n: int, ms: float) -> None:
        """The drafter read ``n`` tokens in ``ms`` before guessing (its catch-up)."""
        self.costs.add_read(n, ms)

    def round(
        self, drafted: int, kept: int, verify_ms: float, draft_ms: float, spent_ms: float = 0.0
    ) -> None:
        """A round verified ``drafted`` guesses (``verify_ms``), kept ``kept`` of them;
        drafting them took ``draft_ms`` (the drafter's cost estimate: its guesses) and
        ``spent_ms`` in all (reading included; 0: ``draft_ms``)."""
        if drafted <= 0:
            return
        kept = min(max(kept, 0), drafted)
        self._tried = True
        self._made += kept + 1
        spent = max(spent_ms if spent_ms > 0.0 else draft_ms, 0.0)
        self._loss += max(verify_ms, 0.0) + spent - (kept + 1) * self.costs.batch(1)
        self._hits = DECAY * self._hits + kept
        self._tries = DECAY * self._tries + kept + (1 if kept < drafted else 0)
        self._rounds += 1
        if self._probing and kept == drafted:
            self._runs.clear()  # the text changed (it began to repeat): older rounds mislead
        self._runs.append((drafted, kept))
        self.costs.add_batch(drafted + 1, verify_ms)
        self.costs.add_draft(draft_ms / drafted)
        if not self.adaptive:
            return
        best, gain = self.best()
        was = self.k if self.k > 0 else drafted
        self.k = min(best, 2 * was) if gain >= 1.0 + MARGIN else 0
        if self.over_budget():
            self.k = 0  # a spell that lost more than the reply allows ends here
        if self._probing:
            self._probing = False
            self._plain_run = 0
            self._spell = 1
            if self.k == 0:
                self._probe_after = min(PROBE_MAX, self._probe_after * 2)
        elif self.k == 0:
            self._plain_run = 0
            # A spell of drafting that paid for a while earns prompt probes again; a lucky
            # probe that did not last (acceptance that only sometimes pays) waits longer.
            paid = self._spell >= SPELL_PAID
            self._probe_after = PROBE_AFTER if paid else min(PROBE_MAX, self._probe_after * 2)
            self._spell = 0
        else:
            self._spell += 1
            self._paid = self._paid or self._spell >= SPELL_PAID

    @property
    def resting(self) -> bool:
        """Whether this reply skips drafting because recent replies' drafting did not pay."""
        return self._resting

    def finish(self) -> None:
        """The reply ended: remember whether drafting paid in it (see ``RETRY``)."""
        if not self.adaptive:
            return
        paid = self._paid or (self.k > 0 and self._spell >= SPELL_PAID)
        if paid or self._tried or self._resting:
            # A reply that never drafted (the budget never allowed a probe) says nothing.
            self.costs.unpaid_replies = 0 if paid else self.costs.unpaid_replies + 1
        self.costs.proven = self.costs.proven or paid

    def cannot_pay(self) -> bool:
        """Whether no draft length could beat plain decoding even if every guess were
        kept (a draft model nearly as slow as the model): then it does not even probe."""
        c = self.costs
        if c.plain_n < PLAIN_SAMPLES or c.draft_ms <= 0.0 or len(c.batch_ms) < 2:
            return False  # not measured yet
        plain = c.batch(1)
        return all(
            (k + 1) * plain < (1.0 + MARGIN) * (c.batch(k + 1) + c.draft_ms * k)
            for k in range(1, self.k_max + 1)
        )

    def expected(self, k: int) -> float:
        """Tokens a round with ``k`` guesses would yield, from the recent rounds' runs."""
        if not self._runs:
            return expected_tokens(self.alpha, k)
        total = 0
        for drafted, kept in self._runs:
            total += k if kept >= drafted else min(kept, k)  # all kept: the run went on
        return 1.0 + total / len(self._runs)

    def best(self) -> tuple[int, float]:
        """The draft length with the best expected speed, and its speed over plain decoding."""
        c = self.costs
        plain = max(c.batch(1), TINY)
        best, gain = 0, 1.0
        for k in range(1, self.k_max + 1):
            # A batch never costs less than one token's step (a plain step measured while
            # the machine was busy must not make guesses that are never kept look free).
            cost = max(c.batch(k + 1), plain) + c.draft_ms * k
            g = self.expected(k) * plain / cost
            if g > gain:
                best, gain = k, g
        return best, gain


def _ema(old: float, new: float, first: bool) -> float:
    return new if first else COST_DECAY * old + (1.0 - COST_DECAY) * new
