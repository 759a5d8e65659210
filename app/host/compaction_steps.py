"""A compaction's steps on the engine thread (issue 45; ``app.chat.compaction`` says
what a compaction is).

- ``summarise``: the summary is written on a copy of the conversation's cache (a fork:
  its state copied out first, put back after whatever happens), so a stopped or failed
  summary changes nothing; one that ended leaves the state before the compaction saved
  as the conversation's undo snapshot (``ConversationStore.undo_id``).
- ``settle``: the compacted chat read into the cache (the summary in the system turn,
  the kept turns after it) up to the next turn's opening, and saved, so the next
  message reads only itself. This is the compaction's one-time cost.
- ``restore_undo``: Undo's cache: the undo snapshot loaded (milliseconds, nothing read
  again), its file then the conversation's snapshot; nothing when there is none.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from app.chat.store import undo_id
from app.config.setting_records import SamplingParams
from app.engine.backend import STASH, EngineEvent, Finished, KvState
from app.engine.chat_message import ChatMessage
from app.engine.tool_spec import ToolRequest
from app.host.core import EngineCore, gui_key
from app.host.kv_pool import GUI
from app.util.errors import LamplightError

if TYPE_CHECKING:
    from app.host.jobs import ReplyJob

log = logging.getLogger(__name__)

Stream = Callable[[Iterator[EngineEvent]], Finished | None]
# The fork's name where the engine stores states itself (llama-server's slot files): a
# stash of its own, never a party's or a conversation's.
FORK = STASH + "compaction"


def summarise(core: EngineCore, job: ReplyJob, stream: Stream) -> Finished | None:
    """Write ``job``'s summary on a fork of the cache (``job.messages``: the chat and
    the instruction); the cache is as before afterwards."""
    engine = core.engine
    fork = engine.export_state(FORK)
    try:
        events = engine.generate(
            job.messages, job.params, job.stop, job.end_thinking, tools=job.tools
        )
        with contextlib.closing(events) as ev:
            ended = stream(ev)
    finally:
        put_back = _put_back(core, fork)
    if not put_back:
        return None
    if ended is not None and ended.metrics.stop_reason != "cancelled" and job.conv_id:
        save_undo(core, job.conv_id, job.compaction)
    return ended


def _put_back(core: EngineCore, fork: KvState) -> bool:
    """The cache as it was before the summary; False when it could not be (then it is
    empty, and the chat is read again)."""
    try:
        core.engine.import_state(fork)
    except LamplightError as exc:
        log.warning("the cache before the summary was not put back: %s", exc)
        core.pool.forget_live()
        return False
    return True


def save_undo(core: EngineCore, conv_id: str, summary_id: str) -> None:
    """Keep the cache as it stands (before the compaction) as ``conv_id``'s undo
    snapshot for ``summary_id``; the conversation's older ones go."""
    if core.cache is None or core.store is None or not core.engine.capabilities.snapshots:
        return
    name = undo_id(conv_id, summary_id)
    try:
        core.store.drop_undo_snapshots(conv_id, keep=name)
        core.cache.save(name, frozenset({conv_id, name}))
    except (LamplightError, OSError) as exc:
        log.warning("the cache before the compaction was not saved: %s", exc)


def settle(
    core: EngineCore,
    conv_id: str,
    messages: list[ChatMessage],
    params: SamplingParams,
    tools: ToolRequest | None = None,
) -> int:
    """Read the compacted chat (``messages``, ending with a reply) into the cache, up to
    the next turn's opening, with ``tools`` described as its replies offer them, and
    save it; the tokens read. It shares little with the cache (the summary comes right
    after the system prompt), so it is read whole."""
    engine = core.engine
    if not messages or engine.model is None:
        return 0
    key = gui_key(conv_id)
    history, reply = messages[:-1], messages[-1]
    read = 0
    try:
        found = engine.opening(messages, params, tools) if engine.capabilities.prefix else None
        if found is not None:
            core.pool.forget_live()  # the state before is the undo snapshot now
            read = engine.warm_opening(found)
        elif engine.capabilities.prewarm:
            core.pool.prepare(key, history, GUI)
            read = engine.prewarm(history, reply)
    except LamplightError as exc:
        log.info("the compacted chat was not read ahead: %s", exc)
    core.pool.finish(key, history, reply, GUI)
    core.save_snapshot(conv_id, frozenset({conv_id}))
    return read


def restore_undo(core: EngineCore, conv_id: str, summary_id: str) -> bool:
    """Load the cache saved before the compaction that wrote ``summary_id`` (Undo);
    whether it was (else the next message reads what it needs)."""
    if core.cache is None or core.store is None or core.engine.model is None:
        return False
    name = undo_id(conv_id, summary_id)
    if not core.store.snapshot_path(name).exists():
        return False
    core.pool.stash_live()
    result = core.cache.restore(name)
    if not result.restored:
        log.info("the cache before the compaction was not used: %s", result.note)
        core.pool.forget_live()
        return False
    core.pool.set_live(gui_key(conv_id))
    try:  # the state is the conversation's again: its file becomes the snapshot
        os.replace(core.store.snapshot_path(name), core.store.snapshot_path(conv_id))
    except OSError as exc:
        log.info("the undo snapshot was not kept as the conversation's: %s", exc)
        core.save_snapshot(conv_id, frozenset({conv_id}))
    return True
