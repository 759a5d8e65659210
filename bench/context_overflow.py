"""A long chat at a small context: KV shifting versus re-reading the kept text, in one run.

Two engines hold the default model with the same small context and policy
(truncate middle, a system prompt): one shifts its KV cache when older turns
are dropped (``llama_memory_seq_rm`` + ``seq_add``), the other is told its
cache cannot shift, so after each drop it evaluates the kept text that
followed the dropped turns again. Each turn, both answer the same question
(greedy, ``--reply`` tokens), alternating which goes first, so the machine's
drift hits both alike.

Prints one JSON object: turns, errors (requests that raised), first_overflow
(turn), evaluated_per_turn_ratio (shifting side, after the first overflow:
tokens evaluated / tokens the new turn added), the same for the re-reading side,
ttft_p95_ms_shift, ttft_p95_ms_reeval (after the first overflow) and speedup =
reeval / shift TTFT p95.
Usage: python bench/context_overflow.py [--turns 40] [--n-ctx 1024] [--reply 64]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.config.setting_records import LoadConfig, SamplingParams
from app.engine.backend import Finished
from app.engine.chat_message import ChatMessage
from app.engine.local.engine import Engine
from app.engine.metrics import MessageMetrics, percentile
from app.models.default_model import ensure_default_model
from app.util.errors import LamplightError
from bench.guarded import use_native_guard

ROOT = Path(__file__).resolve().parent.parent
SYSTEM = ChatMessage("system", "You are a helpful assistant. Answer briefly.")


class Side:
    """One engine and the messages it still sees."""

    def __init__(self, model: Path, n_ctx: int, threads: int, can_shift: bool) -> None:
        self.engine = Engine()
        self.engine.load(model, LoadConfig(n_ctx=n_ctx, n_threads=threads))
        loaded = self.engine._loaded
        assert loaded is not None
        loaded.can_shift = can_shift and loaded.can_shift
        self.kept = [SYSTEM]
        self.evaluated: list[int] = []
        self.added: list[int] = []
        self.ttft: list[float] = []
        self.errors = 0
        self.first_overflow: int | None = None

    def turn(self, index: int, question: str, params: SamplingParams) -> None:
        template = self.engine.template
        assert template is not None
        self.kept.append(ChatMessage("user", question))
        try:
            end = None
            for event in self.engine.generate(self.kept, params):
                if isinstance(event, Finished):
                    end = event
        except LamplightError:
            self.errors += 1
            self.kept.pop()
            return
        assert end is not None
        m: MessageMetrics = end.metrics
        if m.dropped_count:
            if self.first_overflow is None:
                self.first_overflow = index
            del self.kept[m.dropped_from : m.dropped_from + m.dropped_count]
        before = template.render(self.kept[:-1], False)
        after = template.render(self.kept, True)
        # What this turn added to the conversation: the new message and its markers.
        new = after[len(before) :] if after.startswith(before) else question
        self.added.append(len(self.engine.tokenize(new)) - 1)  # less the BOS tokenize adds
        self.evaluated.append(m.evaluated_tokens)
        self.ttft.append(m.ttft_ms)
        self.kept.append(ChatMessage("assistant", end.text))
        self.engine.prewarm(self.kept[:-1], ChatMessage("assistant", end.text))

    def after(self, values: list[float] | list[int], start: int | None) -> list[float]:
        return [float(v) for v in values[(start if start is not None else len(values)) + 1 :]]


def main() -> None:
    use_native_guard()
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=40)
    ap.add_argument("--n-ctx", type=int, default=1024)
    ap.add_argument("--reply", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    model = ensure_default_model(ROOT / ".cache" / "test-models")
    params = replace(
        SamplingParams.greedy(args.reply), overflow="truncate_middle", repeat_penalty=1.3
    )
    shift = Side(model, args.n_ctx, args.threads, can_shift=True)
    reeval = Side(model, args.n_ctx, args.threads, can_shift=False)
    for i in range(args.turns):
        question = f"Question {i}: tell me one interesting fact about the number {i * 7 + 3}."
        for side in (shift, reeval) if i % 2 == 0 else (reeval, shift):
            side.turn(i, question, params)
    first = shift.first_overflow
    ev = shift.after(shift.evaluated, first)
    new = shift.after(shift.added, first)
    ev_r = reeval.after(reeval.evaluated, reeval.first_overflow)
    new_r = reeval.after(reeval.added, reeval.first_overflow)
    p95_shift = percentile(shift.after(shift.ttft, first), 95)
    p95_reeval = percentile(reeval.after(reeval.ttft, reeval.first_overflow), 95)
    print(
        json.dumps(
            {
                "turns": args.turns,
                "errors": shift.errors + reeval.errors,
                "n_ctx": args.n_ctx,
                "reply_tokens": args.reply,
                "first_overflow": first,
                "evaluated_per_turn_ratio": round(sum(ev) / max(1.0, sum(new)), 3),
                "evaluated_per_turn_ratio_reeval": round(sum(ev_r) / max(1.0, sum(new_r)), 3),
                "ttft_p95_ms_shift": round(p95_shift, 1),
                "ttft_p95_ms_reeval": round(p95_reeval, 1),
                "speedup": round(p95_reeval / p95_shift, 2) if p95_shift else None,
            }
        )
    )
    shift.engine.unload()
    reeval.engine.unload()


if __name__ == "__main__":
    main()
