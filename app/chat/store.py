"""Saved conversations: one transcript (JSON) and one KV snapshot per conversation.

    <data>/conversations/<id>.json   the transcript; never dropped
    <data>/snapshots/<id>.lpkv       the KV cache; dropped least-recently-used
                                     first when over the disk budget
    <data>/search.sqlite3            the full-text index of the transcripts
                                     (derived; rebuilt when missing or damaged)
    <data>/images/                   attached pictures, by content (``images``,
                                     ``app.chat.image_store``); never dropped

Every write is atomic. Transcripts are read through ``app.util.datafiles``
(regular files only, size and depth limits). One whose content is damaged is
set aside as ``<id>.json.bad`` when the list is read, with a note for the user
(``take_notes``), and the others load; one that may be fine but cannot be read
now (permissions, over the size limit, a newer format) stays where it is and is
listed with the reason. Files in the snapshot folder that are not snapshots
(odd names, directories, links, pipes) are left alone and never counted.

The store is used from the GUI thread (transcripts, search) and the engine thread
(snapshots), so transcripts and the index are read and written under one lock and
snapshots under another: two saves of one conversation never interleave their file
write and index update, and a long search never holds up the engine's pruning.
"""

from __future__ import annotations

import builtins
import contextlib
import copy
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import update_wrapper
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar

from app.chat.conversation import (
    NAME_MAX,
    TITLE_MAX,
    Conversation,
    ConversationError,
    is_valid_id,
    new_id,
)
from app.chat.image_store import ImageStore
from app.chat.import_review import HeldBack, hold_back
from app.chat.search_index import SearchHit, SearchIndex
from app.chat.stored_files import MISSING, file_stamp, mtime, set_aside_noted
from app.config.field_spec import short_repr
from app.util.atomic import atomic_write_text
from app.util.datafiles import DataFileError, ensure_directory, parse_json, read_json, reason

DEFAULT_BUDGET_BYTES = 1024 * 1024 * 1024
SNAPSHOT_SUFFIX = ".lpkv"
UNDO_MARK = "u"  # <conv>u<summary>.lpkv: the cache before a compaction (``undo_id``)
MAX_TRANSCRIPT_BYTES = 64 * 1024 * 1024  # a very long chat with pasted logs is ~10 MB
MAX_DEPTH = 16  # a transcript nests 5 levels: messages[{metrics{token_times_ms[...]}}]

_P = ParamSpec("_P")
_R = TypeVar("_R")


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
    set_aside: bool = False  # the transcript was damaged and moved to <id>.json.bad
    transcript_bytes: int = 0  # size of the transcript file (0 when unreadable)
    project_id: str = ""  # the project it belongs to ("" for none)


def _locked(
    method: Callable[Concatenate[ConversationStore, _P], _R],
) -> Callable[Concatenate[ConversationStore, _P], _R]:
    """Run ``method`` under the store's lock (re-entrant: locked methods call each other)."""

    def run(self: ConversationStore, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with self._lock:
            return method(self, *args, **kwargs)

    update_wrapper(run, method)  # not ``@wraps``: mypy loses the signature through it
    return run


class ConversationStore:
    """Reads and writes conversations under ``root``."""

    def __init__(self, root: Path, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> None:
        self.conversations_dir = root / "conversations"
        self.snapshots_dir = root / "snapshots"
        self._notes: builtins.list[str] = []  # for the user: files set aside
        for folder in (self.conversations_dir, self.snapshots_dir):
            note = ensure_directory(folder)
            if note:
                self._notes.append(note + ".")
        self.budget_bytes = budget_bytes
        # Sidebar rows by id, with the transcript's (size, mtime_ns) they were read at.
        self._summaries: dict[str, tuple[tuple[int, int], ConversationSummary]] = {}
        self.index = SearchIndex(root / "search.sqlite3")
        self.images = ImageStore(root)  # its own lock: read by the engine thread too
        self._lock = threading.RLock()  # transcripts, sidebar rows, the index
        self._snapshot_lock = threading.RLock()  # snapshots (taken after ``_lock``, never before)

    # -- paths -----------------------------------------------------------------------

    def transcript_path(self, conv_id: str) -> Path:
        return self.conversations_dir / f"{_checked(conv_id)}.json"

    def snapshot_path(self, conv_id: str) -> Path:
        return self.snapshots_dir / f"{_checked(conv_id)}{SNAPSHOT_SUFFIX}"

    # -- transcripts -------------------------------------------------------------------

    @_locked
    def take_notes(self) -> builtins.list[str]:
        """What was set aside since the last call, one line each (then forgotten)."""
        notes, self._notes = self._notes, []
        return notes

    @_locked
    def list(self) -> list[ConversationSummary]:
        """Every conversation, newest first. Damaged transcripts are set aside (see
        ``take_notes``); unreadable ones are listed with the reason.

        Only transcripts that changed since the last call (size or mtime) are read again.
        """
        out = []
        seen = set()
        for path in self.conversations_dir.glob("*.json"):
            conv_id = path.stem
            if not is_valid_id(conv_id):
                continue
            row = self.summary(conv_id)
            if not row.set_aside:
                seen.add(conv_id)
                out.append(row)
        for gone in set(self._summaries) - seen:
            del self._summaries[gone]
        out.sort(key=lambda s: s.updated, reverse=True)
        return out

    @_locked
    def summary(self, conv_id: str) -> ConversationSummary:
        """One sidebar row, read again only when the transcript changed on disk.

        A damaged transcript is set aside here: its row says so (``set_aside``).
        """
        path = self.transcript_path(conv_id)
        stamp = file_stamp(path)
        size = self.snapshot_bytes(conv_id)
        known = self._summaries.get(conv_id)
        if known is not None and known[0] == stamp:
            return replace(known[1], snapshot_bytes=size)
        try:
            row = _row(self.load(conv_id), size, max(stamp[0], 0))
        except ConversationError as exc:
            error = str(exc)
            aside = exc.damaged and set_aside_noted(path, error, self._notes)
            row = ConversationSummary(
                id=conv_id,
                title=f"(unreadable) {path.name}",
                updated=mtime(path),
                model_name="",
                n_tokens=0,
                n_messages=0,
                snapshot_bytes=size,
                error=error,
                set_aside=aside,
            )
            if aside:
                self._summaries.pop(conv_id, None)
                return row
        self._summaries[conv_id] = (stamp, row)
        return row

    @_locked
    def load(self, conv_id: str) -> Conversation:
        """The transcript of ``conv_id``.

        Raises:
            ConversationError: missing, unreadable, too large or damaged (``damaged``).
        """
        path = self.transcript_path(conv_id)
        try:
            data = read_json(path, MAX_TRANSCRIPT_BYTES, MAX_DEPTH)
        except FileNotFoundError as exc:
            raise ConversationError(f"{path.name}: no such conversation") from exc
        except DataFileError as exc:
            what = "damaged" if exc.damaged else "not usable"
            raise ConversationError(f"{path.name}: {what} ({reason(exc)})", exc.damaged) from exc
        conv = Conversation.from_dict(data, where=path.name, fallback_time=mtime(path))
        if conv.id != conv_id:
            raise ConversationError(f"{path.name}: holds conversation {conv.id}", damaged=True)
        return conv

    def save(self, conv: Conversation) -> int:
        """Write the transcript; its size in bytes (``save_row`` gives its sidebar row)."""
        return self.save_row(conv).transcript_bytes

    @_locked
    def save_row(self, conv: Conversation) -> ConversationSummary:
        """Write the transcript; its sidebar row (``transcript_bytes``: its size), made
        from ``conv`` and kept, so that ``summary`` does not read the file again.

        Raises:
            ConversationError: it would be larger than ``load`` reads (nothing written).
            OSError: the write failed.
        """
        conv.updated = time.time()
        path = self.transcript_path(conv.id)
        text = json.dumps(conv.to_dict(), indent=1)
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > MAX_TRANSCRIPT_BYTES:
            # Never write a file that cannot be opened again; the session keeps room for a
            # reply (``room_for``) so that this is not reached in use.
            raise ConversationError(
                f"it would take {size / 1e6:.0f} MB, over the {MAX_TRANSCRIPT_BYTES >> 20} MB "
                "a conversation can hold"
            )
        atomic_write_text(path, text)
        stamp = file_stamp(path)
        # Indexed with the stamp of what was written: a crash before this line leaves a
        # stale stamp, which the next search's ``sync`` repairs.
        self.index.update(conv, _stamp_text(stamp))
        row = _row(conv, self.snapshot_bytes(conv.id), size)
        self._summaries[conv.id] = (stamp, row)
        return row

    @_locked
    def search(self, text: str, project_id: str | None = None) -> builtins.list[SearchHit]:
        """Messages of any saved conversation that contain every word of ``text``;
        with ``project_id``, only of the chats in that project ("": in none), the hit
        limit applying within them.

        The index is first brought in step with the transcripts on disk (only the ones
        whose size or time changed are read again).
        """
        if not text.strip():
            return []
        stamps = {
            path.stem: _stamp(path)
            for path in self.conversations_dir.glob("*.json")
            if is_valid_id(path.stem)
        }
        self.index.sync(stamps, self._load_or_none)
        self._notes.extend(self.index.notes)
        self.index.notes.clear()
        within = None
        if project_id is not None:
            within = [r.id for r in self.list() if r.project_id == project_id and not r.error]
        return [hit for hit in self.index.search(text, within=within) if hit.conv_id in stamps]

    def _load_or_none(self, conv_id: str) -> Conversation | None:
        try:
            return self.load(conv_id)
        except ConversationError:
            return None

    @_locked
    def delete_transcript(self, conv_id: str) -> None:
        """Remove the transcript (the snapshot goes through the engine thread, after any
        write of it that is under way)."""
        with contextlib.suppress(FileNotFoundError):
            self.transcript_path(conv_id).unlink()
        self._summaries.pop(conv_id, None)
        self.index.remove(conv_id)

    @_locked
    def rename(self, conv_id: str, title: str) -> Conversation:
        conv = self.load(conv_id)
        conv.rename(title)
        self.save(conv)
        return conv

    @_locked
    def set_project(self, conv_id: str, project_id: str) -> Conversation:
        """Put a saved chat in project ``project_id`` ("" takes it out of any); saved.

        Raises:
            ConversationError: ``project_id`` is not an id, or the chat cannot be read.
            OSError: the write failed.
        """
        if project_id and not is_valid_id(project_id):
            raise ConversationError(f"invalid project id {short_repr(project_id)}")
        conv = self.load(conv_id)
        conv.project_id = project_id
        self.save(conv)
        return conv

    @_locked
    def fork(self, conv: Conversation, upto: int) -> Conversation:
        """A new conversation with messages ``0..upto`` of ``conv`` (and the results of
        calls at ``upto``); saved."""
        if not 0 <= upto < len(conv.messages):
            raise ConversationError(f"cannot fork at message {upto + 1}")
        while upto + 1 < len(conv.messages) and conv.messages[upto + 1].role == "tool":
            upto += 1  # a call's results go with it
        fork = copy.deepcopy(conv)
        fork.id = new_id()
        fork.alternatives = fork.prefix_alternatives(upto)
        fork.messages = fork.messages[: upto + 1]
        fork.forked_from = conv.id
        fork.created = time.time()
        fork.title = f"{conv.title} (fork)" if conv.title else ""
        fork.title_is_custom = bool(conv.title)
        fork.n_tokens = 0
        self.save(fork)
        return fork

    def import_file(self, path: Path) -> Conversation:
        """A conversation from an exported JSON file, saved under a new id, without what
        would reach outside it (``import_review``: dropped here; see ``import_reviewed``).

        Raises:
            ConversationError: the file cannot be read or is not a conversation.
            OSError: the new transcript could not be written.
        """
        return self.import_reviewed(path)[0]

    @_locked
    def import_reviewed(self, path: Path) -> tuple[Conversation, HeldBack]:
        """As ``import_file``, with what was held back for the user to confirm
        (``import_review.restore``, then ``save``)."""
        try:
            raw = read_json(path, MAX_TRANSCRIPT_BYTES, MAX_DEPTH)
        except FileNotFoundError as exc:
            raise ConversationError(f"{path.name}: no such file") from exc
        except DataFileError as exc:
            raise ConversationError(f"{path.name}: not a conversation ({reason(exc)})") from exc
        return self._import(raw)

    @_locked
    def import_json(self, text: str) -> Conversation:
        """A conversation from exported JSON, saved under a new id (as ``import_file``)."""
        if len(text) > MAX_TRANSCRIPT_BYTES:
            raise ConversationError("the imported file is too large")
        try:
            data = parse_json(text, MAX_DEPTH)
        except DataFileError as exc:
            raise ConversationError(f"not valid JSON ({reason(exc)})") from exc
        return self._import(data)[0]

    @_locked
    def import_data(self, data: object) -> tuple[Conversation, HeldBack]:
        """As ``import_reviewed``, from an exported conversation already decoded (one
        chat of a project's export).

        Raises:
            ConversationError: it is not a conversation.
            OSError: the new transcript could not be written.
        """
        return self._import(data)

    def _import(self, data: object) -> tuple[Conversation, HeldBack]:
        if isinstance(data, dict):
            data = {**data, "id": new_id()}  # whatever id it had: it gets a new one
        conv = Conversation.from_dict(data, where="imported file")
        conv.n_tokens = 0
        # It joins no project here on its own: a project brings its tools and adapters.
        conv.project_id = ""
        held = hold_back(conv)  # saved without: a crash before the user answers keeps none
        self.save(conv)
        return conv, held

    # -- snapshots ---------------------------------------------------------------------

    def snapshot_bytes(self, conv_id: str) -> int:
        try:
            return self.snapshot_path(conv_id).stat().st_size
        except OSError:
            return 0

    def touch_snapshot(self, conv_id: str) -> None:
        """Mark a snapshot as just used (for least-recently-used pruning)."""
        with self._snapshot_lock, contextlib.suppress(OSError):
            os.utime(self.snapshot_path(conv_id))

    def drop_snapshot(self, conv_id: str) -> None:
        """Delete ``conv_id``'s snapshot; a conversation's also its compactions' undo
        snapshots (``undo_id``)."""
        with self._snapshot_lock:
            with contextlib.suppress(FileNotFoundError):
                self.snapshot_path(conv_id).unlink()
            if UNDO_MARK not in conv_id:
                self.drop_undo_snapshots(conv_id)

    def drop_undo_snapshots(self, conv_id: str, keep: str = "") -> None:
        """Delete ``conv_id``'s undo snapshots (``undo_id``), but ``keep`` (a name)."""
        with self._snapshot_lock:
            pattern = f"{_checked(conv_id)}{UNDO_MARK}*{SNAPSHOT_SUFFIX}"
            for path in self.snapshots_dir.glob(pattern):
                if path.stem != keep:
                    with contextlib.suppress(OSError):
                        path.unlink()

    def total_snapshot_bytes(self) -> int:
        with self._snapshot_lock:
            return sum(size for _, size, _ in self._snapshot_files())

    def prune(self, keep: frozenset[str] = frozenset()) -> builtins.list[str]:
        """Drop least recently used snapshots until the total fits the budget.

        Snapshots whose id is in ``keep`` (the open conversation) stay.
        Returns the ids dropped.
        """
        with self._snapshot_lock:
            return self._prune(keep)

    def _prune(self, keep: frozenset[str]) -> builtins.list[str]:
        files = sorted(self._snapshot_files(), key=lambda f: f[2])
        total = sum(size for _, size, _ in files)
        dropped = []
        for conv_id, size, _ in files:
            if total <= self.budget_bytes:
                break
            if conv_id in keep:
                continue
            with contextlib.suppress(OSError):
                self.snapshot_path(conv_id).unlink()
            total -= size
            dropped.append(conv_id)
        # Temp files of writes that a crash interrupted.
        for folder in (self.snapshots_dir, self.conversations_dir, *self.images.folders()):
            for tmp in folder.glob(".*.tmp"):
                if time.time() - mtime(tmp) > 3600:
                    with contextlib.suppress(OSError):
                        tmp.unlink()
        return dropped

    def drop_orphan_snapshots(self, keep: frozenset[str] = frozenset()) -> None:
        """Delete snapshots whose transcript is gone (a transcript that could not be
        written, say); ``keep``: ids whose transcript may still be written."""
        with self._lock, self._snapshot_lock:
            self._drop_orphans(keep)

    def _drop_orphans(self, keep: frozenset[str]) -> None:
        for conv_id, _, _ in self._snapshot_files():
            owner = conv_id.split(UNDO_MARK, 1)[0]  # an undo snapshot's conversation
            if owner not in keep and not os.path.lexists(self.transcript_path(owner)):
                with contextlib.suppress(OSError):
                    self.snapshot_path(conv_id).unlink()

    def _snapshot_files(self) -> builtins.list[tuple[str, int, float]]:
        """(id, size, mtime) of each snapshot: regular files with a valid id for a name
        (links, directories, pipes and strays are not snapshots, so never deleted)."""
        out = []
        try:
            entries = builtins.list(os.scandir(self.snapshots_dir))
        except OSError:
            return []
        for entry in entries:
            conv_id = entry.name.removesuffix(SNAPSHOT_SUFFIX)
            if conv_id == entry.name or not is_valid_id(conv_id):
                continue
            try:
                if not entry.is_file(follow_symlinks=False):
                    continue
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # gone since the listing
            out.append((conv_id, st.st_size, st.st_mtime))
        return out


def _row(conv: Conversation, snapshot_bytes: int, transcript_bytes: int) -> ConversationSummary:
    """The sidebar row of ``conv``; cut as ``load`` cuts, so that the row made from a
    conversation being saved is the row a read of the file gives."""
    return ConversationSummary(
        id=conv.id,
        title=conv.title[:TITLE_MAX] or "New chat",
        updated=conv.updated,
        model_name=conv.model_name[:NAME_MAX],
        n_tokens=conv.n_tokens,
        n_messages=len(conv.messages),
        snapshot_bytes=snapshot_bytes,
        transcript_bytes=transcript_bytes,
        project_id=conv.project_id,
    )


def undo_id(conv_id: str, summary_id: str) -> str:
    """The snapshot name of the cache before the compaction that wrote ``summary_id``
    in ``conv_id`` (``app.chat.compaction``: Undo restores it). Ids are hex, so
    ``UNDO_MARK`` never occurs in one; the snapshot goes with its conversation."""
    return f"{_checked(conv_id)}{UNDO_MARK}{_checked(summary_id)}"


def _checked(conv_id: str) -> str:
    # Ids become file names: only letters and digits, never a path, never too long.
    if not is_valid_id(conv_id):
        raise ConversationError(f"invalid conversation id {short_repr(conv_id)}")
    return conv_id


def _stamp_text(stamp: tuple[int, int]) -> str:
    """The search index's form of a stamp."""
    return "missing" if stamp == MISSING else f"{stamp[0]}:{stamp[1]}"


def _stamp(path: Path) -> str:
    return _stamp_text(file_stamp(path))
