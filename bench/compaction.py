"""Compaction and its Undo, in one run (issue 45).

    .venv/bin/python bench/compaction.py [--history-tokens 3000] [--turns 5] [--threads 2]

On the default model (its chat turns), a chat of about ``--history-tokens`` tokens is
read through the engine host as the window runs it, then compacted: the summary is
written on a fork of the cache (``ReplyJob.compaction``) and the compacted chat read once
(``compaction_steps.settle``). Then ``--turns`` more turns, then Undo
(``compaction_steps.restore_undo``) timed against a re-read of the same history from an
empty cache (what an app without the saved state would do).

Prints one JSON object: ``tokens_freed`` (what the summarised turns took), the one-time
cost (``summary_read``: tokens the summary's request read; ``summary_written``;
``settle_read``: the compacted chat read once), ``undo_ms`` against ``reread_ms``
(``undo_speedup``; goal >= 50) and ``after_eval_ratio`` (tokens the turns after the
compaction evaluated over their new tokens, what each added to the prompt past the
cache; goal <= 1.1).
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

from app.chat import compaction  # noqa: E402
from app.chat.conversation import Conversation, Message, new_id  # noqa: E402
from app.chat.store import ConversationStore  # noqa: E402
from app.config.setting_records import LoadConfig, SamplingParams  # noqa: E402
from app.engine.backend import Finished  # noqa: E402
from app.engine.chat_message import ChatMessage  # noqa: E402
from app.engine.local.engine import Engine  # noqa: E402
from app.host import compaction_steps  # noqa: E402
from app.host.host import EngineHost  # noqa: E402
from app.host.jobs import ReplyEvent, ReplyJob  # noqa: E402
from app.host.listener import QuietListener  # noqa: E402
from app.models.default_model import ensure_default_model  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GREEDY = SamplingParams.greedy(16)
SUMMARY_TOKENS = 160  # the summary a small chat needs (the app allows up to 512)
FACT = (
    "Port {i} has a north pier of {m} metres, a ferry at {h}:15 every day, and a "
    "lighthouse painted red and white; its harbour master is called Ada {i}. "
)


def _reply(
    host: EngineHost,
    conv_id: str,
    messages: list[ChatMessage],
    params: SamplingParams = GREEDY,
    **kw: Any,
) -> Finished:
    events: list[ReplyEvent] = []
    job = ReplyJob(new_id(), "gui", messages, params, events.append, conv_id=conv_id, **kw)
    host.run_here(job)
    end = events[-1]
    assert isinstance(end, Finished), end
    return end


def _history(engine: Engine, tokens: int) -> Conversation:
    """A chat of about ``tokens`` tokens: long questions, short answers."""
    conv = Conversation(system_prompt="You answer questions about harbours, briefly.")
    i = 0
    while engine.count_tokens(" ".join(m.content for m in conv.messages)) < tokens:
        text = "".join(FACT.format(i=i * 7 + k, m=80 + k, h=6 + k % 12) for k in range(4))
        conv.messages.append(Message("user", f"{text}What is special about port {i}?"))
        conv.messages.append(Message("assistant", f"Port {i} has a red and white lighthouse."))
        i += 1
    return conv


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--history-tokens", type=int, default=3000)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    engine = Engine()
    model = ensure_default_model(ROOT / ".cache" / "test-models")
    engine.load(model, LoadConfig(n_ctx=4096, n_threads=args.threads))
    conv = _history(engine, args.history_tokens)
    out: dict[str, Any] = {"bench": "compaction"}
    with tempfile.TemporaryDirectory() as tmp:
        store = ConversationStore(Path(tmp) / "data")
        host = EngineHost(engine, Path(tmp) / "models", store, QuietListener())
        core = host._core
        # The chat as the window has it: read once, its last reply's turn prepared.
        chat = conv.chat()
        done = _reply(host, conv.id, chat[:-1])
        conv.messages[-1] = Message("assistant", done.text)
        out["history_tokens"] = len(engine.cached_tokens)
        before = list(engine.cached_tokens)
        found = compaction.plan(conv)
        assert found is not None
        summary_id = new_id()
        asked = compaction.request(conv.chat(), conv, found)
        writing = SamplingParams.greedy(SUMMARY_TOKENS)
        summary = _reply(host, conv.id, asked, writing, compaction=summary_id, next_turn=False)
        out["summary_read"] = summary.metrics.evaluated_tokens
        out["summary_written"] = summary.metrics.generated_tokens
        made = compaction.apply(conv, found, summary.text or "Ports 0 and up.")
        made.id = summary_id
        out["settle_read"] = compaction_steps.settle(core, conv.id, conv.chat(), GREEDY)
        out["after_compaction_tokens"] = len(engine.cached_tokens)
        out["tokens_freed"] = len(before) - len(engine.cached_tokens)
        evaluated = new = 0
        for i in range(args.turns):
            question = (
                f"And what about the ferry of port {i}: when does it leave, and from which pier?"
            )
            conv.messages.append(Message("user", question))
            held = len(engine.cached_tokens)  # the history and the next turn's opening
            end = _reply(host, conv.id, conv.chat())
            conv.messages.append(Message("assistant", end.text))
            evaluated += end.metrics.evaluated_tokens
            new += end.metrics.prompt_tokens - held  # the turn's own: its words, its end
        out["after_eval_ratio"] = round(evaluated / new, 3)
        t0 = time.perf_counter()
        restored = compaction_steps.restore_undo(core, conv.id, summary_id)
        out["undo_ms"] = round((time.perf_counter() - t0) * 1000, 1)
        assert restored and list(engine.cached_tokens) == before
        engine.reset()
        compaction.undo(conv)
        t0 = time.perf_counter()
        compaction_steps.settle(core, conv.id, conv.chat(), GREEDY)  # read from nothing
        out["reread_ms"] = round((time.perf_counter() - t0) * 1000, 1)
    engine.unload()
    out["undo_speedup"] = round(out["reread_ms"] / out["undo_ms"], 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
