"""An agent's first request after a restart, restored against re-read, in one run
(issue 46).

    .venv/bin/python bench/agent_api.py [--prefix-tokens 30000] [--threads 2]

On the default model, through Lamplight's API server in this process (its engine host,
as ``lamplight serve`` runs it), with Anthropic's SDK: an agent-sized request (a system
prompt of about ``--prefix-tokens`` tokens and twenty tools, built here) and a short
question, streamed. Timed from the request to its first token:

* ``reread``: the first request on an empty data folder (the opening read whole, then
  saved in the prompt cache);
* ``restored``: the first request after a restart (a new engine, host and server on
  the same folder) with another question: the opening restored from its file.

Then, on the restarted server, the decode speed of a greedy 96-token reply through
``/v1/messages``, ``/v1/responses`` and ``/v1/chat/completions`` (alternated, best of
five each), read by one light SSE reader for all three: the SDKs' event parsing costs
differ, and in this process it competes with the engine's thread (a real client runs
apart), which made the ratios swing from 0.92 to 1.06 between runs.

Prints one JSON object: the opening's tokens, both TTFTs, ``restart_ttft_speedup``
(reread / restored; goal >= 50), what the restored request read, the cache file's
size, and ``messages_decode_ratio`` / ``responses_decode_ratio`` (each ÷ chat
completions tokens per second; goal >= 0.98).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.guarded import use_native_guard
from bench.sse import post_events

use_native_guard()

import anthropic  # noqa: E402

from app.api.config import ApiConfig  # noqa: E402
from app.api.host_gateway import HostGateway  # noqa: E402
from app.api.runner import ApiServer  # noqa: E402
from app.chat.store import ConversationStore  # noqa: E402
from app.config.setting_records import LoadConfig  # noqa: E402
from app.engine.local.engine import Engine  # noqa: E402
from app.host import prompt_cache  # noqa: E402
from app.host.host import EngineHost  # noqa: E402
from app.host.listener import QuietListener  # noqa: E402
from app.models.default_model import ensure_default_model  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def agent_prompt(tokens: int) -> str:
    """About ``tokens`` tokens of an agent's system prompt (rules, ~37 tokens each on
    the default model's vocabulary)."""
    rules = [
        f"Rule {i}: when editing file src/module_{i % 97}.py keep the style of package "
        f"{i % 13}, update its tests and say which commands you ran."
        for i in range(tokens // 37)
    ]
    return "You are a careful coding agent in a large repository.\n" + "\n".join(rules)


def agent_tools(n: int = 20) -> list[dict[str, Any]]:
    return [
        {
            "name": f"tool_{i}",
            "description": f"Runs step {i} of an edit on one file and reports what changed.",
            "input_schema": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "line": {"type": "integer"},
                    "text": {"type": "string"},
                },
                "required": ["path"],
            },
        }
        for i in range(n)
    ]


@contextlib.contextmanager
def served(model: Path, root: Path, n_ctx: int, threads: int) -> Iterator[str]:
    """The API over a fresh engine on the data folder ``root``; its base URL."""
    engine = Engine()
    engine.load(model, LoadConfig(n_ctx=n_ctx, n_threads=threads))
    store = ConversationStore(root / "data")
    host = EngineHost(engine, root / "models", store, QuietListener())
    thread = host.start()
    server = ApiServer(HostGateway(host), ApiConfig(port=0))
    server.start()
    try:
        yield server.url.removesuffix("/v1")
    finally:
        server.stop()
        host.close()
        thread.join(60)
        engine.unload()


def first_token(base: str, system: str, question: str) -> tuple[float, Any]:
    """Seconds to the first streamed token of an agent's request, and its usage."""
    c = anthropic.Anthropic(base_url=base, api_key="none", max_retries=0, timeout=3600)
    t0 = time.perf_counter()
    ttft = 0.0
    with c.messages.stream(
        model="m",
        max_tokens=4,
        system=system,
        tools=agent_tools(),  # type: ignore[arg-type]
        tool_choice={"type": "none"},
        messages=[{"role": "user", "content": question}],
    ) as stream:
        for event in stream:
            if event.type == "content_block_delta" and not ttft:
                ttft = time.perf_counter() - t0
        usage = stream.get_final_message().usage
    return ttft or time.perf_counter() - t0, usage


ASK = "Write a long story about a lighthouse."


REPLY_TOKENS = 96
# Each API's streamed request for the same reply, what marks an answer token's event,
# and where its final event says how many tokens were written.
_DOORS: dict[str, tuple[dict[str, Any], Any, Any]] = {
    "/v1/messages": (
        {"max_tokens": REPLY_TOKENS, "messages": [{"role": "user", "content": ASK}]},
        lambda e: e.get("type") == "content_block_delta" and e["delta"].get("type") == "text_delta",
        lambda e: e["usage"]["output_tokens"] if e.get("type") == "message_delta" else None,
    ),
    "/v1/responses": (
        {"input": ASK, "max_output_tokens": REPLY_TOKENS, "store": False},
        lambda e: e.get("type") == "response.output_text.delta",
        lambda e: (
            e["response"]["usage"]["output_tokens"]
            if e.get("type") in ("response.completed", "response.incomplete")
            else None
        ),
    ),
    "/v1/chat/completions": (
        {
            "max_tokens": REPLY_TOKENS,
            "messages": [{"role": "user", "content": ASK}],
            "stream_options": {"include_usage": True},
        },
        lambda e: bool(e.get("choices")) and bool(e["choices"][0]["delta"].get("content")),
        lambda e: e["usage"]["completion_tokens"] if e.get("usage") else None,
    ),
}


def _decode_rate(base: str, path: str) -> float:
    """Tokens per second after the first token of a greedy reply streamed through
    ``path``, read by one light SSE reader for every API: the SDKs' event parsing
    differs in cost, and in this process it would compete with the engine's thread."""
    body, is_token, count = _DOORS[path]
    first, n = 0.0, 0
    request = {"model": "m", "temperature": 0, "stream": True, **body}
    for event in post_events(base + path, request):
        if not first and is_token(event):
            first = time.perf_counter()
        n = count(event) or n
    span = time.perf_counter() - first
    return (n - 1) / span if first and n > 1 and span > 0 else 0.0


def decode_rates(base: str, rounds: int = 5) -> list[float]:
    """Best tokens per second through /v1/messages, /v1/responses and
    /v1/chat/completions (alternated, so the machine's drift falls on each alike)."""
    best = [0.0, 0.0, 0.0]
    for _ in range(rounds):
        for side, path in enumerate(_DOORS):
            best[side] = max(best[side], _decode_rate(base, path))
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prefix-tokens", type=int, default=30000)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    model = ensure_default_model(ROOT / ".cache" / "models")
    system = agent_prompt(args.prefix_tokens)
    n_ctx = min(args.prefix_tokens + 4096, 32768)  # the model's trained context
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        with served(model, root, n_ctx, args.threads) as base:
            reread, first = first_token(base, system, "List the files you would change.")
        files = sorted((root / "data" / prompt_cache.FOLDER).glob("*.lpkv"))
        size = sum(f.stat().st_size for f in files)
        with served(model, root, n_ctx, args.threads) as base:
            restored, after = first_token(base, system, "Which test would you run first?")
            messages_rate, responses_rate, chat_rate = decode_rates(base)
    print(
        json.dumps(
            {
                "bench": "agent_api",
                "opening_tokens": first.cache_creation_input_tokens,
                "prompt_tokens": first.input_tokens + (first.cache_creation_input_tokens or 0),
                "reread_ttft_s": round(reread, 3),
                "restored_ttft_s": round(restored, 3),
                "restart_ttft_speedup": round(reread / restored, 1) if restored else None,
                "restored_read_tokens": after.input_tokens,
                "restored_cache_read_tokens": after.cache_read_input_tokens,
                "cache_file_mb": round(size / 2**20, 1),
                "messages_tok_s": round(messages_rate, 1),
                "responses_tok_s": round(responses_rate, 1),
                "chat_completions_tok_s": round(chat_rate, 1),
                "messages_decode_ratio": round(messages_rate / chat_rate, 3) if chat_rate else None,
                "responses_decode_ratio": round(responses_rate / chat_rate, 3)
                if chat_rate
                else None,
            }
        )
    )


if __name__ == "__main__":
    main()
