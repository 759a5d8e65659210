"""Resuming a saved conversation from its KV snapshot versus evaluating it all again.

Builds a conversation of about 2,000 tokens on the default model (one long user
message and a short greedy reply), saves its KV snapshot with ``SessionCache``
into a temp data dir and its messages to a JSON file. Then a fresh process
(this script with ``--measure DIR``) loads the model and runs one short
untimed warm-up reply (neither is timed), appends a new short user turn and
measures, per round:

* resume_ms: from the start of ``SessionCache.restore`` (the snapshot is read
  from disk, checked and imported) until the first ``Token`` of the reply;
* reprefill_ms: after ``engine.reset()``, from the start of ``generate`` on the
  same messages until the first ``Token`` (the whole transcript evaluated).

The snapshot file was written moments before, so it is read through a warm OS
page cache (dropping the cache needs root); a cold read adds the disk's time
for ``snapshot_bytes``.

Prints one JSON object: resume_ms, reprefill_ms (medians over the rounds),
speedup = reprefill_ms / resume_ms, snapshot_bytes (file size), kv_bytes
(``engine.state_size()`` when the snapshot was taken) and bytes_ratio =
snapshot_bytes / kv_bytes, plus the token counts, per-round figures and each
side's fastest round (steadier than the median on a busy machine).
Usage: python bench/resume.py [--tokens 2000] [--rounds 3] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.chat.session_cache import SessionCache
from app.chat.store import ConversationStore
from app.config.setting_records import LoadConfig, SamplingParams
from app.engine.backend import Finished, Token
from app.engine.chat_message import ChatMessage
from app.engine.local.engine import Engine
from app.models.default_model import ensure_default_model
from app.util.hashing import FingerprintCache
from bench.child import run_json
from bench.guarded import use_native_guard

ROOT = Path(__file__).resolve().parent.parent
CONV_ID = "bench"
N_CTX = 4096
REPLY = SamplingParams.greedy(16)
NEXT = SamplingParams.greedy(8)
FOLLOW_UP = "Now say it again in one short sentence."


def long_text(words: int) -> str:
    return " ".join(f"word{i % 97}" for i in range(words))


def session_cache(engine: Engine, data: Path) -> SessionCache:
    store = ConversationStore(data)
    return SessionCache(engine, store, FingerprintCache(data / "fingerprints.json"))


def reply(engine: Engine, messages: list[ChatMessage], params: SamplingParams) -> Finished:
    for event in engine.generate(messages, params):
        if isinstance(event, Finished):
            return event
    raise RuntimeError("no Finished event")


def first_token_ms(
    engine: Engine, messages: list[ChatMessage], t0: float
) -> tuple[float, Finished]:
    """Milliseconds from ``t0`` to the first Token event; the reply is read to its end."""
    first = 0.0
    for event in engine.generate(messages, NEXT):
        if isinstance(event, Token) and not first:
            first = (time.perf_counter() - t0) * 1000
        elif isinstance(event, Finished):
            if not first:
                raise RuntimeError(f"the reply had no text ({event.metrics.stop_reason})")
            return first, event
    raise RuntimeError("no Finished event")


def build(model: Path, load: LoadConfig, data: Path, target: int) -> dict[str, Any]:
    """The conversation, its snapshot and its messages, written under ``data``."""
    engine = Engine()
    engine.load(model, load)
    words = 600
    for _ in range(3):  # aim prompt + reply at ``target`` tokens
        prompt = [ChatMessage("user", "Summarise this text. " + long_text(words))]
        n_prompt = len(engine.prompt_tokens(prompt))
        words = max(1, round(words * (target - REPLY.max_tokens) / n_prompt))
    prompt = [ChatMessage("user", "Summarise this text. " + long_text(words))]
    done = reply(engine, prompt, REPLY)
    messages = [*prompt, ChatMessage("assistant", done.text)]
    # As the app does after every reply: the next turn's opening tokens, evaluated ahead.
    prepared = engine.prewarm(prompt, ChatMessage("assistant", done.text))
    cache = session_cache(engine, data)
    snapshot_bytes, _ = cache.save(CONV_ID)
    info = {
        "prepared_tokens": prepared,
        "n_tokens": len(engine.cached_tokens),
        "kv_bytes": engine.state_size(),
        "snapshot_bytes": cache.store.snapshot_path(CONV_ID).stat().st_size,
    }
    assert info["snapshot_bytes"] == snapshot_bytes
    (data / "messages.json").write_text(
        json.dumps([{"role": m.role, "content": m.content} for m in messages]), encoding="utf-8"
    )
    engine.unload()
    return info


def measure(model: Path, load: LoadConfig, data: Path, rounds: int) -> dict[str, Any]:
    """Run in a fresh process: resume from the snapshot versus evaluating everything again."""
    engine = Engine()
    engine.load(model, load)  # not timed
    reply(engine, [ChatMessage("user", "Hello.")], SamplingParams.greedy(2))  # warm-up
    engine.reset()
    cache = session_cache(engine, data)
    raw = json.loads((data / "messages.json").read_text(encoding="utf-8"))
    messages = [ChatMessage(m["role"], m["content"]) for m in raw]
    follow = [*messages, ChatMessage("user", FOLLOW_UP)]

    resume, reprefill, restore_ms = [], [], []
    resumed = evaluated = None
    for _ in range(rounds):
        engine.reset()
        t0 = time.perf_counter()
        result = cache.restore(CONV_ID)
        if not result.restored:
            raise RuntimeError(f"the snapshot was not used: {result.note}")
        ms, resumed = first_token_ms(engine, follow, t0)
        resume.append(ms)
        restore_ms.append(result.ms)

        engine.reset()
        t0 = time.perf_counter()
        ms, evaluated = first_token_ms(engine, follow, t0)
        reprefill.append(ms)
    assert resumed is not None and evaluated is not None
    cache.restore(CONV_ID)
    kv_bytes_restored = engine.state_size()
    engine.unload()
    return {
        "resume_rounds": [round(v, 1) for v in resume],
        "reprefill_rounds": [round(v, 1) for v in reprefill],
        "restore_ms": round(statistics.median(restore_ms), 1),
        "resume_evaluated_tokens": resumed.metrics.evaluated_tokens,
        "resume_cached_tokens": resumed.metrics.cached_tokens,
        "reprefill_evaluated_tokens": evaluated.metrics.evaluated_tokens,
        "same_reply": resumed.text == evaluated.text,
        "kv_bytes_restored": kv_bytes_restored,
    }


def main() -> None:
    use_native_guard()
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=2000, help="conversation length")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()

    model = ensure_default_model(ROOT / ".cache" / "test-models")
    load = LoadConfig(n_ctx=N_CTX, n_threads=args.threads)
    if args.measure is not None:
        print(json.dumps(measure(model, load, args.measure, args.rounds)))
        return

    with tempfile.TemporaryDirectory(prefix="lamplight-resume-") as tmp:
        data = Path(tmp)
        info = build(model, load, data, args.tokens)
        command = ["--measure", str(data), "--rounds", str(args.rounds)]
        command += ["--threads", str(args.threads)]
        measured = run_json(__file__, command, "the measuring process", timeout=1800)

    resume_ms = statistics.median(measured["resume_rounds"])
    reprefill_ms = statistics.median(measured["reprefill_rounds"])
    print(
        json.dumps(
            {
                "resume_ms": round(resume_ms, 1),
                "reprefill_ms": round(reprefill_ms, 1),
                "speedup": round(reprefill_ms / resume_ms, 2),
                "snapshot_bytes": info["snapshot_bytes"],
                "kv_bytes": info["kv_bytes"],
                "bytes_ratio": round(info["snapshot_bytes"] / info["kv_bytes"], 4),
                "resume_min_ms": min(measured["resume_rounds"]),
                "reprefill_min_ms": min(measured["reprefill_rounds"]),
                "n_tokens": info["n_tokens"],
                "n_ctx": N_CTX,
                "threads": args.threads,
                "rounds": args.rounds,
                **measured,
            }
        )
    )


if __name__ == "__main__":
    main()
