"""One turn of a conversation as a chat template sees it, and the tool calls in it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from app.engine.image_part import ImagePart

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
