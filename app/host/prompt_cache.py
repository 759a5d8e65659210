"""The API's prompt cache that survives a restart (issue 46): an agent's long, stable
opening (its system prompt and tools: Claude Code's are about 33k tokens) is read once,
then kept in memory and on disk, so the first request after a restart or a model
switch restores it instead of reading it again.

It is the projects' mechanism (``prefixes.Prefixes``: keyed by the model file, the
runtime, the cache settings, the adapters and the opening's tokens; checked on the way
back) with an owner per API party: a key's requests find only what that key's
requests saved (the owner is a digest of the party, in the file name and the memory
key), and the window's chats are never here. It is used when the party's own caches do
not serve the request (``KvPool.prepare`` found none) and the opening is long
(``MIN_TOKENS``); the engine's cache is left alone when it already starts with it.
On disk it is bounded (``MAX_BYTES``), the least recently used going first;
``Prefixes.clear`` empties it (the API dialog's Clear).

A request that built the opening read it: its usage says so (``account``: the tokens
count as read and as written to the cache, Anthropic's ``cache_creation_input_tokens``);
one that restored it counts them as cached (``cached_tokens``,
``cache_read_input_tokens``).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass

from app.config.setting_records import SamplingParams
from app.engine.backend import Backend, Opening
from app.engine.chat_message import ChatMessage
from app.engine.metrics import MessageMetrics
from app.engine.tool_spec import ToolRequest
from app.host.prefixes import Prefixes

MIN_TOKENS = 1024  # a shorter opening is read again faster than a state is restored
MAX_BYTES = 8 << 30  # on disk, all parties together
FOLDER = "prompt-cache"


@dataclass(frozen=True)
class Warmed:
    """How a request started: from its party's saved opening ("ram", "disk"), having
    read and saved it ("built", ``tokens`` read in ``ms``), or neither ("")."""

    how: str = ""
    tokens: int = 0
    ms: float = 0.0


def owner(party: str) -> str:
    """The file-name-safe owner of ``party``'s openings (a digest: no key is kept)."""
    return "p" + hashlib.sha256(party.encode()).hexdigest()[:40]


def warm(
    cache: Prefixes,
    engine: Backend,
    party: str,
    messages: Sequence[ChatMessage],
    params: SamplingParams,
    tools: ToolRequest | None,
) -> Warmed:
    """Start the engine's cache from ``party``'s saved opening of ``messages`` (its
    system turn, with ``tools``), or read and save it, when it is long and the cache
    does not hold it already. Never raises."""
    if not messages or messages[0].role != "system":
        return Warmed()
    length = 0

    def wanted(found: Opening) -> bool:
        nonlocal length
        length = len(found.tokens)
        held = getattr(engine, "cached_tokens", None)
        return length >= MIN_TOKENS and not (held is not None and _starts(held, found))

    t0 = time.perf_counter()
    how = cache.apply(engine, owner(party), messages[:1], params, tools, wanted)
    return Warmed(how, length, (time.perf_counter() - t0) * 1000) if how else Warmed()


def _starts(held: Sequence[int], found: Opening) -> bool:
    n = len(found.tokens)
    return len(held) >= n and list(held[:n]) == list(found.tokens)


def account(metrics: MessageMetrics, warmed: Warmed) -> None:
    """A reply's usage after ``warmed``: a built opening was read by this request."""
    if warmed.how != "built":
        return
    moved = min(warmed.tokens, metrics.cached_tokens)
    metrics.cached_tokens -= moved
    metrics.evaluated_tokens += moved
    metrics.cache_written = moved
    metrics.prefill_ms += warmed.ms
