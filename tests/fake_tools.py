"""A fake MCP host for the window's tool tests: one server ("calc") with one tool ("add").

It implements ``app.mcp.tool_host.ToolHost`` (mypy checks it through ``as_tool_host``).
``call`` records what it was asked, then answers ``result`` at once, or, with ``hold``
set, waits until ``release`` or the caller's ``cancel`` is set ("Cancelled.").
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from app.engine.chat_message import ToolCall
from app.mcp.tool_host import McpTool, ServerStatus, ToolHost, ToolResult

ADD = McpTool(
    server="calc",
    name="add",
    qualified="add",
    description="Adds two numbers.",
    input_schema={
        "type": "object",
        "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
        "required": ["a", "b"],
    },
    server_id="calc-server-id",
)
CALL = ToolCall("call_1", "add", '{"a": 2, "b": 3}')


class FakeToolHost:
    """A ready server "calc" with the tool "add" (see the module docstring)."""

    def __init__(self, result: str = "5", data_dir: Path | None = None) -> None:
        self.result = result
        self.is_error = False
        self.hold = False
        self.release = threading.Event()
        self.started = threading.Event()  # a call began
        self.listing: threading.Event | None = None  # set: ``tools`` waits for it
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.cancelled = 0
        self.tool_list = [ADD]
        self._subscribers: list[Callable[[], None]] = []
        self.config_path = (data_dir or Path(".")) / "mcp.json"

    def statuses(self) -> list[ServerStatus]:
        return [
            ServerStatus(
                "calc",
                "stdio",
                "calc-server",
                True,
                "ready",
                tools=tuple(self.tool_list),
                server_id=ADD.server_id,
            )
        ]

    def tools(self, wait_s: float = 10.0) -> list[McpTool]:
        if self.listing is not None:  # a server that takes its time to start
            self.listing.wait(wait_s)
        return [t for t in self.tool_list if t.enabled]

    def call(
        self,
        qualified: str,
        arguments: Mapping[str, Any],
        timeout_s: float,
        cancel: threading.Event | None = None,
        server_id: str | None = None,
    ) -> ToolResult:
        self.calls.append((qualified, dict(arguments)))
        self.started.set()
        if self.hold:
            cancel = cancel or threading.Event()
            while not self.release.wait(0.01):
                if cancel.is_set():
                    self.cancelled += 1
                    return ToolResult("Cancelled.", is_error=True)
        return ToolResult(self.result, is_error=self.is_error, ms=12.0)

    def subscribe(self, fn: Callable[[], None]) -> None:
        self._subscribers.append(fn)

    # What the settings page drives (``ui.tools.mcp_control.Host``): nothing to do here.
    def set_server_enabled(self, name: str, on: bool) -> None: ...
    def set_tool_enabled(self, server: str, tool: str, on: bool) -> None: ...
    def consent(self, name: str, server_id: str) -> None: ...
    def reload(self) -> None: ...
    def restart(self, name: str) -> None: ...
    def problems(self) -> list[str]:
        return []

    def close(self) -> None:
        self.release.set()


def as_tool_host(fake: FakeToolHost) -> ToolHost:
    return fake
