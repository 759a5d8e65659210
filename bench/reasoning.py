"""Reasoning turns: tokens evaluated per new message with a template that drops past
thinking, with the background rework (prewarm) on and off, in one run; the thinking
budget's overrun; the time the rework takes after a reply.

Prints one JSON object:

- ``evaluated_per_turn_ratio``: tokens evaluated when sending turns 2..N ÷ tokens of
  the new messages (the user's words and the template text around them), with the
  rework on, as the app runs (goal ≤ 1.1);
- ``reprefill_ratio``: the same with the rework off (each turn re-reads the last reply);
- ``budget_overrun_tokens``: thinking tokens past the budget, the most over the runs
  (goal 0);
- ``rework_ms``: the median time of the rework after a reply.

The default (base) model is given a Qwen3-shaped template (``tests/reasoning_templates``)
and a grammar that makes it write a thinking block and an answer.

    .venv/bin/python bench/reasoning.py [--turns 6]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.config.setting_records import LoadConfig, SamplingParams
from app.engine.backend import Finished
from app.engine.chat_message import ChatMessage
from app.engine.local.engine import Engine
from app.engine.templates.override import TemplateOverride
from app.models.default_model import ensure_default_model
from bench.guarded import use_native_guard
from tests.reasoning_templates import QWEN3, R1, THINK_GRAMMAR

THINK = replace(
    SamplingParams.greedy(120), output_format="gbnf", grammar=THINK_GRAMMAR, max_tokens=120
)
QUESTIONS = [f"Question {i}: what comes after {i}?" for i in range(1, 12)]


def reply(engine: Engine, messages: list[ChatMessage], params: SamplingParams) -> Finished:
    done = None
    for event in engine.generate(messages, params):
        if isinstance(event, Finished):
            done = event
    assert done is not None
    return done


def new_tokens(engine: Engine, history: list[ChatMessage], message: ChatMessage) -> int:
    """Tokens the new message adds to what the template renders for the history."""
    template = engine._chat.rendering
    before = template.render([*history, ChatMessage("user", "\ue000")], False)
    head = before[: before.find("\ue000")]
    full = template.render([*history, message], True)
    return len(engine.tokenize(full)) - len(engine.tokenize(head))


def chat(engine: Engine, turns: int, rework: bool) -> tuple[float, list[float]]:
    """(evaluated ÷ new tokens over turns 2..N, rework times in ms)."""
    engine.reset()
    history: list[ChatMessage] = []
    evaluated = new = 0
    times = []
    for i in range(turns):
        message = ChatMessage("user", QUESTIONS[i])
        if i:
            new += new_tokens(engine, history, message)
        history.append(message)
        done = reply(engine, history, THINK)
        if i:
            evaluated += done.metrics.evaluated_tokens
        answer = ChatMessage("assistant", done.text, done.reasoning)
        if rework:
            t0 = time.perf_counter()
            engine.prewarm(history, answer)
            times.append((time.perf_counter() - t0) * 1000)
        history.append(answer)
    return evaluated / max(1, new), times


def overrun(engine: Engine, budget: int, runs: int) -> int:
    engine.set_template(TemplateOverride("custom", source=R1))
    worst = 0
    for i in range(runs):
        engine.reset()
        params = replace(SamplingParams.greedy(budget + 16), thinking_budget=budget, seed=i)
        done = reply(engine, [ChatMessage("user", QUESTIONS[i])], params)
        worst = max(worst, done.metrics.reasoning_tokens - budget)
    return worst


def main() -> None:
    use_native_guard()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=6)
    args = parser.parse_args()
    engine = Engine()
    model = ensure_default_model(Path(__file__).resolve().parent.parent / ".cache" / "test-models")
    engine.load(model, LoadConfig(n_ctx=4096, n_threads=2))
    try:
        engine.set_template(TemplateOverride("custom", source=QWEN3))
        ratio, times = chat(engine, args.turns, rework=True)
        reprefill, _ = chat(engine, args.turns, rework=False)
        out: dict[str, Any] = {
            "bench": "reasoning",
            "turns": args.turns,
            "evaluated_per_turn_ratio": round(ratio, 3),
            "reprefill_ratio": round(reprefill, 3),
            "rework_ms": round(statistics.median(times), 1),
            "budget_overrun_tokens": overrun(engine, 24, 3),
            "budget": 24,
        }
    finally:
        engine.unload()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
