"""A fake MCP host: the methods of ``app.mcp.host.McpHost`` that the settings page and the
chat use, on plain data. It implements ``app.mcp.tool_host.ToolHost`` (mypy checks it
through ``as_tool_host``) and records what was asked of it.

``statuses`` are the servers given; consent makes a server ready and the switches change
the statuses (each recorded in ``asked``). ``tools`` lists the enabled tools of the enabled,
ready servers, once ``listing`` is set. ``call`` records ``(qualified, arguments)`` in
``calls`` and sets ``started``; a tool in ``held`` then waits for ``release``, and one in
``hanging`` (a server that never answers) for the caller's timeout; a cancel ends either
("Cancelled."). The answer is the tool's entry in ``results``, else its arguments echoed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.engine.chat_message import ToolCall
from app.mcp.tool_host import McpTool, ServerStatus, ToolHost, ToolResult


def tool(server: str, name: str, description: str = "", **props: str) -> McpTool:
    schema = {"type": "object", "properties": {k: {"type": v} for k, v in props.items()}}
    return McpTool(server, name, name, description, schema)


def ready(name: str, *tools: McpTool, server_id: str = "") -> ServerStatus:
    """A started stdio server offering ``tools``."""
    return ServerStatus(
        name, "stdio", f"{name}-server", True, "ready", tools=tools, server_id=server_id
    )


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


class FakeMcpHost:
    """Servers as given, calls answered at once unless held (see the module docstring)."""

    def __init__(
        self,
        servers: Sequence[ServerStatus] = (),
        data_dir: Path = Path("."),
        results: Mapping[str, str] | None = None,
    ) -> None:
        self.config_path = data_dir / "mcp.json"
        self.servers = list(servers)
        self.results = dict(results or {})  # a tool's answer
        self.asked: list[tuple[Any, ...]] = []  # what the settings page asked for
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.problem_lines: list[str] = []
        self.tools_asked = 0
        self.held: set[str] = set()  # tools whose calls wait for ``release``
        self.hanging: set[str] = set()  # tools whose calls wait for their timeout
        self.release = threading.Event()
        self.listing = threading.Event()  # cleared: ``tools`` waits (servers starting)
        self.listing.set()
        self.started = threading.Event()  # a call began
        self.cancelled = 0  # held calls that ended cancelled
        self.closed = False
        self._subscribers: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def _notify(self) -> None:
        for fn in list(self._subscribers):
            fn()

    def _change(self, name: str, **changes: Any) -> None:
        with self._lock:
            self.servers = [replace(s, **changes) if s.name == name else s for s in self.servers]
        self._notify()

    def statuses(self) -> list[ServerStatus]:
        with self._lock:
            return list(self.servers)

    def tools(self, wait_s: float = 10.0) -> list[McpTool]:
        self.tools_asked += 1
        self.listing.wait(wait_s)
        return [
            t
            for s in self.statuses()
            if s.enabled and s.state == "ready"
            for t in s.tools
            if t.enabled
        ]

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
        cancel = cancel or threading.Event()
        if qualified in self.hanging:
            if cancel.wait(timeout_s):
                return ToolResult("Cancelled.", is_error=True)
            return ToolResult(f"Timed out after {timeout_s} s.", is_error=True)
        if qualified in self.held:
            while not self.release.wait(0.01):
                if cancel.is_set():
                    self.cancelled += 1
                    return ToolResult("Cancelled.", is_error=True)
        answer = self.results.get(qualified, f"{qualified}: {sorted(arguments.items())}")
        return ToolResult(answer, ms=12.0)

    def subscribe(self, fn: Callable[[], None]) -> None:
        self._subscribers.append(fn)

    def set_server_enabled(self, name: str, on: bool) -> None:
        self.asked.append(("server", name, on))
        self._change(name, enabled=on, state="idle" if on else "off")

    def set_tool_enabled(self, server: str, tool: str, on: bool) -> None:
        self.asked.append(("tool", server, tool, on))
        for s in self.statuses():
            if s.name == server:
                tools = tuple(replace(t, enabled=on) if t.name == tool else t for t in s.tools)
                self._change(server, tools=tools)

    def consent(self, name: str, server_id: str) -> None:
        self.asked.append(("consent", name, server_id))
        self._change(name, state="ready")

    def reload(self) -> None:
        self.asked.append(("reload",))
        self._notify()

    def restart(self, name: str) -> None:
        self.asked.append(("restart", name))

    def problems(self) -> list[str]:
        return list(self.problem_lines)

    def close(self) -> None:
        self.closed = True
        self.release.set()
        self.listing.set()


def calc_host(data_dir: Path = Path(".")) -> FakeMcpHost:
    """A ready server "calc" whose tool "add" answers "5"."""
    return FakeMcpHost([ready("calc", ADD, server_id=ADD.server_id)], data_dir, {"add": "5"})


def as_tool_host(fake: FakeMcpHost) -> ToolHost:
    """The fake where a ToolHost is wanted (mypy checks that it implements the protocol)."""
    return fake
