"""Speculative decoding figures as the window shows them (a reply's footer, the charts).

The speedup shown is tokens per forward pass of the model: each pass verifies a batch
of guesses and keeps the accepted ones plus one token of its own, so a reply of
``generated`` tokens took ``generated - accepted`` passes (the prompt's pass gives the
first token). Plain decoding is 1.0. It is an upper bound on the gain in tok/s: a pass
over a batch costs more than a one-token pass, and the drafter's own time comes on top.
"""

from __future__ import annotations

from app.engine.metrics import MessageMetrics

KIND_NAMES = {"model": "draft model", "lookup": "prompt lookup", "mtp": "next-token layers"}


def tokens_per_pass(m: MessageMetrics) -> float:
    """Reply tokens per forward pass of the model (1.0 without accepted guesses; 0 for
    an empty reply)."""
    if m.generated_tokens <= 0:
        return 0.0
    passes = max(1, m.generated_tokens - m.accepted_tokens)
    return m.generated_tokens / passes


def drafted(m: MessageMetrics) -> bool:
    """Whether the reply was produced with a drafter (even one that guessed nothing)."""
    return bool(m.draft_kind or m.drafted_tokens)


def draft_text(m: MessageMetrics) -> str:
    """``draft model: 30/48 guesses kept (62%), 1.74 tokens per pass, draft 85 ms``."""
    if not drafted(m):
        return ""
    kind = KIND_NAMES.get(m.draft_kind, "drafts")
    if not m.drafted_tokens:
        return f"{kind}: nothing guessed (the adaptive length stayed at plain decoding)"
    text = (
        f"{kind}: {m.accepted_tokens}/{m.drafted_tokens} guesses kept ({m.acceptance:.0%}), "
        f"{tokens_per_pass(m):.2f} tokens per pass"
    )
    if m.draft_kind in ("model", "mtp"):
        text += f", draft {m.draft_ms:.0f} ms"
    return text


def reply_footer(m: MessageMetrics) -> str:
    """The line under a reply: ``MessageMetrics.short_text`` with the drafting figures."""
    base = m.short_text()
    extra = draft_text(m)
    if not extra:
        return base
    short = f"drafts {m.acceptance:.0%} accepted"
    if short in base:
        return base.replace(short, extra, 1)
    parts = base.split(" · ")
    return " · ".join([*parts[:4], extra, *parts[4:]])
