"""Per-message metrics as CSV, for spreadsheets; read back for checks."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence

from app.chat.conversation import Message

COLUMNS = (
    "message",
    "role",
    "prompt_tokens",
    "cached_tokens",
    "evaluated_tokens",
    "prefill_ms",
    "prefill_tok_s",
    "ttft_ms",
    "first_answer_ms",
    "generated_tokens",
    "reasoning_tokens",
    "reasoning_ms",
    "decode_ms",
    "decode_tok_s",
    "itl_p50_ms",
    "itl_p95_ms",
    "itl_max_ms",
    "acceptance",
    "native_prefill_tok_s",
    "native_decode_tok_s",
    "context_used",
    "n_ctx",
    "rss_mb",
    "stop_reason",
    "seed",
)


def metrics_csv(messages: Sequence[Message]) -> str:
    """One row per reply that has metrics, in conversation order."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for i, m in enumerate(messages):
        metrics = m.message_metrics()
        if metrics is None:
            continue
        data = metrics.summary()
        row = {c: data.get(c, "") for c in COLUMNS}
        row.update(
            message=i + 1,
            role=m.role,
            native_prefill_tok_s=round(metrics.native_prefill_tok_s, 2),
            native_decode_tok_s=round(metrics.native_decode_tok_s, 2),
            rss_mb=round(metrics.rss_mb, 1),
            first_answer_ms=round(metrics.first_answer_ms, 2),
            reasoning_tokens=metrics.reasoning_tokens,
            reasoning_ms=round(metrics.reasoning_ms, 2),
        )
        writer.writerow(row)
    return out.getvalue()


def read_metrics_csv(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))
