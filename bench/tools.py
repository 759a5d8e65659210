"""One tool round trip on the real engine, against re-reading the conversation.

Prints one JSON object:

- ``round_trip_ms``: from the call parsed (the reply's end) to the follow-up's first
  token, the tool's own time excluded: the next-turn rework the host runs after a
  reply (``prewarm``), then the result read and the first token sampled (median of
  ``--rounds``);
- ``reread_round_trip_ms``: the same with the cache emptied first, as a server that
  re-reads the whole conversation would (the baseline, in the same run);
- ``evaluated_per_result_ratio``: tokens evaluated for the follow-up (rework plus
  prompt) ÷ the result's tokens: what the follow-up's prompt adds to what the cache
  held when the call ended (the result and the template text around it); goal 1.0;
- ``call_decode_tok_s`` / ``answer_decode_tok_s``: decode speed while a call is written
  under the grammar, and of the free answer after it (the grammar's own cost);
- ``tool_definition_tokens``: the prompt tokens the tool definitions add (two tools,
  Qwen 2.5's template), and ``generic_definition_tokens`` the same in the generic form
  (a template with no tool support).

The default (base) model is made to call with ``tool_choice`` "required".

    .venv/bin/python bench/tools.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.config.setting_records import LoadConfig, SamplingParams
from app.engine.backend import Finished, Token
from app.engine.chat_message import ChatMessage
from app.engine.local.engine import Engine
from app.engine.templates.override import AUTO, TemplateOverride
from app.engine.tool_spec import NONE, REQUIRED, ToolRequest
from app.models.default_model import ensure_default_model
from bench.guarded import use_native_guard
from tests.tool_templates import QWEN_TOOLS, TIME, WEATHER

PARAMS = SamplingParams.greedy(60)
RESULT = json.dumps({"city": "Paris", "temperature_c": 21, "sky": "clear", "wind_kmh": 9})
TOOLS = ToolRequest((WEATHER, TIME), choice=REQUIRED, parallel=False)
ANSWER = ToolRequest((WEATHER, TIME), choice=NONE)


def call(engine: Engine, messages: list[ChatMessage]) -> Finished:
    for event in engine.generate(messages, PARAMS, tools=TOOLS):
        if isinstance(event, Finished):
            assert event.tool_calls, event.metrics
            return event
    raise AssertionError("no reply")


def follow_up(
    engine: Engine, messages: list[ChatMessage], done: Finished, reread: bool
) -> tuple[float, int, int, float]:
    """(ms from the call's end to the first token, tokens evaluated, result tokens, the
    answer's decode tok/s)."""
    first = done.tool_calls[0]
    reply = ChatMessage("assistant", done.text, done.reasoning, done.tool_calls)
    result = ChatMessage("tool", RESULT, tool_call_id=first.id, name=first.name)
    history = [*messages, reply, result]
    held = len(engine.cached_tokens)  # the prompt and the call as generated
    result_tokens = len(engine.tokenize(engine._chat.rendering.render(history, True))) - held
    t0 = time.perf_counter()
    if reread:
        engine.reset()
        reworked = 0
    else:
        reworked = engine.prewarm(messages, reply)
    ms = 0.0
    for event in engine.generate(history, PARAMS, tools=ANSWER):
        if isinstance(event, Token) and not ms:
            ms = (time.perf_counter() - t0) * 1000
        if isinstance(event, Finished):
            ms = ms or (time.perf_counter() - t0) * 1000
            m = event.metrics
            return ms, reworked + m.evaluated_tokens, result_tokens, m.decode_tok_s
    raise AssertionError("no reply")


def definition_tokens(engine: Engine) -> int:
    template = engine._chat.rendering
    bare = template.render([ChatMessage("user", "Hi")], True)
    engine._chat.tools = TOOLS
    with_tools = engine._chat.bind(template, PARAMS).render([ChatMessage("user", "Hi")], True)
    engine._chat.tools = None
    return len(engine.tokenize(with_tools)) - len(engine.tokenize(bare))


def main() -> None:
    use_native_guard()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    engine = Engine()
    model = ensure_default_model(Path(__file__).resolve().parent.parent / ".cache" / "test-models")
    engine.load(model, LoadConfig(n_ctx=4096, n_threads=2))
    try:
        generic = definition_tokens(engine)
        engine.set_template(TemplateOverride("custom", source=QWEN_TOOLS))
        native = definition_tokens(engine)
        times: dict[bool, list[float]] = {False: [], True: []}
        evaluated = result = 0
        speeds: dict[str, list[float]] = {"call": [], "answer": []}
        for i in range(args.rounds):
            for reread in (False, True):
                engine.reset()
                messages = [ChatMessage("user", f"Weather in city number {i}?")]
                done = call(engine, messages)
                ms, n_eval, n_result, tok_s = follow_up(engine, messages, done, reread)
                times[reread].append(ms)
                speeds["call"].append(done.metrics.decode_tok_s)
                speeds["answer"].append(tok_s)
                if not reread:
                    evaluated += n_eval
                    result += n_result
        out: dict[str, Any] = {
            "bench": "tools",
            "rounds": args.rounds,
            "round_trip_ms": round(statistics.median(times[False]), 1),
            "reread_round_trip_ms": round(statistics.median(times[True]), 1),
            "evaluated_per_result_ratio": round(evaluated / max(1, result), 3),
            "call_decode_tok_s": round(statistics.median(speeds["call"]), 1),
            "answer_decode_tok_s": round(statistics.median(speeds["answer"]), 1),
            "tool_definition_tokens": native,
            "generic_definition_tokens": generic,
        }
    finally:
        engine.set_template(AUTO)
        engine.unload()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
