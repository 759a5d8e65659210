"""Conversations as data: messages with times, metrics and context offsets; JSON in and out."""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from app.engine.metrics import MessageMetrics
from app.engine.templates import ChatMessage
from app.util.errors import LamplightError

FORMAT_VERSION = 1
TITLE_CHARS = 60
ROLES = ("system", "user", "assistant")


class ConversationError(LamplightError):
    """A transcript that cannot be read; the message names the file and the problem."""


def new_id() -> str:
    return uuid.uuid4().hex


@dataclass
class Message:
    """One message. ``token_offset`` is where its turn starts in the model's context."""

    role: str
    content: str
    created: float = field(default_factory=time.time)
    id: str = field(default_factory=new_id)
    token_offset: int | None = None
    metrics: dict[str, Any] | None = None

    def chat(self) -> ChatMessage:
        return ChatMessage(self.role, self.content)  # type: ignore[arg-type]

    def message_metrics(self) -> MessageMetrics | None:
        return metrics_from_dict(self.metrics) if self.metrics else None


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
    messages: list[Message] = field(default_factory=list)

    def chat(self) -> list[ChatMessage]:
        """The messages as the engine takes them, system prompt first."""
        out = [m.chat() for m in self.messages]
        if self.system_prompt.strip():
            out.insert(0, ChatMessage("system", self.system_prompt))
        return out

    def rename(self, title: str) -> None:
        """A title the user chose (whitespace folded, at most 200 characters)."""
        self.title = " ".join(title.split())[:200] or self.title
        self.title_is_custom = True

    def auto_title(self) -> None:
        if self.title_is_custom:
            return
        first = next((m.content for m in self.messages if m.role == "user"), "")
        line = " ".join(first.split())
        self.title = (line[: TITLE_CHARS - 1] + "…") if len(line) > TITLE_CHARS else line
        if not self.title:
            self.title = "New chat"

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT_VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, data: Any, where: str = "conversation") -> Conversation:
        """Validate and build; raises ConversationError naming what is wrong."""
        if not isinstance(data, dict):
            raise ConversationError(f"{where}: not a JSON object")
        if data.get("format") != FORMAT_VERSION:
            raise ConversationError(f"{where}: unknown format {data.get('format')!r}")
        raw_messages = data.get("messages")
        if not isinstance(raw_messages, list):
            raise ConversationError(f"{where}: no message list")
        messages = []
        for i, m in enumerate(raw_messages):
            if not isinstance(m, dict) or m.get("role") not in ROLES:
                raise ConversationError(f"{where}: message {i + 1} has no valid role")
            if not isinstance(m.get("content"), str):
                raise ConversationError(f"{where}: message {i + 1} has no text")
            messages.append(Message(**_known(Message, m)))
        conv = cls(**_known(cls, {k: v for k, v in data.items() if k != "messages"}))
        conv.messages = messages
        if not isinstance(conv.id, str) or not conv.id.isalnum():
            raise ConversationError(f"{where}: bad id {conv.id!r}")
        return conv


_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "float": (int, float),
    "int": (int,),
    "bool": (bool,),
}


def _known(kind: type, data: dict[str, Any]) -> dict[str, Any]:
    """Fields of ``kind`` present in ``data`` with a plausible type (others keep defaults)."""
    out: dict[str, Any] = {}
    for f in fields(kind):
        if f.name not in data:
            continue
        value = data[f.name]
        type_name = str(f.type).split(" ")[0]
        allowed = _TYPES.get(type_name)
        if value is None and "None" in str(f.type):
            out[f.name] = None
        elif allowed is None:
            wanted = dict if type_name.startswith("dict") else list
            if isinstance(value, wanted):
                out[f.name] = value
        elif isinstance(value, allowed) and not (isinstance(value, bool) and bool not in allowed):
            out[f.name] = value
    return out


def metrics_to_dict(m: MessageMetrics) -> dict[str, Any]:
    return asdict(m)


def metrics_from_dict(data: dict[str, Any]) -> MessageMetrics:
    known = {f.name for f in fields(MessageMetrics)}
    kwargs = {k: v for k, v in data.items() if k in known}
    try:
        return MessageMetrics(**kwargs)
    except TypeError:
        return MessageMetrics()


def to_markdown(conv: Conversation) -> str:
    """The conversation as Markdown text (no metrics, no cache)."""
    lines = [f"# {conv.title or 'Conversation'}", ""]
    if conv.model_name:
        lines += [f"*Model: {conv.model_name}*", ""]
    if conv.system_prompt.strip():
        lines += ["**System**", "", conv.system_prompt.strip(), ""]
    names = {"user": "You", "assistant": "Assistant", "system": "System"}
    for m in conv.messages:
        lines += [f"**{names.get(m.role, m.role)}**", "", m.content.strip(), ""]
    return "\n".join(lines).rstrip() + "\n"
