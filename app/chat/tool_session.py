"""The tool rounds of a ``ChatSession``'s reply, as a part of the session (a mixin).

A reply that calls tools is one ``ReplyRequest`` over several rounds: each round is a
``generate`` of the history so far; a round that ends with calls is recorded, its calls
go to the ``ToolLoop`` (run, or asked about), and once all have results they are
appended as ``tool`` messages and the next round is asked for. Stop between rounds
cancels the calls and ends the reply there.
"""

from __future__ import annotations

from app.chat.conversation import Conversation, Message
from app.chat.session_link import EngineLink, ReplyRequest, SessionView
from app.chat.store import MAX_TRANSCRIPT_BYTES, ConversationStore
from app.chat.tool_records import cut_result
from app.chat.tool_round import Decision, ToolLoop, rounds_notice, tool_request
from app.engine.backend import MAX_REPLY_BYTES
from app.engine.chat_message import ImagePart
from app.mcp.tool_host import McpTool

# Room kept in a transcript for the next reply: every backend caps a reply's text at
# MAX_REPLY_BYTES, and JSON's escapes can make that up to four times as long on disk.
REPLY_ROOM = 4 * MAX_REPLY_BYTES


class ToolRounds:
    """The tool-round half of ``ChatSession`` (which provides these attributes)."""

    conversation: Conversation
    _request: ReplyRequest | None
    _link: EngineLink
    _view: SessionView
    _tools: ToolLoop
    _saved_bytes: int
    _image_notes: set[tuple[str, str]]
    store: ConversationStore

    def _persist(self) -> bool:  # pragma: no cover - ChatSession's
        raise NotImplementedError

    def _drain(self) -> None:  # pragma: no cover - ChatSession's
        raise NotImplementedError

    def decide(self, call_id: str, decision: Decision, arguments: str | None = None) -> str:
        """The user's answer to call ``call_id`` in state "ask": "once", "always_tool" or
        "always_server" run it (an "always" is remembered), "deny" sends the model an
        error result. ``arguments``: the edited arguments (JSON object text) to run it
        with. Returns "" when done, else why nothing changed (e.g. "The arguments must
        be a JSON object.")."""
        return self._tools.decide(call_id, decision, arguments)

    def _images(self, m: Message) -> list[ImagePart]:
        """The pictures of ``m`` read from the store; one that cannot be read is left out
        with a note (once per image and conversation): the message goes without it."""
        parts, errors = self.store.images.load_all(m.images)
        for error in errors:
            if (self.conversation.id, error) not in self._image_notes:
                self._image_notes.add((self.conversation.id, error))
                self._view.notice(f"{error} The message is sent without it.")
        return parts

    def _offered(self, req: ReplyRequest, tools: list[McpTool]) -> None:
        """The host listed its tools: the reply is asked for, offering them."""
        if self._request is not req:
            return  # stopped meanwhile
        req.tools = tools
        self._tools.offer(tools)
        self._ask(req)

    def _ask(self, req: ReplyRequest) -> None:
        """Ask the engine for the reply's next round: the first answers ``req.prompt``,
        a later one the whole history, the last round's results at its end (the
        engine's cache holds the rest)."""
        conv = self.conversation
        shown = Conversation(
            system_prompt=conv.system_prompt,
            messages=list(conv.messages) if req.rounds else req.prompt,
        )
        chat = shown.chat(req.params.tool_result_chars, self._images)
        if req.tools:
            tools = tool_request(req.tools, req.rounds, req.params)
            req.id = self._link.generate(conv.id, chat, req.params, tools=tools)
        else:  # as before tools existed (an EngineLink may not take the keyword)
            req.id = self._link.generate(conv.id, chat, req.params)
        req.sent = shown.sent()
        req.parts, req.thinking = [], []

    def _calls_changed(self, message: Message) -> None:
        self._persist()
        self._view.tool_calls_changed(message)

    def _calls_done(self, results: list[Message]) -> None:
        """Every call of the round has its result: on to the next round."""
        req = self._request
        if req is None:  # pragma: no cover - the loop is cancelled when a reply ends
            return
        room = MAX_TRANSCRIPT_BYTES - REPLY_ROOM - self._saved_bytes
        if sum(len(r.content) for r in results) * 6 > room:  # JSON escapes: up to 6 bytes
            for r in results:  # no room for the whole text: keep what the model reads
                r.content = cut_result(r.content, req.params.tool_result_chars)
        self.conversation.messages.extend(results)
        req.rounds += 1
        self._persist()
        if req.rounds >= req.params.tool_rounds:
            self._view.notice(rounds_notice(req.rounds))
        self._ask(req)
        self._view.reply_begun(list(self.conversation.messages), added_user=False)

    def _stop_calls(self) -> None:
        """Stopped between rounds: the calls end "cancelled", no further round."""
        stopped = self._tools.cancel()
        if stopped is not None:
            self.conversation.messages.extend(stopped[1])
        self._request = None
        self._persist()
        self._view.show_conversation(self.conversation, opened=False, restoring=False)
        self._drain()
