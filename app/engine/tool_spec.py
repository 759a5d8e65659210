"""What a request offers the model as tools, and how it may use them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

AUTO = "auto"  # the model decides
NONE = "none"  # no calls: the tools are still described (the prefix stays cached)
REQUIRED = "required"  # at least one call, to any tool
CHOICES = (AUTO, NONE, REQUIRED)  # or a tool's name: exactly that tool

# A reply that ended because it asked for calls (``MessageMetrics.stop_reason``).
TOOL_CALLS = "tool_calls"


@dataclass(frozen=True)
class ToolSpec:
    """A function the model may call: ``parameters`` is its JSON schema (an object)."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )

    def openai(self) -> dict[str, Any]:
        """The OpenAI ``tools`` entry (what chat templates read as ``tools``)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }


@dataclass(frozen=True)
class ToolRequest:
    """The tools of one request. ``choice``: ``auto``, ``none``, ``required`` or the
    name of one of ``tools`` (that call is forced). ``parallel``: several calls in one
    turn are allowed."""

    tools: tuple[ToolSpec, ...]
    choice: str = AUTO
    parallel: bool = True

    def named(self) -> ToolSpec | None:
        """The tool ``choice`` names, or None."""
        return next((t for t in self.tools if t.name == self.choice), None)

    @property
    def active(self) -> bool:
        """Whether the model may call anything in this request."""
        return bool(self.tools) and self.choice != NONE
