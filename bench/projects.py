"""A new chat in a project, warm against cold, in one run (issue 44).

    .venv/bin/python bench/projects.py [--prefix-tokens 8000] [--rounds 2] [--threads 2]

On the default model, a project whose opening (instructions and a pinned document, its
system turn) is about ``--prefix-tokens`` tokens, and a question of about 120 tokens.
Each round times the first reply of a new chat, through the engine host as the window
runs it (``ReplyJob.prefix``), from the job's start to its first token:

* ``cold``: no project (the whole prompt read, as before projects);
* ``warm``: in the project, its opening kept in memory (restored, then the question);
* ``disk``: in the project after a restart (a new host: the opening read from its file).

Prints one JSON object: the token counts, ``evaluated_over_question`` (evaluated tokens
of a warm start over the question's; goal <= 1.1), ``ttft_ratio`` (cold / warm; goal
>= 20), the disk figure, the opening file's size, and each side's rounds (best first).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.guarded import use_native_guard

use_native_guard()

from app.chat.conversation import new_id  # noqa: E402
from app.chat.store import ConversationStore  # noqa: E402
from app.config.setting_records import LoadConfig, SamplingParams  # noqa: E402
from app.engine.backend import Finished, Token  # noqa: E402
from app.engine.chat_message import ChatMessage  # noqa: E402
from app.engine.local.engine import Engine  # noqa: E402
from app.host.host import EngineHost  # noqa: E402
from app.host.jobs import ReplyEvent, ReplyJob  # noqa: E402
from app.host.listener import QuietListener  # noqa: E402
from app.models.default_model import ensure_default_model  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PROJECT = "benchproject"
GREEDY = SamplingParams.greedy(4)
QUESTION = " ".join(["When is the next high water at the north pier, and which berth"] * 9)


def _first_reply(host: EngineHost, system: str, prefix: str) -> tuple[float, Finished]:
    """Milliseconds to the first token of a new chat's first reply, and its end."""
    events: list[tuple[float, ReplyEvent]] = []
    messages = [ChatMessage("system", system), ChatMessage("user", QUESTION)]
    job = ReplyJob(
        new_id(), "gui", messages, GREEDY, lambda e: events.append((time.perf_counter(), e))
    )
    job.conv_id, job.prefix = new_id(), prefix
    t0 = time.perf_counter()
    host.run_here(job)
    first = next(t for t, e in events if isinstance(e, Token))
    done = events[-1][1]
    assert isinstance(done, Finished)
    return (first - t0) * 1000, done


def _instructions(engine: Engine, tokens: int) -> str:
    unit = "The harbour master's rule: berths are given by the tide table, never guessed. "
    doc = "\n\nPinned document, tides.md:\n" + "High water 06:12, low water 12:31. " * 40
    text = doc
    while engine.count_tokens(text) < tokens:
        text = unit * 20 + text
    return text


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prefix-tokens", type=int, default=8000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    engine = Engine()
    model = ensure_default_model(ROOT / ".cache" / "test-models")
    engine.load(model, LoadConfig(n_ctx=12288, n_threads=args.threads))
    system = _instructions(engine, args.prefix_tokens)
    rows: dict[str, list[float]] = {"cold": [], "warm": [], "disk": []}
    out: dict[str, Any] = {"bench": "projects", "question_tokens": engine.count_tokens(QUESTION)}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        host = EngineHost(engine, Path(tmp) / "models", ConversationStore(data), QuietListener())
        _ms, built = _first_reply(host, system, PROJECT)  # the opening, read once
        out["prefix_tokens"] = built.metrics.cached_tokens
        for _ in range(args.rounds):
            engine.reset()
            ms, cold = _first_reply(host, system, "")
            rows["cold"].append(ms)
            engine.reset()
            ms, warm = _first_reply(host, system, PROJECT)
            rows["warm"].append(ms)
            out["evaluated_tokens"] = warm.metrics.evaluated_tokens
            engine.reset()
            restarted = EngineHost(
                engine, Path(tmp) / "models", ConversationStore(data), QuietListener()
            )
            ms, _disk = _first_reply(restarted, system, PROJECT)
            rows["disk"].append(ms)
        out["cold_prompt_tokens"] = cold.metrics.evaluated_tokens
        out["prefix_bytes"] = sum(p.stat().st_size for p in (data / "prefixes").glob("*.lpkv"))
    engine.unload()
    best = {k: min(v) for k, v in rows.items()}
    out["evaluated_over_question"] = round(out["evaluated_tokens"] / out["question_tokens"], 3)
    out.update({f"{k}_ttft_ms": round(v, 1) for k, v in best.items()})
    out["ttft_ratio"] = round(best["cold"] / best["warm"], 1)
    out["disk_ttft_ratio"] = round(best["cold"] / best["disk"], 1)
    out["rounds"] = {k: [round(x, 1) for x in sorted(v)] for k, v in rows.items()}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
