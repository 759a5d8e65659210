"""``ChatSession``: the one owner of the open conversation's lifecycle.

It holds the conversation's messages (and so its per-reply metrics: the only
copy), the request in flight, the edit point, and saving. The window shows
what it says; the engine worker runs what it asks.

Rules it keeps, whatever order clicks arrive in:
- Nothing the user wrote or saw is dropped. A regenerate or an edit replaces
  messages only once the new reply has started (its first token), and what it
  replaces is kept as an alternative version ("< 1/2 >"). When a reply fails or
  is stopped before its first token, a regenerate restores exactly what was
  there; a sent or edited message stays in the transcript, unanswered (the
  error says why; answering it later is "Answer"); a reply that had started
  keeps the text shown so far, its thinking included.
- A user turn left without a reply is answered, never replaced: regenerate
  answers it, and a message sent after it is merged into it.
- A transcript never grows past what the store can read back: a message that
  would leave no room for a reply is refused before anything changes.
- Every state the user has seen is saved before the next action runs: actions
  that leave the conversation (new chat, open, fork, reload, quit) are queued
  behind the running reply, which is stopped, recorded and saved first.
- Roles alternate: a reply to a new message stopped before its first token is
  still recorded (empty).
- A transcript that cannot be written stays open and marked unsaved; the app
  does not switch away from it, and the next action tries again.
- A reply that calls tools is one reply over several rounds (``app.chat.tool_session``):
  regenerate, edit, versions and forgetting take its chain (calls, results, answer)
  whole; every call gets a result (a denial, a timeout, a Stop: an error result).

The snapshot (KV cache) of a conversation is written by the engine worker right
after each reply, on its own thread; deleting one goes through the worker too,
so it is always ordered after any write of the same conversation.

Its parts: ``ReplyRun`` (``app.chat.reply_run``) runs the reply in flight, with
``ToolRounds`` (``app.chat.tool_session``) for its tool rounds; ``TranscriptWriter``
(``app.chat.transcript_writer``) writes the transcript and keeps it within its size.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from app.chat import compaction
from app.chat.compact_run import CompactRun
from app.chat.compaction import DEFAULT_PROMPT
from app.chat.composer import offers_tools
from app.chat.conversation import Conversation, ConversationError, Message
from app.chat.doc_refs import read_names, read_paths
from app.chat.image_store import image_ref
from app.chat.project_chat import new_conversation
from app.chat.projects import Project
from app.chat.reply_run import ReplyRun
from app.chat.session_link import EngineLink, Kind, SessionView
from app.chat.store import ConversationStore
from app.chat.tool_round import Approvals, Decision, Post, chain_start
from app.chat.tool_session import SessionHooks
from app.chat.transcript_writer import TranscriptWriter
from app.chat.user_turn import edited_turn, merged_turn
from app.config.params import sampling_to_dict
from app.config.setting_records import SamplingParams
from app.documents.sources import Source
from app.engine.backend import ModelInfo
from app.engine.chat_message import ImagePart, ToolCall
from app.engine.metrics import MessageMetrics
from app.mcp.tool_host import ToolHost


class ChatSession:
    """Owns the open conversation; see the module docstring for the rules."""

    def __init__(
        self,
        store: ConversationStore,
        link: EngineLink,
        view: SessionView,
        system_prompt: str = "",
        *,
        tool_host: ToolHost | None = None,
        approvals: Approvals | None = None,
        post: Post | None = None,
    ) -> None:
        """``tool_host``: the MCP host whose enabled tools replies may call (None: no
        tools); ``approvals``: the "always allow" rules (None: every call asks);
        ``post``: runs a callable on this session's (GUI) thread, from any thread: tool
        lists and calls run on threads of their own and report back through it (None:
        called inline, for a session used from one thread only, as in tests)."""
        self.store = store
        self._link = link
        self._view = view
        self.system_prompt = system_prompt
        self.model: ModelInfo | None = None
        # The draft model loaded beside it ("" for none); a reply that drafts with it
        # records it in the conversation.
        self.draft_path = ""
        self.conversation = self._fresh()
        self.edit_index: int | None = None
        self._queue: deque[Callable[[], None]] = deque()
        self.on_idle: Callable[[], None] | None = None  # after a reply and queued actions ran
        # A project by id (its tools narrow what its chats are offered); set by the owner
        # of the projects (the window), else chats are in none.
        self.project_of: Callable[[str], Project | None] = lambda _id: None
        self._writer = TranscriptWriter(store, view)
        hooks = SessionHooks(
            conversation=lambda: self.conversation,
            persist=self._persist,
            result_room=self._writer.result_room,
            drain=self._drain,
            project=self._project,
        )
        self._reply = ReplyRun(link, view, store.images, hooks, tool_host, approvals, post)
        self._compact = CompactRun(
            link,
            view,
            lambda: self.conversation,
            self._persist,
            self._drain,
            self._reply.rounds.pictures,  # as the replies read them, notes and all
            self._reply.rounds.described,  # the tools the chat's cache was read with
        )

    # -- state ---------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self._reply.request is not None or self._compact.pending is not None

    @property
    def compaction_id(self) -> int | None:
        """The request of the compaction's summary being written, if any."""
        return self._compact.request_id

    def compact(self, params: SamplingParams, prompt: str = DEFAULT_PROMPT) -> str:
        """Summarise the older turns (``app.chat.compaction``); "" when it started, else
        why not. Not while a reply runs."""
        if self.busy:
            return "Wait for the reply to end first."
        self.edit_index = None
        n_ctx = self.model.n_ctx if self.model is not None else 0
        return self._compact.start(params, prompt, n_ctx)

    def undo_compaction(self) -> bool:
        """Show the chat as it was before its latest compaction, with its cache."""
        return not self.busy and self._compact.undo()

    def can_undo_compaction(self) -> bool:
        return not self.busy and compaction.compacted(self.conversation) is not None

    @property
    def unsaved(self) -> bool:
        """The last write failed; it is tried again at the next action."""
        return self._writer.unsaved

    @property
    def request_id(self) -> int | None:
        req = self._reply.request
        return req.id if req else None

    @property
    def reply_started(self) -> bool:
        req = self._reply.request
        return req is not None and req.started

    def reply_metrics(self) -> list[MessageMetrics]:
        """Per-reply metrics, derived from the messages (their only copy)."""
        return [m for m in (x.message_metrics() for x in self.conversation.messages) if m]

    def can_regenerate(self) -> bool:
        return not self.busy and any(m.role == "assistant" for m in self.conversation.messages)

    def _project(self) -> Project | None:
        project_id = self.conversation.project_id
        return self.project_of(project_id) if project_id else None

    def _fresh(self) -> Conversation:
        return Conversation(system_prompt=self.system_prompt)

    # -- commands ------------------------------------------------------------------------

    def when_idle(self, action: Callable[[], None]) -> bool:
        """Run ``action`` now, or once the running reply is stopped, recorded and saved.

        Actions run in the order they were asked for. Returns True if deferred.
        """
        if self.busy:
            self._queue.append(action)
            self.stop()
            return True
        action()
        return False

    def send(
        self,
        text: str,
        params: SamplingParams,
        images: Sequence[ImagePart] = (),
        sources: Sequence[Source] = (),
    ) -> bool:
        """Ask for a reply to ``text``, ``images`` (in ``store.images`` already) and
        ``sources`` (passages saved with it), replacing the edited message when editing
        (``user_turn.edited_turn``: it keeps its pictures and passages when none are
        given, and its whole documents always); an unanswered last message is merged
        with it (``user_turn.merged_turn``: the pictures and passages of both).

        False when nothing was sent: no text or image, a reply running, too many images
        or no room left in the transcript (a note says so); the caller keeps the text
        where the user typed it.
        """
        text = text.strip()
        refs = [image_ref(i) for i in images]
        found = [x.to_dict() for x in sources]
        if not (text or refs) or self.busy or not self.room_for(text, [*refs, *found]):
            return False
        msgs = self.conversation.messages
        if self.edit_index is not None and 0 <= self.edit_index < len(msgs):
            index = self.edit_index
            prompt = [*msgs[:index], edited_turn(msgs[index], text, refs, found)]
            self._start("edit", prompt, params, edit_index=index)
            return True
        self.edit_index = None
        if msgs and msgs[-1].role == "user":
            # A user turn with no reply (a failed reply, a crash mid-reply): merge, so
            # roles alternate for templates that require it.
            if not self._writer.images_fit(msgs[-1].images + refs):
                return False
            prompt = [*msgs[:-1], merged_turn(msgs[-1], text, refs, found)]
        else:
            prompt = [*msgs, Message("user", text, images=refs, sources=found)]
        before = list(msgs)
        self.conversation.messages = list(prompt)
        # The user's words are on disk before the worker can start on them: a crash
        # while the reply is read or written loses no message (docs/notes/crashes.md).
        self._start("send", prompt, params, before=before, persist=True)
        return True

    def room_for(self, text: str, images: Sequence[dict[str, Any]] = ()) -> bool:
        """Whether ``text`` with ``images`` and a reply of the largest size still fit in the
        transcript (``TranscriptWriter.room_for``); a note says so when not."""
        return self._writer.room_for(text, images)

    def answer_pending(self, params: SamplingParams) -> bool:
        """Reply to the conversation's last message, a user turn left with no reply (the app
        closed while it was being answered); nothing changes if the reply does not start."""
        msgs = self.conversation.messages
        if self.busy or not msgs or msgs[-1].role != "user" or not self.room_for(""):
            return False
        self.edit_index = None
        self._start("answer", list(msgs), params)
        return True

    def regenerate(self, params: SamplingParams) -> bool:
        """Ask for another last reply; the old one stays until the new one starts.

        After a user turn left with no reply, that turn is answered instead: regenerating
        the reply before it would drop the user's last message.
        """
        msgs = self.conversation.messages
        if msgs and msgs[-1].role == "user":
            return self.answer_pending(params)
        last = max((i for i, m in enumerate(msgs) if m.role == "assistant"), default=-1)
        if self.busy or last < 0 or not self.room_for(""):
            return False
        last = chain_start(msgs, last)  # a reply with tool rounds is replaced whole
        self._start("regenerate", list(msgs[:last]), params)
        return True

    def begin_edit(self, index: int) -> str | None:
        """Make user message ``index`` the edit point; returns its text."""
        msgs = self.conversation.messages
        if self.busy or not 0 <= index < len(msgs) or msgs[index].role != "user":
            return None
        self.edit_index = index
        return msgs[index].content

    def cancel_edit(self) -> None:
        self.edit_index = None

    def stop(self) -> None:
        """Stop the reply: the streaming round, or the calls between rounds (running ones
        are cancelled, unanswered ones marked "cancelled"; no further round), or the
        compaction's summary (nothing changes)."""
        if self._compact.pending is not None:
            self._link.stop()
            return
        self._reply.stop()

    def decide(self, call_id: str, decision: Decision, arguments: str | None = None) -> str:
        """The user's answer to call ``call_id`` in state "ask": "once", "always_tool" or
        "always_server" run it (an "always" is remembered), "deny" sends the model an
        error result. ``arguments``: the edited arguments (JSON object text) to run it
        with. Returns "" when done, else why nothing changed (e.g. "The arguments must
        be a JSON object.")."""
        return self._reply.rounds.decide(call_id, decision, arguments)

    def set_system_prompt(self, text: str, save: bool = True) -> bool:
        """The open conversation's system prompt, used from its next reply on.

        A reply already running keeps the prompt it was sent with. With ``save`` the
        conversation is written when it has messages (without, the next save, or the
        switch to another conversation, writes it). Returns True when the prompt changed.
        """
        conv = self.conversation
        changed = text != conv.system_prompt
        conv.system_prompt = text
        if save and conv.messages:
            self._persist()
        return changed

    def set_documents(self, paths: Sequence[str], collections: Sequence[str]) -> None:
        """The documents and collections the open chat's next messages draw on."""
        conv = self.conversation
        conv.documents, conv.collections = read_paths(list(paths)), read_names(list(collections))
        if conv.messages:
            self._persist()

    def set_default_system_prompt(self, text: str) -> None:
        """The system prompt new chats start with (the model's default, else the global one).

        An open chat with no messages whose prompt is still the old default takes it too.
        """
        old, self.system_prompt = self.system_prompt, text
        conv = self.conversation
        if not conv.messages and conv.system_prompt == old:
            conv.system_prompt = text

    def new_chat(self, project: Project | None = None) -> None:
        """Start an empty chat (in ``project``: from its instructions and documents,
        and its first reply from the project's opening, read once for all its chats)."""
        self.when_idle(lambda: self._new_chat(project))

    def open(self, conv_id: str, restore: bool = True) -> None:
        """Show a saved conversation and load its cache (after settling the current one)."""
        if conv_id == self.conversation.id and not self.busy:
            return
        self.when_idle(lambda: self._open(conv_id, restore))

    def fork(self, index: int) -> None:
        """Continue from message ``index`` in a new conversation; this one stays as it is."""
        self.when_idle(lambda: self._fork(index))

    def fork_saved(self, conv_id: str) -> None:
        """Fork a saved conversation at its last message and open the fork."""

        def fork() -> None:
            try:
                conv = self.store.load(conv_id)
                if not conv.messages:
                    return
                copy = self.store.fork(conv, len(conv.messages) - 1)
            except (ConversationError, OSError) as exc:
                self._view.notice(f"Could not fork the conversation: {exc}")
                return
            self._view.row_saved(copy.id)
            self._open(copy.id, True)

        self.when_idle(fork)

    def delete(self, conv_id: str) -> None:
        """Delete a conversation now; the open one is replaced by a new chat once settled."""
        try:
            self.store.delete_transcript(conv_id)
        except (ConversationError, OSError) as exc:
            self._view.notice(f"Could not delete the conversation: {exc}")
            return
        self._link.drop_snapshot(conv_id)
        self._writer.deleted(conv_id)
        self._view.row_removed(conv_id)
        if conv_id == self.conversation.id:
            self.when_idle(self._replace_deleted)

    def rename(self, conv_id: str, title: str) -> None:
        if conv_id == self.conversation.id:
            self.conversation.rename(title)
            if self.conversation.messages:
                self._persist()
            return
        try:
            self.store.rename(conv_id, title)
        except (ConversationError, OSError) as exc:
            self._view.notice(f"Could not rename the conversation: {exc}")
            return
        self._view.row_saved(conv_id)

    def save(self) -> bool:
        """Write the transcript now (on quit); True when it is on disk."""
        self._reply.keep_shown()
        return self._persist()

    # -- engine events -------------------------------------------------------------------

    def on_tokens(self, request: int, text: str, reasoning: bool = False) -> None:
        """A streamed piece of the reply; ``reasoning``: of its thinking, not its answer."""
        self._reply.on_tokens(request, text, reasoning)

    def on_finished(
        self,
        request: int,
        text: str,
        metrics: MessageMetrics,
        reasoning: str = "",
        tool_calls: Sequence[ToolCall] = (),
    ) -> None:
        """The reply ended: ``text`` its answer, ``reasoning`` its thinking, ``tool_calls``
        the calls it asked for (``Finished.tool_calls``): they are recorded with the
        reply, run or put to the user (``SessionView.tool_calls_changed``), and their
        results answered by the next round of the same reply."""
        if self._compact.owns(request):
            self._compact.on_finished(request, text, metrics)
            return
        self._reply.on_finished(request, text, metrics, reasoning, tool_calls)

    def on_cancelled(
        self, request: int, text: str, metrics: MessageMetrics, reasoning: str = ""
    ) -> None:
        """As ``on_finished``, for a reply the user stopped (it keeps what it had)."""
        if self._compact.owns(request):
            self._compact.on_ended(request, "")
            return
        self._reply.on_cancelled(request, text, metrics, reasoning)

    def on_failed(self, request: int, message: str) -> None:
        """The reply failed with ``message``: what was shown of it stays, the error beside it."""
        if self._compact.owns(request):
            self._compact.on_ended(request, message)
            return
        self._reply.on_failed(request, message)

    def switch_version(self, index: int, step: int) -> bool:
        """Show the previous (``step`` -1) or next (+1) version of message ``index`` and
        what follows it; the engine's cache keeps the shared prefix, so the next reply
        reads only what differs. Not while a reply runs."""
        conv = self.conversation
        position, count = conv.version_of(index)
        if self.busy or count < 2 or not conv.switch_version(index, position + step):
            return False
        self.edit_index = None
        self._persist()
        self._view.show_conversation(conv, opened=False, restoring=False)
        return True

    def reveal(self, message_id: str) -> int | None:
        """Show the version that holds ``message_id`` (a search hit in another version);
        its index. Not while a reply runs."""
        conv = self.conversation
        if self.busy:
            return None
        before = [m.id for m in conv.messages]
        index = conv.reveal(message_id)
        if index is not None and [m.id for m in conv.messages] != before:
            self.edit_index = None
            self._persist()
            self._view.show_conversation(conv, opened=False, restoring=False)
        return index

    # -- internals -----------------------------------------------------------------------

    def _start(
        self,
        kind: Kind,
        prompt: list[Message],
        params: SamplingParams,
        edit_index: int | None = None,
        before: list[Message] | None = None,
        persist: bool = False,
    ) -> None:
        conv = self.conversation
        conv.sampling = sampling_to_dict(params)
        conv.draft_path = self.draft_path if params.draft_model else ""
        if persist:
            self._persist()
        offer = offers_tools(self.model)
        self._reply.start(kind, prompt, params, edit_index, before, offer_tools=offer)
        self.edit_index = None
        self._view.reply_begun(prompt, added_user=kind == "send")

    def _drain(self) -> None:
        while self._queue and not self.busy:
            self._queue.popleft()()
        if not self.busy and self.on_idle is not None:
            self.on_idle()

    def _persist(self) -> bool:
        """Write the transcript if it has messages; False (and a note) when that failed."""
        return self._writer.write(self.conversation, self.model)

    def _settled(self) -> bool:
        """The open conversation is on disk (or has nothing to save); say so if not."""
        if self._persist():
            return True
        self._view.notice("Stayed on this conversation so that nothing is lost.")
        return False

    def _new_chat(self, project: Project | None = None) -> None:
        if self._settled():
            self._replace_deleted(project)

    def _replace_deleted(self, project: Project | None = None) -> None:
        """Start an empty conversation in place of the open one (already saved or deleted)."""
        self.conversation = new_conversation(project) if project is not None else self._fresh()
        self.edit_index = None
        self._link.reset()
        self._view.show_conversation(self.conversation, opened=False, restoring=False)

    def _open(self, conv_id: str, restore: bool) -> None:
        if not self._settled():
            return
        try:
            conv = self.store.load(conv_id)
        except ConversationError as exc:
            self._view.open_failed(str(exc))
            return
        self.conversation = conv
        self.edit_index = None
        restoring = restore and self.model is not None and bool(conv.messages)
        self._view.show_conversation(conv, opened=True, restoring=restoring)
        if restoring:
            self._link.restore_snapshot(conv.id)

    def _fork(self, index: int) -> None:
        conv = self.conversation
        if not conv.messages or not self._settled():
            return
        try:
            copy = self.store.fork(conv, index)
        except (ConversationError, OSError) as exc:
            self._view.notice(f"Could not fork the conversation: {exc}")
            return
        self._view.row_saved(copy.id)
        # No restore: the engine's cache holds the shared prefix already.
        self._open(copy.id, restore=False)
