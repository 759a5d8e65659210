"""Saving and restoring a conversation's KV cache; runs on the engine's thread."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from app.engine import Engine
from app.errors import LamplightError
from app.fingerprint import FingerprintCache
from app.snapshot import SnapshotError, SnapshotHeader, read_snapshot, runtime_info, write_snapshot
from app.store import ConversationStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RestoreResult:
    """How opening a conversation went: ``note`` says why the cache was not used."""

    conv_id: str
    restored: bool
    n_tokens: int
    ms: float
    note: str


class SessionCache:
    """Writes and reads KV snapshots for the engine's current model."""

    def __init__(self, engine: Engine, store: ConversationStore, fingerprints: FingerprintCache):
        self.engine = engine
        self.store = store
        self.fingerprints = fingerprints

    def header(self) -> SnapshotHeader:
        model = self.engine.model
        if model is None:
            raise LamplightError("No model is loaded.")
        return SnapshotHeader(
            model=self.fingerprints.fingerprint(Path(model.path)),
            runtime=runtime_info(),
            cache=self.engine.cache_config(),
            lora=[],
        )

    def save(self, conv_id: str, keep: frozenset[str] = frozenset()) -> tuple[int, list[str]]:
        """Snapshot the cache for ``conv_id``; returns (bytes, ids pruned to fit the budget)."""
        kv = self.engine.export_state()
        path = self.store.snapshot_path(conv_id)
        if not kv.tokens:
            self.store.drop_snapshot(conv_id)
            return 0, []
        size = write_snapshot(path, self.header(), kv)
        dropped = self.store.prune(keep | {conv_id})
        return size, dropped

    def restore(self, conv_id: str) -> RestoreResult:
        """Load ``conv_id``'s snapshot into the engine; on any problem, empty the cache."""
        t0 = time.perf_counter()
        try:
            kv = read_snapshot(self.store.snapshot_path(conv_id), self.header())
            self.engine.import_state(kv)
        except (SnapshotError, LamplightError, OSError) as exc:
            self.engine.reset()
            note = str(exc) if not isinstance(exc, OSError) else f"it could not be read ({exc})"
            log.info("snapshot for %s not used: %s", conv_id, note)
            return RestoreResult(conv_id, False, 0, (time.perf_counter() - t0) * 1000, note)
        self.store.touch_snapshot(conv_id)
        ms = (time.perf_counter() - t0) * 1000
        return RestoreResult(conv_id, True, len(kv.tokens), ms, "")
