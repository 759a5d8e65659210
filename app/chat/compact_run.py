"""A compaction in flight, for the ``ChatSession`` that owns it (issue 45; what a
compaction is: ``app.chat.compaction``).

``start`` asks the engine for the summary (a job on a fork of the cache: the chat as
the model reads it, then the instruction); while it is written the session is busy and
Stop ends it, with nothing changed. When it ends, the compacted tail becomes the shown
version, the transcript is saved, and the engine reads the compacted chat up to its
next turn (``EngineLink.settle``): the one-time cost. ``undo`` shows the replaced tail
again and asks for the cache saved before the compaction (``restore_undo``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from app.chat import compaction
from app.chat.conversation import Conversation, Images, new_id
from app.chat.metrics_record import metrics_to_dict
from app.chat.session_link import EngineLink, SessionView
from app.config.setting_records import SamplingParams
from app.engine.metrics import MessageMetrics
from app.engine.token_estimate import estimate_tokens
from app.engine.tool_spec import ToolRequest

MIN_SUMMARY = 48  # tokens: less room than this and the summary could say nothing
FULL = (
    "The chat is too full to summarise in its {n_ctx:,}-token context: the summary needs "
    "room beside it. Drop older messages (When the context is full: truncate middle) or "
    "load the model with a larger context."
)
TOO_LITTLE = (
    "There is not enough to compact yet: the last {keep} exchanges always stay, and at "
    "least one more is needed."
)


@dataclass
class _Pending:
    request: int
    conv_id: str
    plan: compaction.Plan
    summary_id: str
    params: SamplingParams  # the chat's: the compacted chat is read as its replies render it
    tools: ToolRequest | None  # described, none callable, as its replies were offered them


class CompactRun:
    """The session's compaction: at most one at a time (see the module docstring)."""

    def __init__(
        self,
        link: EngineLink,
        view: SessionView,
        conversation: Callable[[], Conversation],
        persist: Callable[[], bool],
        drain: Callable[[], None],
        images: Images | None = None,
        tools: Callable[[str], ToolRequest | None] | None = None,
    ) -> None:
        """``images``: reads a message's pictures, as the replies send them; ``tools``:
        the tools a conversation's last reply was offered, none callable (so the
        summary's request and the compacted chat render as the cache holds them)."""
        self.images = images
        self._tools = tools
        self._link = link
        self._view = view
        self._conversation = conversation
        self._persist = persist
        self._drain = drain
        self.pending: _Pending | None = None

    @property
    def request_id(self) -> int | None:
        return self.pending.request if self.pending is not None else None

    def start(
        self, params: SamplingParams, prompt: str = compaction.DEFAULT_PROMPT, n_ctx: int = 0
    ) -> str:
        """Ask for the summary; "" when asked, else why not (nothing is changed).
        ``n_ctx``: the model's context (0: not known), which the request must fit."""
        conv = self._conversation()
        found = compaction.plan(conv)
        if found is None:
            return TOO_LITTLE.format(keep=compaction.KEEP_TURNS)
        chat = conv.chat(params.tool_result_chars, self.images)
        messages = compaction.request(chat, conv, found, prompt)
        room = compaction.SUMMARY_TOKENS
        if n_ctx > 0:  # the request must fit as it is: the summary takes what is left
            room = min(room, n_ctx - conv.n_tokens - estimate_tokens(messages[-1].content) - 16)
            if room < MIN_SUMMARY:
                return FULL.format(n_ctx=n_ctx)
        summary_id = new_id()
        asked = replace(
            params,
            max_tokens=min(params.max_tokens, room),
            tools="off",
            overflow="stop",  # the summary must not drop what it summarises
        )
        extra: dict[str, Any] = {"compaction": summary_id}  # a keyword an EngineLink may lack
        tools = self._tools(conv.id) if self._tools is not None else None
        if tools is not None:
            extra["tools"] = tools
        request = self._link.generate(conv.id, messages, asked, **extra)
        self.pending = _Pending(request, conv.id, found, summary_id, params, tools)
        return ""

    def owns(self, request: int) -> bool:
        return self.pending is not None and self.pending.request == request

    def on_finished(self, request: int, text: str, metrics: MessageMetrics) -> None:
        """The summary was written: the compacted tail is shown and saved, and the
        engine reads it once."""
        pending, self.pending = self.pending, None
        if pending is None or pending.request != request:
            return
        conv = self._conversation()
        if conv.id != pending.conv_id or not text.strip():
            self._view.notice("The summary came back empty: nothing was compacted.")
            self._drain()
            return
        made = compaction.apply(conv, pending.plan, text, metrics_to_dict(metrics))
        made.id = pending.summary_id  # the undo snapshot is named by it
        conv.n_tokens = max(0, conv.n_tokens - pending.plan.freed)  # until the next reply
        self._persist()
        self._view.show_conversation(conv, opened=False, restoring=False)
        settle = getattr(self._link, "settle", None)  # ``EngineClient.settle``
        if settle is not None:
            chars = pending.params.tool_result_chars
            extra = {"tools": pending.tools} if pending.tools is not None else {}
            settle(conv.id, conv.chat(chars, self.images), pending.params, **extra)
        n, freed = pending.plan.summarised, pending.plan.freed
        about = f", freeing about {freed:,} tokens" if freed else ""
        self._view.notice(
            f"Compacted: {n} earlier messages summarised in {metrics.generated_tokens:,} "
            f"tokens{about}. Chat → Undo compaction brings them back."
        )
        self._drain()

    def on_ended(self, request: int, why: str) -> None:
        """The summary was stopped (``why`` "") or failed: nothing changed."""
        pending, self.pending = self.pending, None
        if pending is None or pending.request != request:
            return
        self._view.notice(
            f"Compaction failed: {why} Nothing changed."
            if why
            else "Compaction stopped: nothing changed."
        )
        self._drain()

    def undo(self) -> bool:
        """Show the tail the latest compaction replaced, with the cache saved before it."""
        conv = self._conversation()
        summary_id = compaction.undo(conv)
        if summary_id is None:
            return False
        self._persist()
        restore = getattr(self._link, "restore_undo", None)  # ``EngineClient.restore_undo``
        if restore is not None:
            restore(conv.id, summary_id)
        self._view.show_conversation(conv, opened=False, restoring=False)
        return True
