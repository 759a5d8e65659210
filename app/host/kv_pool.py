"""A small RAM pool of KV snapshots, so clients taking turns do not re-read each other.

The engine has one KV sequence. When an API client, another API client and the GUI
take turns, each would evaluate its whole conversation again after the other's turn.
``KvPool`` keeps ``export_state()`` snapshots of recent conversations in memory (an
LRU within a byte budget and an entry count) and puts one back before a request
whose messages extend it, so only the new tokens are evaluated.

Rules (see docs/notes/api_server.md):

- Every cache has a *party*, who made it: ``GUI`` (the window) or an API client
  (``LOCAL_API``, or one per API key). A request reuses only its own party's caches,
  live or pooled: another party's conversation is never a prefix source, so neither
  the cache's speed nor ``cached_tokens`` tells a client what another one said. When
  the live cache is another party's it is stashed, then emptied (``holder``).
- ``prepare(key, messages, party)`` before every request. The live cache stays when
  it is the party's and its owner has the same key (a GUI conversation:
  ``"gui:<id>"``), its messages are a prefix of ``messages`` (a follow-up), or they are
  but for the reply (the same request again) and no entry covers more; rewinding the
  live cache is exact. Otherwise the party's longest entry of the same template and
  cache settings whose messages are all a prefix of ``messages`` (or whose key is
  ``key``) is imported, and the live cache is stashed first. Otherwise the live cache
  is stashed and, if it is the party's, left in place: the engine's text/token prefix
  match still reuses what the two share (a system prompt).
- Only *full-prefix* entries are restored: a restored Gemma 3 state holds only the
  last window of its sliding-window layers, so it can continue from its end but not
  rewind (NOTES: "Sliding-window layers and snapshots").
- ``finish(key, messages, reply)`` after a request names the live cache's owner.
  ``forget_live()`` after a reset, a LoRA change or a snapshot restore (the cache is
  no longer what the owner left); ``clear()`` when the model or backend changes.

The engine always checks the restored text against the new prompt, so a wrong guess
here costs time, never correctness. Worker thread only, like the backend.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from app.engine.backend import STASH, Backend, KvState
from app.engine.chat_message import ChatMessage, is_prefix
from app.util.errors import LamplightError

log = logging.getLogger(__name__)

DEFAULT_POOL_MB = 256
DEFAULT_ENTRIES = 8
MIN_TOKENS = 64  # a smaller cache is cheaper to evaluate again than to keep
GUI = "gui"  # the window's party: every conversation of the window
LOCAL_API = "api"  # the API's party when the server has no key (one local user)


@dataclass(frozen=True)
class Owner:
    """Whose conversation a cache holds: a key (``"gui:<id>"``, None for the API), the
    messages it covers (request + reply; None when not known), the template label and
    the party that made it (``GUI``, ``LOCAL_API``, an API key's party)."""

    key: str | None
    messages: tuple[ChatMessage, ...] | None
    label: str
    party: str


@dataclass
class PoolEntry:
    """One stashed cache."""

    owner: Owner
    config: dict[str, Any]
    state: KvState
    size: int
    last_used: int = 0


@dataclass
class PoolStats:
    """What the pool did (for tests, benches and the log)."""

    kept: int = 0
    restored: int = 0
    stashed: int = 0
    evicted: int = 0
    export_ms: list[float] = field(default_factory=list)
    import_ms: list[float] = field(default_factory=list)


class KvPool:
    """RAM snapshots of recent conversations' KV caches, keyed by owner (see module doc)."""

    def __init__(
        self,
        backend: Backend,
        pool_mb: int = DEFAULT_POOL_MB,
        max_entries: int = DEFAULT_ENTRIES,
        min_tokens: int = MIN_TOKENS,
    ) -> None:
        self.backend = backend
        self.budget = max(0, pool_mb) * 2**20
        self.max_entries = max(0, max_entries)
        self.min_tokens = min_tokens
        self.live: Owner | None = None
        # The party whose tokens the backend's cache may hold (None: empty), known even
        # when ``live`` is not (a LoRA change, the pool off): what ``prepare`` empties.
        self.holder: str | None = None
        self.stats = PoolStats()
        self._entries: list[PoolEntry] = []
        self._clock = itertools.count(1)

    # -- what it holds ---------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        """Whether the pool does anything for the backend and model in use."""
        return (
            self.budget > 0
            and self.max_entries > 0
            and self.backend.model is not None
            and self.backend.capabilities.snapshots
        )

    @property
    def entries(self) -> list[PoolEntry]:
        """The stashed caches, least recently used first."""
        return sorted(self._entries, key=lambda e: e.last_used)

    @property
    def bytes_used(self) -> int:
        return sum(e.size for e in self._entries)

    # -- the protocol ------------------------------------------------------------------

    def prepare(
        self, key: str | None, messages: Sequence[ChatMessage], party: str = LOCAL_API
    ) -> str:
        """Get the cache ready for a request by ``key`` of ``party`` for ``messages``.

        Returns what was done: ``"off"``, ``"live"`` (kept), ``"restored"`` or ``"none"``.
        Call it with the request's template already in place.
        """
        if not self.enabled:
            self.live = None
            self._claim(party)
            return "off"
        label = self._label()
        live = self.live
        best = self._best(key, messages, label, self._config_now(), party)
        if (
            live is not None
            and live.party == party == self.holder
            and self._keep(live, best, key, messages, label)
        ):
            self.stats.kept += 1
            return "live"
        if best is not None:
            # Out first: the stash below may evict or supersede it.
            self._entries.remove(best)
        self.stash_live()
        self.live = None
        if best is None:
            self._claim(party)
            return "none"
        self.holder = party  # an import replaces the whole cache, or leaves it empty
        t0 = time.perf_counter()
        try:
            self.backend.import_state(best.state)
        except LamplightError as exc:  # the cache is left empty: evaluate everything
            log.info("pooled cache not restored: %s", exc)
            return "none"
        best.last_used = next(self._clock)
        self.stats.import_ms.append((time.perf_counter() - t0) * 1000)
        self.stats.restored += 1
        self.live = best.owner
        log.debug(
            "KV pool: restored %d tokens in %.0f ms",
            len(best.state.tokens),
            self.stats.import_ms[-1],
        )
        return "restored"

    def finish(
        self,
        key: str | None,
        messages: Sequence[ChatMessage],
        reply: ChatMessage,
        party: str = LOCAL_API,
    ) -> None:
        """The request by ``key`` of ``party`` for ``messages`` ended with ``reply``: the
        live cache is its."""
        self.holder = party
        if not self.enabled:
            self.live = None
            return
        self.live = Owner(key, (*messages, reply), self._label(), party)

    def set_live(self, key: str) -> None:
        """The live cache was just loaded for the window's ``key`` (a conversation's
        snapshot)."""
        self.holder = GUI
        self.live = Owner(key, None, self._label(), GUI) if self.enabled else None

    def start_empty(self, party: str) -> None:
        """A request by ``party`` starts from an empty cache (``cache_prompt: false``):
        the live cache is stashed, then emptied.

        Raises:
            LamplightError: the backend could not empty its cache.
        """
        self.stash_live()
        self.backend.reset()
        self.holder = party

    def set_aside(self) -> bool:
        """Stash the live cache before the engine is used for other work: True when it
        is kept in the pool (or there is none), False when it could not be (too large,
        too short, its owner unknown, the pool off): then nothing changed."""
        if not self.enabled:
            return False  # nothing is pooled: whatever the engine holds would be lost
        live = self.live
        if live is None:
            return True
        before = self.stats.stashed
        self.stash_live()
        if self.stats.stashed > before:
            return True
        self.live = live
        return False

    def stash_live(self) -> None:
        """Keep a copy of the live cache in the pool when its owner is known."""
        live, self.live = self.live, None
        if live is None or not self.enabled:
            return
        if live.key is None and live.messages is None:
            return
        t0 = time.perf_counter()
        try:
            config = dict(self.backend.cache_config())
            kv = self.backend.export_state(STASH + live.party)
        except LamplightError as exc:
            log.info("live cache not pooled: %s", exc)
            return
        ms = (time.perf_counter() - t0) * 1000
        if len(kv.tokens) < self.min_tokens:
            return
        size = len(kv.state)
        if size > self.budget:
            return
        self.stats.export_ms.append(ms)
        self.stats.stashed += 1
        # An entry this one extends (or an older cache of the same conversation) is
        # no longer needed: a request that would take it takes this one.
        self._entries = [e for e in self._entries if not _superseded(e, live, config)]
        self._entries.append(PoolEntry(live, config, kv, size, next(self._clock)))
        self._evict()
        log.debug("KV pool: stashed %d tokens (%d bytes) in %.0f ms", len(kv.tokens), size, ms)

    def forget_live(self) -> None:
        """The live cache no longer holds what its owner left (a reset, a LoRA change)."""
        self.live = None

    def clear(self) -> None:
        """Drop everything (another model or backend)."""
        self.live = None
        self.holder = None
        self._entries.clear()

    # -- internals ---------------------------------------------------------------------

    def _claim(self, party: str) -> None:
        """Empty the backend's cache if it may hold another party's tokens: the engine's
        prefix match would reuse them, and the time and ``cached_tokens`` would tell."""
        if self.holder is not None and self.holder != party:
            try:
                self.backend.reset()
            except LamplightError as exc:  # no model: nothing is cached either
                log.info("the cache was not emptied: %s", exc)
        self.holder = party

    def _label(self) -> str:
        model = self.backend.model
        return model.template if model is not None else ""

    def _config_now(self) -> dict[str, Any]:
        """The cache settings a request would run under (the applied LoRA stack's)."""
        config = dict(self.backend.cache_config())
        if "lora" in config:
            config["lora"] = self.backend.lora_signature()
        return config

    def _best(
        self,
        key: str | None,
        messages: Sequence[ChatMessage],
        label: str,
        config: dict[str, Any],
        party: str,
    ) -> PoolEntry | None:
        best: PoolEntry | None = None
        rank = (False, 0)
        for entry in self._entries:
            if entry.owner.party != party or entry.owner.label != label or entry.config != config:
                continue
            full = entry.owner.messages is not None and is_prefix(entry.owner.messages, messages)
            if not full and (key is None or entry.owner.key != key):
                continue
            this = (full, len(entry.state.tokens))
            if best is None or this > rank:
                best, rank = entry, this
        return best

    def _keep(
        self,
        live: Owner,
        best: PoolEntry | None,
        key: str | None,
        messages: Sequence[ChatMessage],
        label: str,
    ) -> bool:
        """Whether the live cache serves the request at least as well as ``best``."""
        if key is not None and live.key == key:
            return True  # the conversation's own cache: the engine rewinds it exactly
        if live.messages is None or live.label != label:
            return False
        if is_prefix(live.messages, messages):  # a follow-up
            covered = best.owner.messages if best is not None else None
            return not (
                covered is not None
                and len(covered) > len(live.messages)
                and is_prefix(covered, messages)
            )
        # The same request again (a retry, another reply): the live cache rewinds exactly
        # to before its reply, unless an entry covers more.
        return best is None and _retries(live, messages, label)

    def _evict(self) -> None:
        self._entries.sort(key=lambda e: e.last_used)
        while self._entries and (
            len(self._entries) > self.max_entries or self.bytes_used > self.budget
        ):
            self._entries.pop(0)
            self.stats.evicted += 1


def _retries(live: Owner, messages: Sequence[ChatMessage], label: str) -> bool:
    """``messages`` extend the live owner's request (without its reply)."""
    owned = live.messages
    return (
        owned is not None
        and live.label == label
        and owned[-1:] != ()
        and owned[-1].role == "assistant"
        and is_prefix(owned[:-1], messages)
    )


def _superseded(entry: PoolEntry, live: Owner, config: dict[str, Any]) -> bool:
    if entry.config != config or entry.owner.label != live.label:
        return False
    if entry.owner.party != live.party:
        return False
    if live.key is not None and entry.owner.key == live.key:
        return True
    old, new = entry.owner.messages, live.messages
    return (
        entry.owner.key == live.key and old is not None and new is not None and is_prefix(old, new)
    )
