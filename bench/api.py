"""The local API server: what a streaming client sees, and what prefix reuse saves.

Starts ``lamplight serve`` (``tests/serve_fixture``) on 127.0.0.1 with the default
model, n_ctx 4096, ``--threads`` (2), port 0, and talks to it with the standard
library's ``urllib`` (SSE read line by line), so the client adds as little as it can.

* ``ratio``: greedy streamed replies of ``--tokens`` (200) with ``cache_prompt: false``;
  the client's decode rate, (completion_tokens − 1) ÷ (last − first content chunk
  arrival, ``perf_counter``), ÷ the engine's own rate for the same reply (the final
  chunk's ``timings.predicted_per_second``, ``MessageMetrics.decode_tok_s``). Median of
  the per-reply ratios; the target is ≥ 0.95.
* ``reuse_speedup``: a chat of about 1,500 tokens and its reply (greedy), then a new
  user turn. Time to first token (request sent → first content chunk) of that
  follow-up when the server still holds the chat in its cache (it evaluates only the
  new turn) vs with ``cache_prompt: false`` (it evaluates everything):
  ``ttft_fresh_ms ÷ ttft_reuse_ms``. Before each reuse round the chat itself is sent
  again (not timed), so the cache holds exactly what a client's previous call left.
  Rounds alternate which of the two goes first.
* ``pool_speedup``: the same follow-up after another client's chat came in between
  (chat A, chat B, then A's follow-up): served from the KV snapshot pool vs fresh.

Prints one JSON object. Usage:
  python bench/api.py [--quick] [--tokens 200] [--replies 5] [--rounds 7] [--threads 2]
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

from app.models.default_model import ensure_default_model
from bench.guarded import use_native_guard
from bench.sse import post_events
from tests.serve_fixture import Served, running

ROOT = Path(__file__).resolve().parent.parent
MODEL_CACHE = ROOT / ".cache" / "test-models"
N_CTX = 4096
TOPICS = (
    "the history of lighthouses",
    "how bread rises",
    "why the sea is salty",
    "the life of honeybees",
    "how glaciers move",
    "the first printing presses",
)


def stream(served: Served, body: dict[str, Any]) -> dict[str, Any]:
    """One streamed chat request; arrival times of content chunks, text, usage, timings."""
    payload = {**body, "model": served.model, "stream": True}
    payload["stream_options"] = {"include_usage": True}
    sent = time.perf_counter()
    arrivals: list[float] = []
    text: list[str] = []
    usage: dict[str, Any] = {}
    timings: dict[str, Any] = {}
    for chunk in post_events(served.url + "/chat/completions", payload):
        if "error" in chunk:
            raise RuntimeError(chunk["error"])
        for choice in chunk.get("choices") or []:
            content = (choice.get("delta") or {}).get("content")
            if content:
                arrivals.append(time.perf_counter())
                text.append(content)
        usage = chunk.get("usage") or usage
        timings = chunk.get("timings") or timings
    return {
        "sent": sent,
        "arrivals": arrivals,
        "text": "".join(text),
        "usage": usage,
        "timings": timings,
        "ttft_ms": (arrivals[0] - sent) * 1000 if arrivals else float("nan"),
    }


def greedy(messages: list[dict[str, str]], max_tokens: int, reuse: bool) -> dict[str, Any]:
    return {
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "cache_prompt": reuse,
    }


def decode_ratio(served: Served, replies: int, tokens: int) -> dict[str, Any]:
    ratios, client, engine = [], [], []
    for i in range(replies):
        topic = TOPICS[i % len(TOPICS)]
        r = stream(
            served,
            greedy([{"role": "user", "content": f"Tell me about {topic}."}], tokens, reuse=False),
        )
        n = int(r["usage"].get("completion_tokens", 0))
        span = r["arrivals"][-1] - r["arrivals"][0] if len(r["arrivals"]) > 1 else 0.0
        native = float(r["timings"].get("predicted_per_second", 0.0))
        if n < 2 or span <= 0 or native <= 0:
            continue
        seen = (n - 1) / span
        client.append(round(seen, 2))
        engine.append(round(native, 2))
        ratios.append(round(seen / native, 4))
    return {
        "ratio": statistics.median(ratios) if ratios else None,
        "ratios": ratios,
        "client_tok_s": client,
        "engine_tok_s": engine,
    }


def long_chat(served: Served) -> list[dict[str, str]]:
    """A chat of about 1,500 tokens: long user turns, short greedy replies."""
    paragraph = (
        "Please read this note carefully and keep it in mind for later questions. "
        "The keeper climbed the stairs each evening, trimmed the wick, polished the lens "
        "and wrote the weather in the log: wind, sea state, ships seen, and the hour. "
    )
    messages: list[dict[str, str]] = []
    for topic in TOPICS[:4]:
        messages.append({"role": "user", "content": f"About {topic}. " + paragraph * 6})
        r = stream(served, greedy(messages, 24, reuse=True))
        messages.append({"role": "assistant", "content": r["text"]})
    return messages


def reuse(served: Served, rounds: int) -> dict[str, Any]:
    chat = long_chat(served)[:-1]  # ends with a user turn
    # The reply as a fresh evaluation gives it (what every reuse round's priming call gets).
    reply = stream(served, greedy(chat, 24, reuse=False))["text"]
    follow = [
        *chat,
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "Summarize that in one line."},
    ]
    fresh_ms: list[float] = []
    reuse_ms: list[float] = []
    evaluated: dict[str, list[int]] = {"fresh": [], "reuse": []}
    cached: dict[str, list[int]] = {"fresh": [], "reuse": []}
    prompt_tokens = 0
    for i in range(rounds):
        for kind in ("fresh", "reuse") if i % 2 == 0 else ("reuse", "fresh"):
            if kind == "reuse":
                stream(served, greedy(chat, 24, reuse=False))  # cache: the chat + its reply
            r = stream(served, greedy(follow, 8, reuse=kind == "reuse"))
            (reuse_ms if kind == "reuse" else fresh_ms).append(round(r["ttft_ms"], 1))
            details = r["usage"].get("prompt_tokens_details") or {}
            prompt_tokens = int(r["usage"].get("prompt_tokens", 0))
            cached[kind].append(int(details.get("cached_tokens") or 0))
            evaluated[kind].append(int(r["timings"].get("prompt_n", -1)))
    fresh, warm = statistics.median(fresh_ms), statistics.median(reuse_ms)
    return {
        "prompt_tokens": prompt_tokens,
        "ttft_fresh_ms": fresh,
        "ttft_reuse_ms": warm,
        "reuse_speedup": round(fresh / warm, 2) if warm > 0 else None,
        "ttft_fresh_all_ms": fresh_ms,
        "ttft_reuse_all_ms": reuse_ms,
        "evaluated": evaluated,
        "cached": cached,
        "_chat": chat,
        "_follow": follow,
    }


def pool(
    served: Served, chat: list[dict[str, str]], follow: list[dict[str, str]], rounds: int
) -> dict[str, Any]:
    other = [{"role": "user", "content": "A different client asks about " + TOPICS[5] + "."}]
    pool_ms: list[float] = []
    fresh_ms: list[float] = []
    evaluated: list[int] = []
    for _ in range(rounds):
        stream(served, greedy(chat, 24, reuse=False))  # client A's call
        stream(served, greedy(other, 24, reuse=True))  # client B in between
        r = stream(served, greedy(follow, 8, reuse=True))  # A again: from the pool
        pool_ms.append(round(r["ttft_ms"], 1))
        evaluated.append(int(r["timings"].get("prompt_n", -1)))
        r = stream(served, greedy(follow, 8, reuse=False))
        fresh_ms.append(round(r["ttft_ms"], 1))
    fresh, pooled = statistics.median(fresh_ms), statistics.median(pool_ms)
    return {
        "ttft_pool_ms": pooled,
        "ttft_pool_fresh_ms": fresh,
        "pool_speedup": round(fresh / pooled, 2) if pooled > 0 else None,
        "pool_evaluated": evaluated,
    }


def main() -> int:
    use_native_guard()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2 replies, 3 rounds")
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--replies", type=int, default=5)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    replies, rounds = (2, 3) if args.quick else (args.replies, args.rounds)
    model = ensure_default_model(MODEL_CACHE)
    serve_args = ["--port", "0", "--threads", str(args.threads), "--n-ctx", str(N_CTX)]
    t0 = time.monotonic()
    with (
        tempfile.TemporaryDirectory() as tmp,
        running(Path(tmp) / "data", [*serve_args, "--model", str(model)]) as served,
    ):
        out: dict[str, Any] = {"model": served.model, "threads": args.threads, "n_ctx": N_CTX}
        out.update(decode_ratio(served, replies, args.tokens))
        reused = reuse(served, rounds)
        chat, follow = reused.pop("_chat"), reused.pop("_follow")
        out.update(reused)
        out.update(pool(served, chat, follow, max(1, rounds // 2)))
    out["ratio_target_met"] = out["ratio"] is not None and out["ratio"] >= 0.95
    out["seconds"] = round(time.monotonic() - t0, 1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
