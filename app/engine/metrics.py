"""Per-message performance figures, computed from timestamps the engine records."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    lo = math.floor(rank)
    hi = math.ceil(rank)
    if lo == hi:
        return ordered[lo]
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


@dataclass
class MessageMetrics:
    """How one reply was produced. Times are in milliseconds.

    ``token_times_ms`` are offsets from the request start at which each generated
    token was ready; every rate and latency here derives from them.
    """

    prompt_tokens: int = 0
    cached_tokens: int = 0
    cache_written: int = 0  # of the prompt, read and saved for later requests (API openings)
    evaluated_tokens: int = 0
    prefill_ms: float = 0.0
    generated_tokens: int = 0
    token_times_ms: list[float] = field(default_factory=list)
    stop_reason: str = ""
    stop_match: str = ""  # the stop string that ended it ("" for none, or a template token)
    n_ctx: int = 0
    seed: int | None = None
    cache_note: str = ""  # why the KV cache was rebuilt instead of reused, if it was
    turn_offset: int = 0  # tokens of earlier context before this turn's new text
    notes: list[str] = field(default_factory=list)  # things the user should know
    drafted_tokens: int = 0  # speculative decoding: tokens guessed
    accepted_tokens: int = 0  # ... and kept
    # Who guessed: "" (no drafting), "lookup" (n-grams), "model" or "mtp" (the model's own
    # next-token layers).
    draft_kind: str = ""
    draft_ms: float = 0.0  # time spent drafting (in the draft model, for "model")
    draft_len_final: int = 0  # the adaptive draft length when the reply ended (0: plain)
    # Context overflow: messages [dropped_from, dropped_from + dropped_count) of the
    # ones this request sent left the model's memory, freeing dropped_tokens.
    dropped_from: int = 0
    dropped_count: int = 0
    dropped_tokens: int = 0
    kv_tokens: int = 0  # tokens in the model's memory when the reply ended (0: not known)
    # llama.cpp's own timers (llama_perf_context), to cross-check ours.
    native_prefill_tok_s: float = 0.0
    native_decode_tok_s: float = 0.0
    rss_mb: float = 0.0  # the process's resident memory when the reply ended
    # Thinking: tokens sampled inside the block, when the first answer token was ready
    # (ms from the request start; 0: no answer), and who ended the block early
    # ("budget", "user"; "" when the model did).
    reasoning_tokens: int = 0
    first_answer_ms: float = 0.0
    thinking_cut: str = ""

    @property
    def itl_max_ms(self) -> float:
        return max(self.inter_token_ms, default=0.0)

    @property
    def acceptance(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def context_used(self) -> int:
        return self.kv_tokens or self.prompt_tokens + self.generated_tokens

    @property
    def prefill_tok_s(self) -> float:
        return _rate(self.evaluated_tokens, self.prefill_ms)

    @property
    def ttft_ms(self) -> float:
        return self.token_times_ms[0] if self.token_times_ms else 0.0

    @property
    def reasoning_ms(self) -> float:
        """Time spent thinking: from the first token to the first answer token (or the end)."""
        if not self.reasoning_tokens or not self.token_times_ms:
            return 0.0
        end = self.first_answer_ms or self.token_times_ms[-1]
        return max(0.0, end - self.token_times_ms[0])

    @property
    def inter_token_ms(self) -> list[float]:
        t = self.token_times_ms
        return [b - a for a, b in itertools.pairwise(t)]

    @property
    def decode_ms(self) -> float:
        t = self.token_times_ms
        return t[-1] - t[0] if len(t) > 1 else 0.0

    @property
    def decode_tok_s(self) -> float:
        # The first token comes from prefill; the rest each cost one decode step.
        return _rate(len(self.token_times_ms) - 1, self.decode_ms)

    @property
    def itl_p50_ms(self) -> float:
        return percentile(self.inter_token_ms, 50)

    @property
    def itl_p95_ms(self) -> float:
        return percentile(self.inter_token_ms, 95)

    def summary(self) -> dict[str, Any]:
        """Figures for display and JSON output (no per-token arrays)."""
        data = asdict(self)
        data.pop("token_times_ms")
        data.update(
            prefill_tok_s=round(self.prefill_tok_s, 2),
            ttft_ms=round(self.ttft_ms, 2),
            decode_ms=round(self.decode_ms, 2),
            decode_tok_s=round(self.decode_tok_s, 2),
            itl_p50_ms=round(self.itl_p50_ms, 2),
            itl_p95_ms=round(self.itl_p95_ms, 2),
            itl_max_ms=round(self.itl_max_ms, 2),
            context_used=self.context_used,
            prefill_ms=round(self.prefill_ms, 2),
            acceptance=round(self.acceptance, 3),
        )
        return data

    def short_text(self) -> str:
        """One line for under a message."""
        parts = [
            f"{self.generated_tokens} tokens",
            f"{self.decode_tok_s:.1f} tok/s",
            f"TTFT {self.ttft_ms:.0f} ms",
            f"prompt {self.evaluated_tokens}/{self.prompt_tokens} evaluated",
        ]
        if self.drafted_tokens:
            parts.append(f"drafts {self.acceptance:.0%} accepted")
        if self.seed is not None:
            parts.append(f"seed {self.seed}")
        if self.stop_reason == "tool_calls":
            parts.append("asked for tool calls")
        elif self.stop_reason and self.stop_reason != "eos":
            parts.append(f"stopped: {self.stop_reason.replace('_', ' ')}")
        return " · ".join(parts)


def _rate(count: int, ms: float) -> float:
    return count * 1000.0 / ms if ms > 0 and count > 0 else 0.0
