"""A fake MCP host for fast widget tests: the methods of ``app.mcp.host.McpHost`` the
settings page and the chat use, on plain data; it records what was asked of it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.mcp.tool_host import McpTool, ServerStatus, ToolResult


def tool(server: str, name: str, description: str = "", **props: str) -> McpTool:
    schema = {"type": "object", "properties": {k: {"type": v} for k, v in props.items()}}
    return McpTool(server, name, name, description, schema)


class FakeMcpHost:
    """Servers as given; consent makes a server ready; switches change the statuses."""

    def __init__(self, data_dir: Path, servers: list[ServerStatus] | None = None) -> None:
        self.config_path = data_dir / "mcp.json"
        self.servers = list(servers or [])
        self.asked: list[tuple[Any, ...]] = []
        self.problem_lines: list[str] = []
        self.closed = False
        self.tools_asked = 0
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
        self.asked.append(("call", qualified, dict(arguments)))
        return ToolResult(f"{qualified} ran")

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
