"""The tool rounds of a ``ChatSession``'s reply: a collaborator the session owns.

A reply that calls tools is one ``ReplyRequest`` over several rounds: each round is a
``generate`` of the history so far; a round that ends with calls is recorded, its calls
go to the ``ToolLoop`` (run, or asked about), and once all have results they are
appended as ``tool`` messages and the next round is asked for. Stop between rounds
cancels the calls and ends the reply there.

The session keeps the conversation and the saving, ``ReplyRun`` (``app.chat.reply_run``)
the reply in flight; ``ToolRounds`` reads and asks for them through ``SessionHooks`` and
``request``, and owns the ``ToolLoop``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from app.chat.conversation import Conversation, Message
from app.chat.image_store import ImageStore
from app.chat.project_chat import offered_tools
from app.chat.projects import Project
from app.chat.session_link import EngineLink, ReplyRequest, SessionView
from app.chat.tool_records import cut_result
from app.chat.tool_round import Approvals, Decision, Post, ToolLoop, rounds_notice, tool_request
from app.config.setting_records import SamplingParams
from app.engine.chat_message import ChatMessage, ImagePart, ToolCall
from app.engine.tool_spec import NONE, ToolRequest
from app.mcp.tool_host import McpTool, ToolHost


@dataclass(frozen=True)
class SessionHooks:
    """What the reply and its rounds read and ask of the ``ChatSession`` that owns them."""

    conversation: Callable[[], Conversation]  # the open conversation
    persist: Callable[[], bool]  # write the transcript (False: it failed, a note said so)
    result_room: Callable[[], int]  # bytes the transcript has left for a round's results
    drain: Callable[[], None]  # the reply ended: run the actions that waited for it
    project: Callable[[], Project | None]  # the open chat's project (its tools), if any


class ToolRounds:
    """Asks the engine for each round of the session's reply (``request()``: the one in
    flight) and runs the calls between rounds (``ToolLoop``). ``host``, ``approvals``,
    ``post``: as ``ChatSession`` takes them."""

    def __init__(
        self,
        link: EngineLink,
        view: SessionView,
        images: ImageStore,
        session: SessionHooks,
        request: Callable[[], ReplyRequest | None],
        host: ToolHost | None,
        approvals: Approvals | None,
        post: Post | None,
    ) -> None:
        self._link = link
        self._view = view
        self._images = images
        self._session = session
        self._request = request
        self._loop = ToolLoop(host, approvals, post, self._calls_changed, self._calls_done)
        self._image_notes: set[tuple[str, str]] = set()  # images said to be unreadable
        self._tool_notes: set[tuple[str, tuple[str, ...]]] = set()  # missing tools said
        self._offer: tuple[str, ToolRequest | None] = ("", None)  # (conv id, its last offer)

    @property
    def active(self) -> bool:
        """A round's calls are being asked or run (the engine has nothing to stop)."""
        return self._loop.active

    def wanted(self, params: SamplingParams) -> bool:
        """Whether a reply with ``params`` is offered tools (a host, tools not off)."""
        return self._loop.wanted(params)

    def fetch(self, req: ReplyRequest) -> None:
        """List the host's tools (off this thread), then ask for ``req``'s first round
        offering them, unless the reply was stopped meanwhile."""
        self._loop.fetch(lambda tools: self._offered(req, tools))

    def prepare(self, calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
        """The stored form of a round's calls (``ToolLoop.prepare``)."""
        return self._loop.prepare(calls)

    def begin(self, message: Message, params: SamplingParams) -> None:
        """Run, refuse or ask about the calls of ``message``, recorded in the conversation;
        once all have results the next round is asked for."""
        self._loop.begin(message, params)

    def cancel(self) -> list[Message]:
        """Stopped between rounds: the calls end "cancelled"; the results to append."""
        stopped = self._loop.cancel()
        return stopped[1] if stopped is not None else []

    def decide(self, call_id: str, decision: Decision, arguments: str | None = None) -> str:
        """The user's answer to a call in state "ask" (see ``ChatSession.decide``)."""
        return self._loop.decide(call_id, decision, arguments)

    def ask(self, req: ReplyRequest) -> None:
        """Ask the engine for the reply's next round: the first answers ``req.prompt``,
        a later one the whole history, the last round's results at its end (the
        engine's cache holds the rest)."""
        conv = self._session.conversation()
        shown = Conversation(
            system_prompt=conv.system_prompt,
            messages=list(conv.messages) if req.rounds else req.prompt,
        )
        chat = shown.chat(req.params.tool_result_chars, self.pictures)
        extra: dict[str, Any] = {}  # keywords only when used: an EngineLink may lack them
        if req.tools:
            extra["tools"] = tool_request(req.tools, req.rounds, req.params)
            self._offer = (conv.id, replace(extra["tools"], choice=NONE))
        elif req.rounds == 0:
            self._offer = (conv.id, None)
        if opens_project(conv, chat, req.rounds):
            extra["prefix"] = conv.project_id  # starts from the project's opening
        req.id = self._link.generate(conv.id, chat, req.params, **extra)
        req.sent = shown.sent()
        req.parts, req.thinking = [], []

    def described(self, conv_id: str) -> ToolRequest | None:
        """The tools the last reply in ``conv_id`` was offered, none callable (so a
        compaction's summary renders the chat as the cache holds it); None for none."""
        offer_conv, offer = self._offer
        return offer if offer_conv == conv_id else None

    def pictures(self, m: Message) -> list[ImagePart]:
        """The pictures of ``m`` read from the store; one that cannot be read is left out
        with a note (once per image and conversation): the message goes without it."""
        parts, errors = self._images.load_all(m.images)
        conv_id = self._session.conversation().id
        for error in errors:
            if (conv_id, error) not in self._image_notes:
                self._image_notes.add((conv_id, error))
                self._view.notice(f"{error} The message is sent without it.")
        return parts

    def _offered(self, req: ReplyRequest, listed: list[McpTool]) -> None:
        """The host listed its tools: the reply is asked for, offering them (in a
        project that chose tools, only those: ``offered_tools``)."""
        if self._request() is not req:
            return  # stopped meanwhile
        project = self._session.project()
        tools, missing = offered_tools(project, listed)
        note = (self._session.conversation().id, tuple(missing))
        if project is not None and missing and note not in self._tool_notes:
            self._tool_notes.add(note)
            self._view.notice(
                f"Not offered now: {', '.join(missing)} of {project.name} (switched off "
                "in Tools, or its server is not running)."
            )
        req.tools = tools
        self._loop.offer(tools)
        self.ask(req)

    def _calls_changed(self, message: Message) -> None:
        self._session.persist()
        self._view.tool_calls_changed(message)

    def _calls_done(self, results: list[Message]) -> None:
        """Every call of the round has its result: on to the next round."""
        req = self._request()
        if req is None:  # pragma: no cover - the loop is cancelled when a reply ends
            return
        room = self._session.result_room()
        if sum(len(r.content) for r in results) * 6 > room:  # JSON escapes: up to 6 bytes
            for r in results:  # no room for the whole text: keep what the model reads
                r.content = cut_result(r.content, req.params.tool_result_chars)
        conv = self._session.conversation()
        conv.messages.extend(results)
        req.rounds += 1
        self._session.persist()
        if req.rounds >= req.params.tool_rounds:
            self._view.notice(rounds_notice(req.rounds))
        self.ask(req)
        self._view.reply_begun(list(conv.messages), added_user=False)


def opens_project(conv: Conversation, chat: Sequence[ChatMessage], rounds: int) -> bool:
    """Whether a reply asks for a project chat's first answer: its system turn, one
    question, no tool round yet (then the project's opening is where it starts)."""
    return (
        bool(conv.project_id)
        and not rounds
        and len(chat) == 2
        and chat[0].role == "system"
        and chat[1].role == "user"
    )
