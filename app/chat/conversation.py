"""Conversations as data: messages with times, metrics and context offsets; JSON in and out."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, TypeGuard

from app.chat.doc_refs import read_names, read_paths, read_sources
from app.chat.image_store import read_image_refs
from app.chat.metrics_record import metrics_from_dict, metrics_to_dict
from app.chat.stored_fields import PATH_MAX as PATH_MAX  # re-exported: callers check against it
from app.chat.stored_fields import is_count, is_int, is_number, read_path, read_text, read_time
from app.chat.tool_records import (
    CLOSED_TEXT,
    cut_result,
    read_calls,
    read_result_fields,
)
from app.config.field_spec import short_repr
from app.documents.sources import sources_from_list, with_sources
from app.engine.chat_message import ChatMessage, ImagePart, ToolCall
from app.engine.metrics import MessageMetrics
from app.util.errors import LamplightError

# 2: ``alternatives`` (earlier versions kept by regenerate and edit). An assistant
# message may also carry ``reasoning`` (its thinking; absent when empty): not a new
# format, since readers ignore fields they do not know. An older Lamplight shows such a
# file's answers, and a save it makes of that conversation drops the thinking. Tool
# calls (``tool_calls`` on an assistant message) and their results (``tool`` messages)
# are likewise absent when there are none (see ``app.chat.tool_records``); a file with
# them is refused by an older Lamplight (it knows no ``tool`` role), which is right.
# A user message's pictures (``images``, references into ``app.chat.image_store``) are
# absent when there are none; an older Lamplight shows such a message without them.
# ``project_id`` likewise (absent for a chat in no project; an older one ignores it).
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
MAX_BRANCHES = 100_000  # the file's size limit bounds them first
TITLE_CHARS = 60  # an automatic title
TITLE_MAX = 200  # a title the user chose, or a stored one
_TITLE_WORD = re.compile(rf"\S{{1,{TITLE_CHARS + 1}}}")  # a longer word ends the title
NAME_MAX = 1000
ID_CHARS = 128
ROLES = ("system", "user", "assistant", "tool")
# Message fields written only when set, so a file without them is as it always was.
KEPT_WHEN_SET = (
    "reasoning",
    "tool_calls",
    "tool_call_id",
    "name",
    "is_error",
    "images",
    "sources",
    "summarised",
    "summary_of",
)
# What the model reads of a compaction's summary, after the system prompt.
SUMMARY_HEADING = "Summary of the earlier conversation:"
Images = Callable[["Message"], "list[ImagePart]"]  # a message's pictures, read


class ConversationError(LamplightError):
    """A transcript that cannot be read; the message names the file and the problem.

    ``damaged``: the file's content is unusable (setting it aside loses nothing);
    False for a file that may be fine but cannot be used now (unreadable, too
    large, written by a newer version).
    """

    def __init__(self, message: str, damaged: bool = False) -> None:
        super().__init__(message)
        self.damaged = damaged


def new_id() -> str:
    return uuid.uuid4().hex


@dataclass
class Message:
    """One message. ``token_offset`` is where its turn starts in the model's context;
    ``reasoning``: an assistant reply's thinking, apart from its answer (``content``);
    ``tool_calls``: the calls an assistant reply asked for (``app.chat.tool_records``).
    A ``tool`` message is the result of call ``tool_call_id`` to tool ``name``: its
    full text (``content``; the model reads at most ``tool_result_chars`` of it).
    ``images``: a user turn's pictures, references into the ``ImageStore``
    (``app.chat.image_store``); the text may be empty when there are some."""

    role: str
    content: str
    created: float = field(default_factory=time.time)
    id: str = field(default_factory=new_id)
    token_offset: int | None = None
    metrics: dict[str, Any] | None = None
    forgotten: bool = False  # dropped from the model's memory when the context was full
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    tool_call_id: str = ""
    name: str = ""
    is_error: bool = False
    images: list[dict[str, Any]] = field(default_factory=list)
    # A user turn's passages from documents (``app.documents.sources.Source.to_dict``):
    # copies, so the turn reads the same when reopened, whatever became of the files.
    sources: list[dict[str, Any]] = field(default_factory=list)
    # Compaction (``app.chat.compaction``): ``summarised``, its text is in a later summary
    # (shown, not sent); ``summary_of``, this assistant message is a summary, and the id
    # of the first message of the tail it replaced (the version that Undo brings back).
    summarised: bool = False
    summary_of: str = ""

    def chat(self, result_chars: int = 16_000, images: Images | None = None) -> ChatMessage:
        """The turn as a template sees it (a result cut to ``result_chars``, noted);
        ``images`` reads its pictures (none are sent without it); passages come first."""
        if self.role == "user" and (self.sources or (self.images and images is not None)):
            pics = tuple(images(self)) if self.images and images is not None else ()
            text = with_sources(self.content, sources_from_list(self.sources))
            return ChatMessage("user", text, images=pics)
        if self.role == "tool":
            text = cut_result(self.content, result_chars)
            return ChatMessage("tool", text, tool_call_id=self.tool_call_id, name=self.name)
        calls = tuple(ToolCall(c["id"], c["name"], c["arguments"]) for c in self.tool_calls)
        return ChatMessage(self.role, self.content, self.reasoning, tool_calls=calls)  # type: ignore[arg-type]

    def message_metrics(self) -> MessageMetrics | None:
        return metrics_from_dict(self.metrics) if self.metrics else None


@dataclass
class Branch:
    """A version of the conversation's tail that is not shown now.

    It follows the message with id ``after`` ("" for the start of the conversation),
    where the active path (or another branch) goes on differently: a reply replaced by
    regenerate, or an edited message and everything that came after it.
    """

    after: str
    messages: list[Message]


@dataclass
class Conversation:
    """A saved chat: its transcript and what it ran on."""

    id: str = field(default_factory=new_id)
    title: str = ""
    title_is_custom: bool = False
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    model_name: str = ""
    model_path: str = ""
    system_prompt: str = ""
    forked_from: str | None = None
    n_tokens: int = 0
    sampling: dict[str, Any] | None = None  # the settings its last reply used
    # The draft model its last reply drafted with ("" for none): chosen again on open. A
    # draft changes only how fast a reply comes, so it is never a reason to refuse the
    # conversation's saved cache (see ``app.chat.snapshot``).
    draft_path: str = ""
    messages: list[Message] = field(default_factory=list)
    # Other versions of the conversation from some message on (see ``Branch``); the active
    # path is ``messages``. Flat, so a file's nesting depth does not grow with edits.
    alternatives: list[Branch] = field(default_factory=list)
    # Documents attached to the chat (absolute paths) and named collections: each new
    # message is given passages from them (``app.documents.library``).
    documents: list[str] = field(default_factory=list)
    collections: list[str] = field(default_factory=list)
    # The project it belongs to (``app.chat.projects``; "" for none). Only a link: a
    # project that is gone leaves the chat as it was, shown with no project.
    project_id: str = ""

    def chat(self, result_chars: int = 16_000, images: Images | None = None) -> list[ChatMessage]:
        """The messages the model sees, system prompt first (not the forgotten ones);
        tool results cut to ``result_chars``; ``images`` reads a message's pictures."""
        return [m.chat(result_chars, images) if m else self.system_message() for m in self.sent()]

    def sent(self) -> list[Message | None]:
        """The messages ``chat`` sends, with None for the system prompt (which holds the
        summary of a compacted chat: a summary is no turn of its own)."""
        head: list[Message | None] = [None] if self.system_text().strip() else []
        return head + [m for m in self.messages if is_turn(m)]

    def system_message(self) -> ChatMessage:
        return ChatMessage("system", self.system_text())

    def system_text(self) -> str:
        """The system prompt, then the summary of the compacted turns, if any."""
        summary = self.active_summary()
        if summary is None:
            return self.system_prompt
        head = f"{self.system_prompt.rstrip()}\n\n" if self.system_prompt.strip() else ""
        return f"{head}{SUMMARY_HEADING}\n{summary.content.strip()}"

    def active_summary(self) -> Message | None:
        """The summary the model reads now: the last one on the shown path, not itself
        summarised again."""
        return next((m for m in reversed(self.messages) if m.summary_of and not m.summarised), None)

    def rename(self, title: str) -> None:
        """A title the user chose (whitespace folded, at most 200 characters)."""
        self.title = " ".join(title.split())[:TITLE_MAX] or self.title
        self.title_is_custom = True

    def auto_title(self) -> None:
        if self.title_is_custom:
            return
        first = next((m.content or _names(m) for m in self.messages if m.role == "user"), "")
        line = ""  # its words, one space apart: only as many as a title needs (25 MB: 1.1 s)
        for word in _TITLE_WORD.finditer(first):
            line = f"{line} {word.group()}" if line else word.group()
            if len(line) > TITLE_CHARS:
                break
        self.title = (line[: TITLE_CHARS - 1] + "…") if len(line) > TITLE_CHARS else line
        if not self.title:
            self.title = "New chat"

    # -- versions ----------------------------------------------------------------------

    def _point(self, index: int) -> str:
        """The id the versions of message ``index`` follow ("" for the first message)."""
        return self.messages[index - 1].id if index > 0 else ""

    def versions(self, index: int) -> list[list[Message]]:
        """Every version of the tail from message ``index`` on, oldest first (the active
        one among them); one entry when there are no alternatives."""
        if not 0 <= index < len(self.messages):
            return []
        point = self._point(index)
        tails = [b.messages for b in self.alternatives if b.after == point and b.messages]
        tails.append(self.messages[index:])
        return sorted(tails, key=lambda t: t[0].created)

    def version_of(self, index: int) -> tuple[int, int]:
        """(position, count) of message ``index``'s version, 1-based: "2/3"."""
        if not 0 <= index < len(self.messages):
            return (0, 0)
        point = self._point(index)
        if not any(b.after == point and b.messages for b in self.alternatives):
            return (1, 1)  # the common case, without sorting
        tails = self.versions(index)
        active = self.messages[index]
        return (next(i for i, t in enumerate(tails) if t[0] is active) + 1, len(tails))

    def keep_replaced(self, index: int, replaced: list[Message]) -> None:
        """Keep ``replaced`` (the tail from message ``index`` that a new version replaces)
        as an alternative. Call before ``messages`` changes."""
        if replaced:
            self.alternatives.append(Branch(self._point(index), list(replaced)))

    def switch_version(self, index: int, position: int) -> bool:
        """Show version ``position`` (1-based) of the tail from message ``index`` on;
        the one shown now is kept as an alternative. False when there is no such one."""
        tails = self.versions(index)
        if not 1 <= position <= len(tails):
            return False
        chosen = tails[position - 1]
        if chosen[0] is self.messages[index]:
            return False
        point = self._point(index)
        branch = next(b for b in self.alternatives if b.messages is chosen)
        self.alternatives.remove(branch)
        self.alternatives.append(Branch(point, self.messages[index:]))
        self.messages = self.messages[:index] + chosen
        return True

    def reveal(self, message_id: str) -> int | None:
        """Switch versions so that message ``message_id`` is shown; its index, or None."""
        for _ in range(len(self.alternatives) + 1):  # each step puts one branch on the path
            shown = {m.id: i for i, m in enumerate(self.messages)}
            if message_id in shown:
                return shown[message_id]
            holder = self._holder(message_id)
            # Climb to the branch that starts on the shown path (bounded: a damaged file
            # could link branches in a circle).
            for _ in range(len(self.alternatives)):
                if holder is None or holder.after == "" or holder.after in shown:
                    break
                holder = self._holder(holder.after)
            if holder is None or not (holder.after == "" or holder.after in shown):
                return None
            index = 0 if holder.after == "" else shown[holder.after] + 1
            if index == len(self.messages):  # the shown path ends where the branch starts
                self.alternatives.remove(holder)
                self.messages = self.messages + holder.messages
                continue
            tails = self.versions(index)
            self.switch_version(index, [id(t) for t in tails].index(id(holder.messages)) + 1)
        return None

    def _holder(self, message_id: str) -> Branch | None:
        return next(
            (b for b in self.alternatives if any(m.id == message_id for m in b.messages)), None
        )

    def every_message(self) -> list[Message]:
        """The shown messages, then those of every alternative (for search and export)."""
        return [*self.messages, *(m for b in self.alternatives for m in b.messages)]

    def prefix_alternatives(self, upto: int) -> list[Branch]:
        """The alternatives that belong to messages ``0..upto`` (what a fork keeps):
        versions of those messages, and whatever branches inside those versions."""
        ids = {m.id for m in self.messages[:upto]} | {""}
        kept: list[Branch] = []
        pending = list(self.alternatives)
        grew = True
        while grew:
            grew = False
            for b in list(pending):
                if b.after in ids:
                    kept.append(b)
                    pending.remove(b)
                    ids |= {m.id for m in b.messages}
                    grew = True
        return kept

    def to_dict(self) -> dict[str, Any]:
        data = {"format": FORMAT_VERSION, **asdict(self)}
        # No thinking, no field: a file without reasoning is as it always was.
        for m in [*data["messages"], *(m for b in data["alternatives"] for m in b["messages"])]:
            for key in KEPT_WHEN_SET:
                if not m[key]:
                    del m[key]
        for key in ("documents", "collections", "project_id"):
            if not data[key]:
                del data[key]
        return data

    @classmethod
    def from_dict(
        cls, data: Any, where: str = "conversation", fallback_time: float | None = None
    ) -> Conversation:
        """Validate and build; raises ConversationError naming what is wrong.

        Structure that makes no sense (not an object, no message list, a message
        without a role or text, a bad id) is refused as ``damaged``; fields that
        are only odd are repaired: a time that is not a finite date between 1970
        and 9999 becomes ``fallback_time`` (the file's time, say), other wrong
        types their defaults, titles and names are cut to length, metrics keep
        only their valid fields. Lone surrogates are gone already (``parse_json``).
        """
        if not isinstance(data, dict):
            raise ConversationError(f"{where}: not a JSON object", damaged=True)
        version = data.get("format")
        if version not in READABLE_VERSIONS or isinstance(version, bool):
            newer = is_int(version) and version > FORMAT_VERSION
            raise ConversationError(
                f"{where}: unknown format {short_repr(version)}"
                + (" (saved by a newer Lamplight)" if newer else ""),
                damaged=not newer,
            )
        raw_messages = data.get("messages")
        if not isinstance(raw_messages, list):
            raise ConversationError(f"{where}: no message list", damaged=True)
        created = read_time(
            data.get("created"), time.time() if fallback_time is None else fallback_time
        )
        messages = settle_calls(
            [_message(m, i, where, created) for i, m in enumerate(raw_messages)]
        )
        alternatives = _branches(data.get("alternatives"), where, created)
        _unique_ids(messages, alternatives)
        conv_id = data.get("id")
        if not is_valid_id(conv_id):
            raise ConversationError(f"{where}: bad id {short_repr(conv_id)}", damaged=True)
        forked = data.get("forked_from")
        project = data.get("project_id")
        sampling = data.get("sampling")
        n_tokens = data.get("n_tokens")
        return cls(
            id=conv_id,
            title=read_text(data.get("title"), TITLE_MAX),
            title_is_custom=data.get("title_is_custom") is True,
            created=created,
            updated=read_time(data.get("updated"), created),
            model_name=read_text(data.get("model_name"), NAME_MAX),
            model_path=read_text(data.get("model_path"), PATH_MAX),
            system_prompt=read_text(data.get("system_prompt"), None),
            forked_from=forked if is_valid_id(forked) else None,
            n_tokens=n_tokens if is_count(n_tokens) else 0,
            sampling=sampling if _is_flat(sampling) else None,
            draft_path=read_path(data.get("draft_path")),
            messages=messages,
            alternatives=alternatives,
            documents=read_paths(data.get("documents")),
            collections=read_names(data.get("collections")),
            project_id=project if is_valid_id(project) else "",
        )


def _branches(raw: Any, where: str, created: float) -> list[Branch]:
    """Stored alternatives; a branch point that is not an id is read as the start (the
    text stays reachable), an empty branch is dropped (it holds nothing)."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ConversationError(f"{where}: the alternatives are not a list", damaged=True)
    if len(raw) > MAX_BRANCHES:
        raise ConversationError(f"{where}: more than {MAX_BRANCHES} alternatives", damaged=True)
    out = []
    for n, b in enumerate(raw):
        if not isinstance(b, dict) or not isinstance(b.get("messages"), list):
            raise ConversationError(f"{where}: alternative {n + 1} has no messages", damaged=True)
        msgs = [
            _message(m, i, f"{where}: alternative {n + 1}", created)
            for i, m in enumerate(b["messages"])
        ]
        msgs = settle_calls(msgs)
        after = b.get("after")
        if msgs:
            out.append(Branch(after if is_valid_id(after) else "", msgs))
    return out


def _unique_ids(messages: list[Message], alternatives: list[Branch]) -> None:
    """Give a repeated message id a new one: versions are found by id."""
    seen: set[str] = set()
    for m in [*messages, *(m for b in alternatives for m in b.messages)]:
        if m.id in seen:
            m.id = new_id()
        seen.add(m.id)


def _message(m: Any, i: int, where: str, created: float) -> Message:
    if not isinstance(m, dict) or m.get("role") not in ROLES:
        raise ConversationError(f"{where}: message {i + 1} has no valid role", damaged=True)
    if not isinstance(m.get("content"), str):
        raise ConversationError(f"{where}: message {i + 1} has no text", damaged=True)
    mid = m.get("id")
    summary_of = m.get("summary_of")
    offset = m.get("token_offset")
    metrics = m.get("metrics")
    reasoning = m.get("reasoning")
    role = m["role"]
    call_id, name, is_error = read_result_fields(m) if role == "tool" else ("", "", False)
    return Message(
        role=m["role"],
        content=m["content"],
        created=read_time(m.get("created"), created),
        id=mid if is_valid_id(mid) else new_id(),
        token_offset=offset if is_count(offset) else None,
        metrics=metrics_to_dict(metrics_from_dict(metrics)) if isinstance(metrics, dict) else None,
        forgotten=m.get("forgotten") is True,
        # Only a reply thinks: thinking on another role would reach the template as such.
        reasoning=reasoning if isinstance(reasoning, str) and m["role"] == "assistant" else "",
        tool_calls=read_calls(m.get("tool_calls")) if role == "assistant" else [],
        tool_call_id=call_id,
        name=name,
        is_error=is_error,
        # Only a user turn shows pictures (as the OpenAI format and templates have it).
        images=read_image_refs(m.get("images")) if role == "user" else [],
        sources=read_sources(m.get("sources")) if role == "user" else [],
        summarised=m.get("summarised") is True,
        summary_of=summary_of if is_valid_id(summary_of) and role == "assistant" else "",
    )


def is_turn(m: Message) -> bool:
    """Whether the model reads ``m`` as a turn: not forgotten, not summarised, not a
    summary (read in the system turn)."""
    return not (m.forgotten or m.summarised or m.summary_of)


def settle_calls(messages: list[Message]) -> list[Message]:
    """``messages`` with a result after every call: a call the app closed on (no
    result) gets a "cancelled" one, so that the model never sees a call unanswered."""
    out: list[Message] = []
    i = 0
    while i < len(messages):
        m = messages[i]
        out.append(m)
        i += 1
        if m.role != "assistant" or not m.tool_calls:
            continue
        answered: set[str] = set()
        while i < len(messages) and messages[i].role == "tool":
            answered.add(messages[i].tool_call_id)
            out.append(messages[i])
            i += 1
        for c in m.tool_calls:
            if c["id"] not in answered:
                c["state"] = "cancelled" if c["state"] in ("ask", "running") else c["state"]
                out.append(_closed(m, c))
    return out


def _closed(m: Message, call: dict[str, Any]) -> Message:
    return Message(
        "tool", CLOSED_TEXT, m.created, tool_call_id=call["id"], name=call["name"], is_error=True
    )


def is_valid_id(value: object) -> TypeGuard[str]:
    """A conversation or message id: 1 to 128 ASCII letters and digits (a file name part)."""
    return (
        isinstance(value, str)
        and 0 < len(value) <= ID_CHARS
        and value.isascii()
        and value.isalnum()
    )


def _is_flat(value: Any) -> bool:
    """A settings object: finite scalars and lists of them (``validate_sampling`` decides)."""
    if not isinstance(value, dict):
        return False

    def scalar(v: object) -> bool:
        return v is None or isinstance(v, str | bool) or is_int(v) or is_number(v)

    return all(
        scalar(v) or (isinstance(v, list) and all(scalar(x) for x in v)) for v in value.values()
    )


def _names(m: Message) -> str:
    return " ".join(r["name"] for r in m.images if r["name"])
