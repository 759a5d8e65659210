"""What a ``ChatSession`` talks to: the engine worker (``EngineLink``) and the window
(``SessionView``), both called on the session's (GUI) thread only; and the reply it has
in flight (``ReplyRequest``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from app.chat.conversation import Conversation, Message
from app.config.setting_records import SamplingParams
from app.engine.backend import MAX_REPLY_BYTES, cut_to_bytes
from app.engine.chat_message import ChatMessage
from app.engine.metrics import MessageMetrics
from app.engine.tool_spec import ToolRequest
from app.mcp.tool_host import McpTool

Kind = Literal["send", "regenerate", "edit", "answer"]


class EngineLink(Protocol):
    """What a session asks of the engine worker (``ui.engine.worker.EngineClient``)."""

    def generate(
        self,
        conv_id: str,
        messages: Sequence[ChatMessage],
        params: SamplingParams,
        tools: ToolRequest | None = None,
        prefix: str = "",
    ) -> int:
        """Queue a reply; the worker saves ``conv_id``'s snapshot after it. Returns its id.

        ``tools``: what the model may call (``ReplyJob.tools``); a reply that calls some
        ends with ``Finished.tool_calls``, passed on to ``ChatSession.on_finished``.
        ``prefix``: a new chat's project, whose opening it starts from (``ReplyJob``)."""

    def stop(self) -> None:
        """Ask the running reply to stop (its terminal event follows)."""

    def reset(self) -> None:
        """Empty the engine's cache (queued after running work)."""

    def restore_snapshot(self, conv_id: str) -> None:
        """Load ``conv_id``'s saved cache (queued after running work)."""

    def drop_snapshot(self, conv_id: str) -> None:
        """Delete ``conv_id``'s saved cache (queued after any write of it)."""


class SessionView(Protocol):
    """What the window shows for a session. Every call comes on the session's thread."""

    def show_conversation(self, conv: Conversation, opened: bool, restoring: bool) -> None:
        """Render the whole conversation. ``opened``: another one was just opened;
        ``restoring``: its saved cache is being loaded (the engine reports when)."""

    def reply_begun(self, shown: Sequence[Message], added_user: bool) -> None:
        """A reply starts after ``shown``; ``added_user``: only its last message is new.

        A reply that calls tools comes in rounds, each streamed after its own
        ``reply_begun`` and closed by one ``reply_ended``; a round after the first has
        ``added_user`` False and ``shown`` ends with the previous round's ``tool``
        results (render them like any message)."""

    def reply_ended(self, text: str, metrics: MessageMetrics | None, error: str) -> None:
        """The streamed reply ended: kept with ``metrics``, or failed with ``error``.

        After a round that asked for calls, the recorded reply is
        ``conversation.messages[-1]`` with its ``tool_calls``, ``tool_calls_changed``
        follows at once, and ``session.busy`` stays True (keep Stop enabled) until the
        last round ends; a reply stopped between rounds ends with ``show_conversation``
        (busy already False) instead of another ``reply_ended``."""

    def tool_calls_changed(self, message: Message) -> None:
        """The calls of ``message`` (an assistant turn in ``conversation.messages``)
        changed state: redraw its cards from ``message.tool_calls`` (each a dict with
        ``id``, ``name``, ``arguments``, ``server``, ``state`` and, once run, ``ms``;
        see ``app.chat.tool_records``). A card in state "ask" offers Allow once / Always
        for this tool / Always for this server / Deny and editable arguments, all
        answered with ``ChatSession.decide``. Results arrive as ``tool`` messages at
        the next ``reply_begun`` (or ``show_conversation`` after a stop)."""

    def open_failed(self, message: str) -> None:
        """A conversation could not be opened (the open one stays)."""

    def notice(self, text: str) -> None:
        """A one-line note for the user."""

    def row_saved(self, conv_id: str) -> None:
        """``conv_id``'s transcript was written (its sidebar row may change)."""

    def row_removed(self, conv_id: str) -> None:
        """``conv_id`` was deleted."""


@dataclass
class ReplyRequest:
    """The reply in flight and what to restore if it does not get going."""

    id: int
    kind: Kind
    before: list[Message]  # the messages before the operation
    prompt: list[Message]  # the branch the reply answers
    edit_index: int | None = None
    started: bool = False
    sent: list[Message | None] = field(default_factory=list)  # what the engine was given
    parts: list[str] = field(default_factory=list)  # streamed text, for a quit that cannot wait
    thinking: list[str] = field(default_factory=list)  # streamed thinking, likewise
    params: SamplingParams = field(default_factory=SamplingParams)
    tools: list[McpTool] = field(default_factory=list)  # offered to the model
    rounds: int = 0  # rounds of tool calls answered so far


def shown_reply(req: ReplyRequest, text: str, reasoning: str) -> tuple[str, str]:
    """The reply's answer and thinking: the backend's, or what was streamed when that is
    longer (a backend that ends a stopped or failed reply without its text)."""
    streamed, thought = "".join(req.parts), "".join(req.thinking)
    return (
        text if len(text) >= len(streamed) else streamed,
        reasoning if len(reasoning) >= len(thought) else thought,
    )


def fit_reasoning(reasoning: str, answer: str) -> str:
    """``reasoning`` cut so that a reply, thinking and answer together, stays within
    ``MAX_REPLY_BYTES`` (what ``REPLY_ROOM`` keeps in the transcript for it), whatever
    a backend sent."""
    if len(reasoning) + len(answer) <= MAX_REPLY_BYTES // 4:  # fits whatever the characters
        return reasoning
    room = MAX_REPLY_BYTES - len(answer.encode("utf-8", "replace"))
    return cut_to_bytes(reasoning, max(0, room))
