"""The reply a ``ChatSession`` has in flight, from its request to its end.

``ReplyRun`` asks the engine for it (through ``ToolRounds``: round by round when it
calls tools), takes the engine's events for it, and writes its outcome into the open
conversation by the rules in ``app.chat.session``'s docstring: a regenerate or an edit
replaces messages only once the reply has started, and what it replaces is kept as an
alternative version; a reply that does not get going restores what was there; a
stopped or failed one keeps what was shown.

The session keeps the conversation, the saving and the actions waiting for the reply;
``ReplyRun`` reads and asks for them through ``SessionHooks``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.chat.conversation import Message
from app.chat.image_store import ImageStore
from app.chat.metrics_record import metrics_to_dict
from app.chat.session_link import (
    EngineLink,
    Kind,
    ReplyRequest,
    SessionView,
    fit_reasoning,
    shown_reply,
)
from app.chat.tool_round import Approvals, Post, forget_together
from app.chat.tool_session import SessionHooks, ToolRounds
from app.config.setting_records import SamplingParams
from app.engine.chat_message import ToolCall
from app.engine.metrics import MessageMetrics
from app.mcp.tool_host import ToolHost


class ReplyRun:
    """The reply in flight (``request``; None when there is none) and its tool rounds
    (``rounds``). ``host``, ``approvals``, ``post``: as ``ChatSession`` takes them."""

    def __init__(
        self,
        link: EngineLink,
        view: SessionView,
        images: ImageStore,
        session: SessionHooks,
        host: ToolHost | None,
        approvals: Approvals | None,
        post: Post | None,
    ) -> None:
        self._link = link
        self._view = view
        self._session = session
        self._request: ReplyRequest | None = None
        self.rounds = ToolRounds(
            link, view, images, session, lambda: self._request, host, approvals, post
        )

    @property
    def request(self) -> ReplyRequest | None:
        return self._request

    def start(
        self,
        kind: Kind,
        prompt: list[Message],
        params: SamplingParams,
        edit_index: int | None,
        before: list[Message] | None,
        offer_tools: bool,
    ) -> None:
        """Ask for a reply to ``prompt`` (``before``: the messages to restore if it does
        not get going; None: the conversation's now); with ``offer_tools`` and tools
        wanted, the host's tools are listed first (off this thread)."""
        req = ReplyRequest(
            id=-1,
            kind=kind,
            before=list(before if before is not None else self._session.conversation().messages),
            prompt=prompt,
            edit_index=edit_index,
            params=params,
        )
        if self.rounds.wanted(params) and offer_tools:
            self._request = req  # busy while the tools are listed (off this thread)
            self.rounds.fetch(req)
        else:
            self.rounds.ask(req)
            self._request = req

    def stop(self) -> None:
        """Stop the reply (see ``ChatSession.stop``)."""
        req = self._request
        if req is None:
            return
        if req.id < 0:  # the tools are still being listed: the engine has nothing yet
            self._cancelled(req, "", None, "")
        elif self.rounds.active:
            self._stop_calls()
        else:
            self._link.stop()

    def keep_shown(self) -> None:
        """Quitting while the reply could not be stopped in time: what was shown of it is
        recorded, and it ends here."""
        req = self._request
        if req is not None and (req.parts or req.thinking):
            self._record("".join(req.parts), None, "".join(req.thinking))
            self._request = None

    # -- engine events (see ``ChatSession``'s) -------------------------------------------

    def on_tokens(self, request: int, text: str, reasoning: bool) -> None:
        req = self._request
        if req is None or req.id != request:
            return
        (req.thinking if reasoning else req.parts).append(text)
        if not req.started:
            self._commit_branch(req)

    def on_finished(
        self,
        request: int,
        text: str,
        metrics: MessageMetrics,
        reasoning: str,
        tool_calls: Sequence[ToolCall],
    ) -> None:
        req = self._request
        if req is None or req.id != request:
            return
        text, reasoning = shown_reply(req, text, reasoning)
        self._commit_branch(req)
        self._forget(req, metrics)
        if tool_calls and req.rounds < req.params.tool_rounds:
            # Past the last round (calls were switched off) a reply's calls are ignored.
            message = self._record(text, metrics, reasoning, self.rounds.prepare(tool_calls))
            self._view.reply_ended(text, metrics, "")
            self._view.tool_calls_changed(message)
            self.rounds.begin(message, req.params)
            return
        self._record(text, metrics, reasoning)
        self._end(text, metrics, "")

    def on_cancelled(
        self, request: int, text: str, metrics: MessageMetrics, reasoning: str
    ) -> None:
        req = self._request
        if req is None or req.id != request:
            return
        self._cancelled(req, text, metrics, reasoning)

    def on_failed(self, request: int, message: str) -> None:
        req = self._request
        if req is None or req.id != request:
            return
        text, reasoning = shown_reply(req, "", "")
        if text or reasoning:
            # It failed part way: the text shown so far stays, with the error beside it.
            self._commit_branch(req)
            self._record(text, None, reasoning)
        elif req.kind == "edit" or req.rounds:
            # The edited message stays, unanswered; the version it replaced is kept (or:
            # the reply's earlier rounds stay, saved already).
            self._commit_branch(req)
        elif req.kind == "send":
            # The message stays, unanswered (it was saved before the reply was asked for).
            self._session.persist()
        else:
            self._restore(req)
        self._end(text, None, message, kept=False)

    # -- internals -----------------------------------------------------------------------

    def _cancelled(
        self, req: ReplyRequest, text: str, metrics: MessageMetrics | None, reasoning: str
    ) -> None:
        text, reasoning = shown_reply(req, text, reasoning)
        if req.started or text or reasoning or req.kind in ("send", "edit"):
            # A stopped reply stays as the user saw it; an empty one keeps roles alternating.
            self._commit_branch(req)
            self._forget(req, metrics)
            self._record(text, metrics, reasoning)
            # Stopped while the tools were listed (no metrics): shown again, since a view
            # keeps only a reply that comes with its metrics.
            self._end(text, metrics, "", kept=metrics is not None)
        else:
            self._restore(req)
            self._end("", None, "", kept=False)

    def _stop_calls(self) -> None:
        """Stopped between rounds: the calls end "cancelled", no further round."""
        conv = self._session.conversation()
        conv.messages.extend(self.rounds.cancel())
        self._request = None
        self._session.persist()
        self._view.show_conversation(conv, opened=False, restoring=False)
        self._session.drain()

    def _commit_branch(self, req: ReplyRequest) -> None:
        """The reply has started: its branch replaces what it was asked to replace."""
        if req.started:
            return
        req.started = True
        if req.kind not in ("send", "answer"):
            conv = self._session.conversation()
            # What the new version replaces stays as an alternative ("< 1/2 >").
            at = len(req.prompt) - 1 if req.kind == "edit" else len(req.prompt)
            conv.keep_replaced(at, req.before[at:])
            conv.messages = list(req.prompt)
            self._session.persist()

    def _restore(self, req: ReplyRequest) -> None:
        """The reply did not get going: exactly what was there before comes back."""
        conv = self._session.conversation()
        changed = conv.messages != req.before
        conv.messages = list(req.before)
        if changed:
            self._session.persist()

    def _forget(self, req: ReplyRequest, metrics: MessageMetrics | None) -> None:
        """Mark the messages the engine dropped to make room (they stay in the transcript)."""
        if metrics is None or metrics.dropped_count <= 0:
            return
        start = max(0, metrics.dropped_from)
        for m in req.sent[start : start + metrics.dropped_count]:
            if m is not None:
                m.forgotten = True
        forget_together(self._session.conversation().messages)

    def _record(
        self,
        text: str,
        metrics: MessageMetrics | None,
        reasoning: str = "",
        calls: list[dict[str, Any]] | None = None,
    ) -> Message:
        conv = self._session.conversation()
        msgs = conv.messages
        if metrics is not None and msgs and msgs[-1].role in ("user", "tool"):
            msgs[-1].token_offset = metrics.turn_offset
        message = Message(
            "assistant",
            text,
            token_offset=metrics.prompt_tokens if metrics else None,
            metrics=metrics_to_dict(metrics) if metrics else None,
            reasoning=fit_reasoning(reasoning, text),
            tool_calls=calls or [],
        )
        msgs.append(message)
        if metrics is not None:
            conv.n_tokens = metrics.context_used
        self._session.persist()
        return message

    def _end(
        self, text: str, metrics: MessageMetrics | None, error: str, kept: bool = True
    ) -> None:
        self._request = None
        conv = self._session.conversation()
        if not kept and conv.messages:
            # Shown again first: the transcript may have changed (an unanswered message, a
            # partial reply, a restored version); then the error goes under it.
            self._view.show_conversation(conv, opened=False, restoring=False)
        self._view.reply_ended(text, metrics if kept else None, error)
        self._session.drain()
