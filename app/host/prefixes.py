"""Projects' openings kept warm (issue 44): a new chat in a project starts from a saved
copy of the cache holding the project's opening, and reads only its question.

Every chat in a project starts with the same system turn (the instructions, pinned
documents, the tools it offers): ``Backend.opening`` says what the template renders
before the first question's words. It is read once (``Backend.warm_opening``), the
cache is copied out (``export_state``) and kept in memory and in
``<data>/prefixes/<project>.<key>.lpkv``, a snapshot like a conversation's (checked
the same way on the way back, checkpoints included on a hybrid model). The key covers
what the state depends on: the model file, the runtime, the cache settings, the
adapters (``SessionCache.header``) and the opening's tokens, which hold the template,
the instructions and the tools. A change of any makes a new key: the next new chat
reads the new opening once and the project's older file is dropped.

Runs on the engine thread (``EngineCore``), before a reply's prompt is read, when no
cached conversation of the party already serves it (``KvPool.prepare``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from app.chat.conversation import is_valid_id
from app.chat.session_cache import SessionCache
from app.chat.snapshot import SnapshotError, SnapshotHeader, read_snapshot, write_snapshot
from app.config.setting_records import SamplingParams
from app.engine.backend import Backend, KvState, Opening
from app.engine.chat_message import ChatMessage
from app.engine.tool_spec import ToolRequest
from app.host.kv_pool import KvPool
from app.util.errors import LamplightError
from app.util.lru_files import files_by_use, trim

log = logging.getLogger(__name__)

SUFFIX = ".lpkv"
RAM_BYTES = 512 * 1024 * 1024  # openings kept in memory, the most recently used first
KEY_CHARS = 24


@dataclass
class PrefixStats:
    """How new chats in projects started (for tests and the bench)."""

    built: int = 0  # the opening read (the first chat of a project, or after a change)
    from_ram: int = 0
    from_disk: int = 0


class Prefixes:
    """Openings, in memory and under ``folder`` (None: memory only), each kept for an
    owner (a project, or an API party: ``prompt_cache``). ``max_bytes`` None: one file
    per owner (a project's opening replaces its older one); else every owner keeps as
    many as fit in ``max_bytes`` on disk, the least recently used going first."""

    def __init__(
        self, cache: SessionCache | None, folder: Path | None, max_bytes: int | None = None
    ) -> None:
        self._cache = cache
        self._folder = folder
        self.max_bytes = max_bytes
        self._ram: OrderedDict[str, KvState] = OrderedDict()
        self.stats = PrefixStats()
        # Set when a reply is queued: an opening read ahead stops for it (``prebuild``).
        self.preempt = threading.Event()

    def apply(
        self,
        engine: Backend,
        project: str,
        messages: Sequence[ChatMessage],
        params: SamplingParams,
        tools: ToolRequest | None,
        wanted: Callable[[Opening], bool] | None = None,
    ) -> str:
        """Make ``engine``'s cache hold ``project``'s opening (``messages``: its system
        turn); how: "ram", "disk", "built", or "" when it does not (the reply then reads
        everything, as without a project; ``wanted`` said no to the opening). Never
        raises."""
        try:
            keyed = self._keyed(engine, project, messages, params, tools)
            if keyed is None or (wanted is not None and not wanted(keyed[0])):
                return ""
            found, header, key = keyed
            return self._restore(engine, project, key, header) or self._build(
                engine, project, key, header, found
            )
        except (LamplightError, OSError) as exc:
            log.warning("the project's opening was not used: %s", exc)
            engine.reset()
            return ""

    def prebuild(
        self,
        engine: Backend,
        pool: KvPool,
        project: str,
        messages: Sequence[ChatMessage],
        params: SamplingParams,
        tools: ToolRequest | None,
        stop: threading.Event,
    ) -> str:
        """Read ``project``'s opening now, ahead of its next new chat (the project
        changed): "kept" (it is kept already), "built", "deferred" (the open chat's cache
        could not be set aside in the pool: its next message would read it all again),
        "stopped" (``stop``: a reply came first; the cache is emptied), or "" (none)."""
        try:
            keyed = self._keyed(engine, project, messages, params, tools)
            if keyed is None:
                return ""
            found, header, key = keyed
            path = self._path(project, key)
            if f"{project}.{key}" in self._ram or (path is not None and path.exists()):
                return "kept"
            if not pool.set_aside():
                return "deferred"
            pool.live = None  # the engine's cache is the opening's from here on
            if not engine.warm_opening(found, stop) or stop.is_set():
                engine.reset()
                return "stopped" if stop.is_set() else ""
            return self._keep(engine, project, key, header)
        except (LamplightError, OSError) as exc:
            log.warning("the project's opening was not read ahead: %s", exc)
            engine.reset()
            return ""

    def _keyed(
        self,
        engine: Backend,
        project: str,
        messages: Sequence[ChatMessage],
        params: SamplingParams,
        tools: ToolRequest | None,
    ) -> tuple[Opening, SnapshotHeader | None, str] | None:
        """``project``'s opening, the header its state is saved under, and its key
        (None: the engine keeps no openings, or the template has none)."""
        if not engine.capabilities.prefix or not is_valid_id(project):
            return None
        found = engine.opening(messages, params, tools)
        if found is None:
            return None
        header = self._cache.header() if self._cache is not None else None
        return found, header, _key(header, found.tokens)

    def forget(self, project: str) -> None:
        """Drop ``project``'s saved openings (the project was deleted)."""
        for path in self._files(project):
            path.unlink(missing_ok=True)

    def _restore(
        self, engine: Backend, project: str, key: str, header: SnapshotHeader | None
    ) -> str:
        state = self._ram.get(f"{project}.{key}")  # an owner's own: never another's
        if state is not None:
            engine.import_state(state)
            self._ram.move_to_end(f"{project}.{key}")
            self.stats.from_ram += 1
            return "ram"
        path = self._path(project, key)
        if header is None or path is None or not path.exists():
            return ""
        try:
            state = read_snapshot(path, header)
        except SnapshotError as exc:  # damaged, or made for something else: made again
            log.info("the saved opening of %s was not used: %s", project, exc)
            path.unlink(missing_ok=True)
            return ""
        engine.import_state(state)
        self._remember(f"{project}.{key}", state)
        self.stats.from_disk += 1
        with contextlib.suppress(OSError):  # most recently used: the last to go
            os.utime(path)
        return "disk"

    def _build(
        self,
        engine: Backend,
        project: str,
        key: str,
        header: SnapshotHeader | None,
        found: Opening,
    ) -> str:
        if not engine.warm_opening(found):
            return ""
        return self._keep(engine, project, key, header)

    def _keep(self, engine: Backend, project: str, key: str, header: SnapshotHeader | None) -> str:
        """Copy the opening out of the engine: in memory, and over the project's file."""
        state = engine.export_state()
        self.stats.built += 1
        self._remember(f"{project}.{key}", state)
        path = self._path(project, key)
        if header is not None and path is not None:
            write_snapshot(path, header, state)
            if self.max_bytes is None:
                for old in self._files(project):
                    if old != path:  # what the project's opening held before a change
                        old.unlink(missing_ok=True)
            else:
                self._trim(path)
        return "built"

    def _trim(self, kept: Path) -> None:
        """The least recently used files go until the folder fits ``max_bytes`` (the
        one just written stays, whatever its size)."""
        if self._folder is not None and self.max_bytes is not None:
            trim(self._folder, f"*{SUFFIX}", kept, self.max_bytes)

    def usage(self) -> tuple[int, int]:
        """How many openings are kept on disk, and their bytes."""
        if self._folder is None:
            return 0, 0
        files = files_by_use(self._folder, f"*{SUFFIX}")
        return len(files), sum(size for _, size, _ in files)

    def clear(self) -> None:
        """Every opening gone, in memory and on disk."""
        self._ram.clear()
        if self._folder is not None and self._folder.is_dir():
            for path in self._folder.glob(f"*{SUFFIX}"):
                path.unlink(missing_ok=True)

    def _remember(self, key: str, state: KvState) -> None:
        self._ram[key] = state
        self._ram.move_to_end(key)
        while len(self._ram) > 1 and sum(len(s.state) for s in self._ram.values()) > RAM_BYTES:
            self._ram.popitem(last=False)

    def _path(self, project: str, key: str) -> Path | None:
        if self._folder is None:
            return None
        return self._folder / f"{project}.{key}{SUFFIX}"

    def _files(self, project: str) -> list[Path]:
        if self._folder is None or not is_valid_id(project) or not self._folder.is_dir():
            return []
        return sorted(self._folder.glob(f"{project}.*{SUFFIX}"))


def _key(header: SnapshotHeader | None, tokens: Sequence[int]) -> str:
    """What an opening's state depends on, hashed (a file name part)."""
    digest = hashlib.sha256()
    if header is not None:
        made = [header.model, header.runtime, header.cache, header.lora]
        digest.update(json.dumps(made, sort_keys=True).encode("utf-8"))
    digest.update(array("i", tokens).tobytes())
    return digest.hexdigest()[:KEY_CHARS]
