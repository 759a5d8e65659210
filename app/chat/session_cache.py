"""Saving and restoring a conversation's KV cache; runs on the engine's thread.

A snapshot's header records the LoRA stack its cache was computed under. On
restore, a stack that differs from the engine's (in what changes the output) is
re-applied first when all of its adapter files are still there, unchanged; a
missing or changed adapter leaves the engine's stack alone and the cache unused,
and the transcript is evaluated again on the next message.

A cache that holds pictures also records the fingerprint of the vision projector that
read them: under another projector (or none) it is not used. A cache of text alone
restores whatever projector is loaded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from app.chat.snapshot import (
    SnapshotError,
    SnapshotHeader,
    draft_record,
    read_header,
    read_snapshot,
    runtime_info,
    write_snapshot,
)
from app.chat.store import ConversationStore
from app.engine.backend import Backend
from app.gguf.lora import LoraStack, stack_key
from app.util.errors import LamplightError
from app.util.hashing import FingerprintCache

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RestoreResult:
    """How opening a conversation went: ``note`` says why the cache was not used.

    ``lora_stack`` is the engine's stack afterwards (None for an engine without
    LoRA support); ``lora_changed`` says the restore switched to the conversation's.
    """

    conv_id: str
    restored: bool
    n_tokens: int
    ms: float
    note: str
    lora_stack: LoraStack | None = None
    lora_changed: bool = False


class SessionCache:
    """Writes and reads KV snapshots for the engine's current model."""

    def __init__(self, engine: Backend, store: ConversationStore, fingerprints: FingerprintCache):
        self.engine = engine
        self.store = store
        self.fingerprints = fingerprints

    def header(self, images: bool = False) -> SnapshotHeader:
        """What the cache as it stands depends on, including the stack it was computed under
        and, for a cache with ``images``, the projector that read them.

        Raises:
            LamplightError: no model is loaded, or the projector file cannot be read.
        """
        model = self.engine.model
        if model is None:
            raise LamplightError("No model is loaded.")
        cache = dict(self.engine.cache_config())
        lora = cache.pop("lora", [])  # the header has a field of its own for it
        projector = str(cache.pop("projector", "") or "")  # and for this, fingerprinted
        return SnapshotHeader(
            # A model on a server has no local file: its backend says what identifies it.
            model=dict(model.fingerprint) or self.fingerprints.fingerprint(Path(model.path)),
            runtime=dict(model.runtime) or runtime_info(),
            cache=cache,
            lora=list(lora),
            # A record only: another draft, or none, never refuses the cache.
            draft=draft_record(self.engine.draft_info),
            projector=self._projector(projector) if images else {},
        )

    def _projector(self, path: str) -> dict[str, Any]:
        """The fingerprint of the projector file ``path`` ({} for none), remembered across
        runs like the model's, so only a changed file is hashed again."""
        if not path:
            return {}
        try:
            return self.fingerprints.fingerprint(Path(path))
        except OSError as exc:
            raise LamplightError(f"the vision projector could not be read ({exc})") from exc

    def save(self, conv_id: str, keep: frozenset[str] = frozenset()) -> tuple[int, list[str]]:
        """Snapshot the cache for ``conv_id``; returns (bytes, ids pruned to fit the budget)."""
        kv = self.engine.export_state(conv_id)
        path = self.store.snapshot_path(conv_id)
        if not kv.tokens:
            # An empty cache (after a reload, say) says nothing about the saved one: keep it.
            return self.store.snapshot_bytes(conv_id), []
        size = write_snapshot(path, self.header(images=min(kv.tokens) < 0), kv)
        dropped = self.store.prune(keep | {conv_id})
        return size, dropped

    def saved_stack(self, conv_id: str) -> LoraStack | None:
        """The LoRA stack ``conv_id``'s snapshot was made with (None without a readable one)."""
        try:
            header, _, _ = read_header(self.store.snapshot_path(conv_id))
            return LoraStack.from_signature(header.lora)
        except (SnapshotError, KeyError, TypeError, ValueError):
            return None

    def restore(self, conv_id: str, apply_lora: bool = True) -> RestoreResult:
        """Load ``conv_id``'s snapshot into the engine; on any problem, empty the cache.

        With ``apply_lora``, the snapshot's LoRA stack replaces the engine's when they
        differ; without, a different stack is a reason not to use the cache.
        """
        t0 = time.perf_counter()
        before = self._applied()
        try:
            path = self.store.snapshot_path(conv_id)
            saved, _, _ = read_header(path)
            expected = self._expected(saved, apply_lora)
            kv = read_snapshot(path, expected)
            self.engine.import_state(kv)
        except (SnapshotError, LamplightError, OSError) as exc:
            self.engine.reset()
            note = str(exc) if not isinstance(exc, OSError) else f"it could not be read ({exc})"
            log.info("snapshot for %s not used: %s", conv_id, note)
            ms = (time.perf_counter() - t0) * 1000
            return self._result(conv_id, False, 0, ms, note, before)
        self.store.touch_snapshot(conv_id)
        ms = (time.perf_counter() - t0) * 1000
        return self._result(conv_id, True, len(kv.tokens), ms, "", before)

    def _applied(self) -> list[dict[str, Any]]:
        return self.engine.lora_signature() if self.engine.capabilities.lora else []

    def _expected(self, saved: SnapshotHeader, apply_lora: bool) -> SnapshotHeader:
        """The header the snapshot ``saved`` must match, after applying its LoRA stack."""
        if stack_key(saved.lora) != stack_key(self._applied()):
            if not apply_lora:
                raise SnapshotError("it was made with other LoRA adapters")
            self._apply_saved_stack(saved.lora)
        # Equal keys: order and inactive entries do not change the cache. The loaded
        # projector is hashed only for a snapshot that says it holds pictures.
        current = self.header(images=bool(saved.projector))
        return replace(current, lora=[dict(s) for s in saved.lora])

    def _apply_saved_stack(self, saved: Sequence[Mapping[str, Any]]) -> None:
        """Apply the stack a snapshot was made with, if its active adapters are unchanged.

        Raises:
            SnapshotError: an adapter is missing or changed (the engine's stack stays).
            LamplightError: the engine refused the stack.
        """
        for entry in saved:
            if not entry.get("enabled", True) or not entry.get("scale"):
                continue  # does not change the cache; applied if present, skipped if not
            path = Path(str(entry.get("path", "")))
            name = entry.get("name") or path.name
            if not path.is_file():
                raise SnapshotError(f"its LoRA adapter {name} is missing ({path})")
            # Cheap checks first: a header naming some large file must not make us hash it.
            if path.stat().st_size != entry.get("size") or not _is_gguf(path):
                raise SnapshotError(f"its LoRA adapter {name} has changed since it was saved")
            if self.fingerprints.fingerprint(path)["sha256"] != entry.get("sha256"):
                raise SnapshotError(f"its LoRA adapter {name} has changed since it was saved")
        stack = LoraStack.from_signature(
            s
            for s in saved
            if (s.get("enabled", True) and s.get("scale")) or Path(str(s.get("path"))).is_file()
        )
        self.engine.set_lora_stack(stack)

    def _result(
        self,
        conv_id: str,
        restored: bool,
        n_tokens: int,
        ms: float,
        note: str,
        before: list[dict[str, Any]],
    ) -> RestoreResult:
        return RestoreResult(
            conv_id,
            restored,
            n_tokens,
            ms,
            note,
            lora_stack=self.engine.lora_stack if self.engine.capabilities.lora else None,
            lora_changed=self._applied() != before,
        )


def _is_gguf(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            return fh.read(4) == b"GGUF"
    except OSError:
        return False
