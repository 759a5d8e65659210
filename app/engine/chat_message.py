"""One turn of a conversation as a chat template sees it, and the tool calls in it."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True)
class ToolCall:
    """A call the model asked for: ``arguments`` is a JSON object as text (the OpenAI
    wire form); ``id`` is unique within the conversation."""

    id: str
    name: str
    arguments: str = "{}"

    def argument_object(self) -> dict[str, Any]:
        """The arguments as a dict ({} when they are not a JSON object): what a chat
        template renders, and what an MCP server is sent."""
        try:
            value = json.loads(self.arguments)
        except (ValueError, RecursionError):
            return {}
        return value if isinstance(value, dict) else {}

    def openai(self) -> dict[str, Any]:
        """The OpenAI wire form (``arguments`` as text)."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class ImagePart:
    """One attached image: the encoded file (PNG, JPEG, WebP, GIF or BMP, already
    checked by ``app.util.images.check_image``) and what identifies it. How it sits in
    prompt text: ``app.engine.image_part``."""

    digest: str  # sha256 of ``data``, hex
    data: bytes = field(repr=False, compare=False)
    mime: str = "image/png"
    width: int = 0
    height: int = 0
    name: str = ""  # the file's name when it was attached ("" when pasted)

    @classmethod
    def from_bytes(
        cls, data: bytes, mime: str, width: int = 0, height: int = 0, name: str = ""
    ) -> ImagePart:
        return cls(hashlib.sha256(data).hexdigest(), data, mime, width, height, name)


@dataclass(frozen=True)
class ChatMessage:
    """One turn of a conversation. ``reasoning``: an assistant turn's thinking, apart
    from its answer (``content``); the template decides whether history shows it.

    ``tool_calls``: the calls an assistant turn made. A ``tool`` turn is the result of
    the call ``tool_call_id`` (to the tool ``name``); its ``content`` is the result
    text the model reads.
    """

    role: Role
    content: str
    reasoning: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""
    name: str = ""
    images: tuple[ImagePart, ...] = ()


def _same(a: ChatMessage, b: ChatMessage) -> bool:
    if a.role != b.role or [i.digest for i in a.images] != [i.digest for i in b.images]:
        return False
    if a.role == "assistant":  # clients often trim the reply they send back
        return a.content.strip() == b.content.strip()
    return a.content == b.content


def is_prefix(head: Sequence[ChatMessage], messages: Sequence[ChatMessage]) -> bool:
    """``head`` is the start of ``messages`` (an assistant's text compared trimmed)."""
    return len(head) <= len(messages) and all(
        _same(a, b) for a, b in zip(head, messages, strict=False)
    )
