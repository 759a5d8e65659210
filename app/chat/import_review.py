"""What an imported conversation may not use until the user says so.

A chat file from someone else can name things on this computer: documents (any path:
``~/.config/gh/hosts.yml`` would be read and sent with the next message, to a remote
server too), collections (the user's own named sets of files), a draft model file, and
settings that let the model call the user's MCP tools. An import keeps them apart
(``hold_back``): the conversation opens without them, and they come back only when the
user confirms a list of them (``restore``). Its pictures need no review: a reference is
a digest into the image store, never a path (``app.chat.image_store``); its messages'
passages are copies of text, already in the file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.chat.conversation import Conversation

# The sampling settings that decide whether a reply may call tools (``SamplingParams``).
TOOL_KEYS = ("tools", "tool_rounds", "tool_timeout_s", "tool_result_chars")


@dataclass(frozen=True)
class HeldBack:
    """What ``hold_back`` took out of an imported conversation."""

    documents: tuple[str, ...] = ()
    collections: tuple[str, ...] = ()
    draft_path: str = ""
    # The imported tool settings (``TOOL_KEYS`` it had; absent keys mean the defaults,
    # which offer tools): the conversation has tools "off" until they are restored.
    tools: dict[str, Any] | None = field(default=None, compare=False)

    def __bool__(self) -> bool:
        return bool(self.documents or self.collections or self.draft_path) or (
            self.tools is not None
        )

    def lines(self) -> list[str]:
        """What the confirmation lists, one item a line."""
        out = [f"Document: {p}" for p in self.documents]
        out += [f"Collection of yours: {name}" for name in self.collections]
        if self.draft_path:
            out.append(f"Draft model file: {self.draft_path}")
        if self.tools is not None:
            mode = self.tools.get("tools", "auto")
            out.append(f"Tools: replies may call your MCP servers' tools ({mode})")
        return out


def hold_back(conv: Conversation) -> HeldBack:
    """Take out of ``conv`` (just imported) what reaches outside it; what was taken."""
    tools: dict[str, Any] | None = None
    sampling = conv.sampling
    if sampling is not None and sampling.get("tools") != "off":
        tools = {k: sampling[k] for k in TOOL_KEYS if k in sampling}
        conv.sampling = {**sampling, "tools": "off"}
    held = HeldBack(tuple(conv.documents), tuple(conv.collections), conv.draft_path, tools)
    conv.documents, conv.collections, conv.draft_path = [], [], ""
    return held


def restore(conv: Conversation, held: HeldBack) -> None:
    """Give ``conv`` back what ``hold_back`` took (the user confirmed it)."""
    conv.documents = [*conv.documents, *(p for p in held.documents if p not in conv.documents)]
    conv.collections = [
        *conv.collections,
        *(c for c in held.collections if c not in conv.collections),
    ]
    conv.draft_path = held.draft_path or conv.draft_path
    if held.tools is not None and conv.sampling is not None:
        rest = {k: v for k, v in conv.sampling.items() if k not in TOOL_KEYS}
        conv.sampling = {**rest, **held.tools}
