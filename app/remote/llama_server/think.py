"""A reasoning reply over llama-server: its stream split into thinking and answer, and
the thinking block ended on this side (a budget, Stop thinking).

The server streams raw text from the prompt this app rendered, so the in-process
engine's rules apply as they are (``app.engine.templates.thinking``): a ``ReasoningSplitter``
that starts inside the block when the prompt opened it, thinking counted per token.
The server cannot be told to close the block mid-stream, so this side does: with a
budget, a request asks for no more tokens than the budget has left while the block
is open (``n_predict``), so the server stops exactly there; Stop thinking closes the
stream. Then a new ``/completion`` goes on from the tokens so far plus the budget
message and the template's closing text (``cache_prompt`` keeps it cheap).
"""

from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import dataclass, field

from app.engine.backend import Token
from app.engine.metrics import MessageMetrics
from app.engine.templates.thinking import ThinkingControl


@dataclass
class ServerThinking:
    """One reply's thinking, over one or more ``/completion`` streams."""

    control: ThinkingControl
    thoughts: list[str] = field(default_factory=list)
    answer: list[str] = field(default_factory=list)
    capped: bool = False  # the last request's n_predict was cut to the budget

    @property
    def inside(self) -> bool:
        return self.control.splitter.inside

    def n_predict(self, n: int, metrics: MessageMetrics) -> int:
        """A request's ``n_predict``: at most what the budget has left while thinking."""
        splitter, budget = self.control.splitter, self.control.budget
        self.capped = False
        if not budget or splitter.closed or splitter.answered:
            return n
        left = max(1, budget - metrics.reasoning_tokens)
        self.capped = left < n
        return min(n, left)

    def tokens(self, piece: str, n_tokens: int, metrics: MessageMetrics) -> list[Token]:
        """One streamed piece (``n_tokens`` tokens) as tokens to show."""
        splitter = self.control.splitter
        was = splitter.inside
        parts = splitter.feed(piece)
        if was or splitter.inside or any(r for r, _ in parts):
            metrics.reasoning_tokens += n_tokens
        out = self._keep(parts)
        if not metrics.first_answer_ms and any(not t.reasoning for t in out):
            metrics.first_answer_ms = metrics.token_times_ms[-1]
        return out

    def due(self, metrics: MessageMetrics) -> str:
        """ "budget" or "user" when the block must be closed now."""
        return self.control.due(metrics.reasoning_tokens)

    def due_after(self, metrics: MessageMetrics) -> str:
        """Why to close the block after a request ended ("" to leave it): Stop thinking,
        the budget spent, or a request the budget cut (``capped``) still thinking. A
        reply that ended otherwise (stopped, an error, the end of a turn) stays ended."""
        if metrics.stop_reason not in ("", "max_tokens"):
            return ""
        why = self.due(metrics)
        if not why and self.capped and self.inside and metrics.stop_reason == "max_tokens":
            why = "budget"
        return why

    def close(self, why: str, metrics: MessageMetrics) -> tuple[list[Token], str]:
        """End the block for ``why``: the tokens to show and the text to evaluate."""
        shown, text = self.control.closing(why)
        held = self.control.splitter.end_thinking()
        metrics.thinking_cut = why
        return self._keep([*held, (True, shown)]), text

    def flush(self) -> list[Token]:
        """What the splitter held back, once the reply has ended."""
        return self._keep(self.control.splitter.flush())

    def _keep(self, parts: list[tuple[bool, str]]) -> list[Token]:
        out = []
        for thought, text in parts:
            if text:
                (self.thoughts if thought else self.answer).append(text)
                out.append(Token(text, thought))
        return out


def show_tokens(
    shown: str, sampled: bool, metrics: MessageMetrics, t0: float, think: ServerThinking | None
) -> Generator[Token, None, None]:
    """One streamed piece of text as tokens (thinking apart, when the template marks it).
    While thinking, a token that shows no text yet (a stop string's start held back by
    the server) counts too: the server counts it against the budget's ``n_predict``."""
    if not shown and not (sampled and think is not None and think.inside):
        return
    metrics.token_times_ms.append((time.perf_counter() - t0) * 1000)
    metrics.generated_tokens += 1
    if think is None:
        yield Token(shown)
    else:
        yield from think.tokens(shown, 1, metrics)
