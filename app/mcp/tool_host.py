"""What the chat needs from the MCP host (``ToolHost``), and what it reports.

The host (``app.mcp.host.McpHost``) runs the servers on a thread of its own; every
method here may be called from any thread and returns promptly, except ``call``
and ``tools``, which block the calling (non-GUI) thread for at most their timeout.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from app.engine.tool_spec import ToolSpec

# off: switched off by the user; idle: not started yet (servers start when first
# needed); consent: a server the user has not yet allowed as configured now (a stdio
# command to run, an HTTP address to connect to); starting / ready; failed: gave up
# (``error`` says why; restarts with backoff first).
ServerState = Literal["off", "idle", "consent", "starting", "ready", "failed"]


@dataclass(frozen=True)
class McpTool:
    """A tool of a server. ``name`` is the server's; ``qualified`` the name the model
    is offered (unique across servers: ``name``, or ``server__name`` on a clash);
    ``server_id`` the server's configuration (``ServerConfig.server_id``) it came from:
    approvals name it, and a call runs only on that configuration."""

    server: str
    name: str
    qualified: str
    description: str = ""
    input_schema: Mapping[str, Any] = field(default_factory=dict)
    enabled: bool = True
    server_id: str = ""

    def spec(self) -> ToolSpec:
        schema = dict(self.input_schema) or {"type": "object", "properties": {}}
        return ToolSpec(self.qualified, self.description, schema)


@dataclass(frozen=True)
class ServerStatus:
    """A configured server as the settings page shows it. ``command``: what runs (a
    stdio server's command line, with ``cwd``), or the URL of an HTTP one; ``details``:
    what it is given (``app.mcp.consent.consent_details``); ``server_id``: the
    configuration these describe, which a consent names."""

    name: str
    transport: Literal["stdio", "http"]
    command: str
    enabled: bool
    state: ServerState
    error: str = ""
    tools: tuple[McpTool, ...] = ()
    server_id: str = ""
    details: tuple[str, ...] = ()


@dataclass(frozen=True)
class ToolResult:
    """What a call gave back: ``text`` for the model and the transcript (the full
    text; the chat shortens it for the model), ``is_error`` when the tool failed,
    was denied, timed out or was cancelled (``text`` says which)."""

    text: str
    is_error: bool = False
    structured: Any = None
    ms: float = 0.0


class ToolHost(Protocol):
    """The MCP host as the chat and the settings page use it."""

    def statuses(self) -> list[ServerStatus]:
        """Every configured server, in the config's order."""

    def tools(self, wait_s: float = 10.0) -> list[McpTool]:
        """The enabled tools of enabled servers; starts the servers not yet started and
        waits up to ``wait_s`` for them (a server not ready by then is left out)."""

    def call(
        self,
        qualified: str,
        arguments: Mapping[str, Any],
        timeout_s: float,
        cancel: threading.Event | None = None,
        server_id: str | None = None,
    ) -> ToolResult:
        """Run a tool; never raises for a tool's failure (``is_error``). Setting
        ``cancel`` ends the wait promptly (the server is told to cancel). With
        ``server_id``, the call runs only if the tool's server is still configured
        so (what the user approved); otherwise it comes back as an error."""

    def subscribe(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` (on the host's thread) whenever a status changes."""
