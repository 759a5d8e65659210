"""Saved conversations: one transcript (JSON) and one KV snapshot per conversation.

    <data>/conversations/<id>.json   the transcript; never dropped
    <data>/snapshots/<id>.lpkv       the KV cache; dropped least-recently-used
                                     first when over the disk budget

Every write is atomic; a damaged transcript is reported and skipped, never
fatal for the others.
"""

from __future__ import annotations

import builtins
import contextlib
import copy
import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

from app.chat.conversation import Conversation, ConversationError, new_id
from app.util.atomic import atomic_write_text

DEFAULT_BUDGET_BYTES = 1024 * 1024 * 1024
SNAPSHOT_SUFFIX = ".lpkv"


@dataclass(frozen=True)
class ConversationSummary:
    """A row of the conversation list; ``error`` is set for a damaged transcript."""

    id: str
    title: str
    updated: float
    model_name: str
    n_tokens: int
    n_messages: int
    snapshot_bytes: int
    error: str = ""


class ConversationStore:
    """Reads and writes conversations under ``root``."""

    def __init__(self, root: Path, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> None:
        self.conversations_dir = root / "conversations"
        self.snapshots_dir = root / "snapshots"
        self.conversations_dir.mkdir(parents=True, exist_ok=True)
        self.snapshots_dir.mkdir(parents=True, exist_ok=True)
        self.budget_bytes = budget_bytes
        # Sidebar rows by id, with the transcript's (size, mtime_ns) they were read at.
        self._summaries: dict[str, tuple[tuple[int, int], ConversationSummary]] = {}

    # -- paths -----------------------------------------------------------------------

    def transcript_path(self, conv_id: str) -> Path:
        return self.conversations_dir / f"{_checked(conv_id)}.json"

    def snapshot_path(self, conv_id: str) -> Path:
        return self.snapshots_dir / f"{_checked(conv_id)}{SNAPSHOT_SUFFIX}"

    # -- transcripts -------------------------------------------------------------------

    def list(self) -> list[ConversationSummary]:
        """Every conversation, newest first; damaged ones are listed with the reason.

        Only transcripts that changed since the last call (size or mtime) are read again.
        """
        out = []
        seen = set()
        for path in self.conversations_dir.glob("*.json"):
            conv_id = path.stem
            if not (conv_id.isalnum() and conv_id.isascii()):
                continue
            seen.add(conv_id)
            out.append(self.summary(conv_id))
        for gone in set(self._summaries) - seen:
            del self._summaries[gone]
        out.sort(key=lambda s: s.updated, reverse=True)
        return out

    def summary(self, conv_id: str) -> ConversationSummary:
        """One sidebar row, read again only when the transcript changed on disk."""
        path = self.transcript_path(conv_id)
        try:
            st = path.stat()
            stamp = (st.st_size, st.st_mtime_ns)
        except OSError:
            stamp = (-1, -1)
        size = self.snapshot_bytes(conv_id)
        known = self._summaries.get(conv_id)
        if known is not None and known[0] == stamp:
            return replace(known[1], snapshot_bytes=size)
        try:
            conv = self.load(conv_id)
            row = ConversationSummary(
                id=conv.id,
                title=conv.title or "New chat",
                updated=conv.updated,
                model_name=conv.model_name,
                n_tokens=conv.n_tokens,
                n_messages=len(conv.messages),
                snapshot_bytes=size,
            )
        except ConversationError as exc:
            row = ConversationSummary(
                id=conv_id,
                title=f"(unreadable) {path.name}",
                updated=_mtime(path),
                model_name="",
                n_tokens=0,
                n_messages=0,
                snapshot_bytes=size,
                error=str(exc),
            )
        self._summaries[conv_id] = (stamp, row)
        return row

    def load(self, conv_id: str) -> Conversation:
        path = self.transcript_path(conv_id)
        try:
            raw = path.read_text(encoding="utf-8")
        except FileNotFoundError as exc:
            raise ConversationError(f"{path.name}: no such conversation") from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise ConversationError(f"{path.name}: could not be read ({exc})") from exc
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            reason = exc.args[0] if isinstance(exc, ValueError) else "nested too deeply"
            raise ConversationError(f"{path.name}: damaged ({reason})") from exc
        conv = Conversation.from_dict(data, where=path.name)
        if conv.id != conv_id:
            raise ConversationError(f"{path.name}: holds conversation {conv.id}")
        return conv

    def save(self, conv: Conversation) -> None:
        conv.updated = time.time()
        atomic_write_text(self.transcript_path(conv.id), json.dumps(conv.to_dict(), indent=1))

    def delete(self, conv_id: str) -> None:
        """Remove the transcript and the snapshot."""
        self.delete_transcript(conv_id)
        self.drop_snapshot(conv_id)

    def delete_transcript(self, conv_id: str) -> None:
        """Remove the transcript (the snapshot goes through the engine thread, after any
        write of it that is under way)."""
        with contextlib.suppress(FileNotFoundError):
            self.transcript_path(conv_id).unlink()
        self._summaries.pop(conv_id, None)

    def rename(self, conv_id: str, title: str) -> Conversation:
        conv = self.load(conv_id)
        conv.rename(title)
        self.save(conv)
        return conv

    def fork(self, conv: Conversation, upto: int) -> Conversation:
        """A new conversation with messages ``0..upto`` of ``conv``; saved."""
        if not 0 <= upto < len(conv.messages):
            raise ConversationError(f"cannot fork at message {upto + 1}")
        fork = copy.deepcopy(conv)
        fork.id = new_id()
        fork.messages = fork.messages[: upto + 1]
        fork.forked_from = conv.id
        fork.created = time.time()
        fork.title = f"{conv.title} (fork)" if conv.title else ""
        fork.title_is_custom = bool(conv.title)
        fork.n_tokens = 0
        self.save(fork)
        return fork

    def import_json(self, text: str) -> Conversation:
        """A conversation from exported JSON, saved under a new id."""
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise ConversationError("not valid JSON") from exc
        conv = Conversation.from_dict(data, where="imported file")
        conv.id = new_id()
        conv.n_tokens = 0
        self.save(conv)
        return conv

    # -- snapshots ---------------------------------------------------------------------

    def snapshot_bytes(self, conv_id: str) -> int:
        try:
            return self.snapshot_path(conv_id).stat().st_size
        except OSError:
            return 0

    def touch_snapshot(self, conv_id: str) -> None:
        """Mark a snapshot as just used (for least-recently-used pruning)."""
        with contextlib.suppress(OSError):
            os.utime(self.snapshot_path(conv_id))

    def drop_snapshot(self, conv_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.snapshot_path(conv_id).unlink()

    def total_snapshot_bytes(self) -> int:
        return sum(p.stat().st_size for p in self._snapshot_files())

    def prune(self, keep: frozenset[str] = frozenset()) -> builtins.list[str]:
        """Drop least recently used snapshots until the total fits the budget.

        Snapshots whose id is in ``keep`` (the open conversation) stay.
        Returns the ids dropped.
        """
        files = sorted(self._snapshot_files(), key=_mtime)
        total = sum(p.stat().st_size for p in files)
        dropped = []
        for path in files:
            if total <= self.budget_bytes:
                break
            conv_id = path.name.removesuffix(SNAPSHOT_SUFFIX)
            if conv_id in keep:
                continue
            size = path.stat().st_size
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            total -= size
            dropped.append(conv_id)
        # Temp files of writes that a crash interrupted.
        for folder in (self.snapshots_dir, self.conversations_dir):
            for tmp in folder.glob(".*.tmp"):
                if time.time() - _mtime(tmp) > 3600:
                    with contextlib.suppress(OSError):
                        tmp.unlink()
        return dropped

    def drop_orphan_snapshots(self, keep: frozenset[str] = frozenset()) -> None:
        """Delete snapshots whose transcript is gone (a transcript that could not be
        written, say); ``keep``: ids whose transcript may still be written."""
        for path in self._snapshot_files():
            conv_id = path.name.removesuffix(SNAPSHOT_SUFFIX)
            if conv_id not in keep and not self.transcript_path(conv_id).exists():
                with contextlib.suppress(OSError):
                    path.unlink()

    def _snapshot_files(self) -> builtins.list[Path]:
        return [p for p in self.snapshots_dir.glob(f"*{SNAPSHOT_SUFFIX}") if p.is_file()]


def _checked(conv_id: str) -> str:
    # Ids become file names: only letters and digits, never a path.
    if not conv_id or not conv_id.isalnum() or not conv_id.isascii():
        raise ConversationError(f"invalid conversation id {conv_id!r}")
    return conv_id


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
