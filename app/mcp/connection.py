"""One configured MCP server, kept connected by a task on the host's event loop.

``Connection.run`` starts the server (stdio or streamable HTTP), initializes an
``mcp.ClientSession``, lists the tools, and holds the session open until the server
breaks (exits, closes the connection, writes something that is not MCP) or is told
to stop; then restarts it with backoff (1 s, 2 s, 4 s … capped) up to
``max_restarts`` times in a row before giving up ("failed").

Everything here runs on the host's loop thread, except ``snapshot`` (any thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import httpx2
from mcp import ClientSession, types
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp.types import CONNECTION_CLOSED

from app.mcp.config import ServerConfig, resolved
from app.mcp.consent import server_environment
from app.mcp.http_transport import http_transport
from app.mcp.oversize import TOO_LARGE, oversize_result
from app.mcp.process import ProcessTree, StderrLog
from app.mcp.results import MAX_RESULT_CHARS, MAX_TOOLS, bounded_tools, tool_result
from app.mcp.stdio_transport import stdio_transport
from app.mcp.tool_host import McpTool, ServerState, ToolResult
from app.util.redact import redact_text

log = logging.getLogger(__name__)

CLIENT_INFO = types.Implementation(name="Lamplight", version="0.1.0")
STABLE_S = 10.0  # a server up this long has recovered: its restart count starts over
MAX_PAGES = 16


@dataclass(frozen=True)
class Limits:
    """How patient the host is with servers (tests make them short)."""

    start_timeout_s: float = 30.0
    backoff_s: float = 1.0
    backoff_cap_s: float = 30.0
    max_restarts: int = 5


class Broken(Exception):
    """The server broke the connection; the message says how, for the user."""


class Connection:
    """A server's task, session, state and tools."""

    def __init__(self, config: ServerConfig, limits: Limits, changed: Callable[[], None]) -> None:
        self.config = config
        self.limits = limits
        self._changed = changed
        self.state: ServerState = "idle"
        self.error = ""
        self.tools: list[McpTool] = []  # as listed (``qualified`` is set by the host)
        self.session: ClientSession | None = None
        self.stderr: StderrLog | None = None
        self._task: asyncio.Task[None] | None = None
        self._broken = asyncio.Event()
        self._why = ""
        self._stop = False
        self._wake = asyncio.Event()

    @property
    def stopping(self) -> bool:
        """Told to stop (read through a property: it changes under an ``await``)."""
        return self._stop

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start the server's task unless it runs already (on the loop thread)."""
        if self.running:
            return
        self._stop = False
        self._set("starting", "")
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self, state: ServerState = "idle") -> None:
        """End the session and the server's process tree; then ``state``."""
        self._stop = True
        self._broken.set()
        self._wake.set()
        task = self._task
        if task is not None and not task.done():
            done, _ = await asyncio.wait({task}, timeout=8.0)
            if not done:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await asyncio.wait({task}, timeout=2.0)
        if self.stderr is not None:
            await asyncio.to_thread(self.stderr.join, 2.0)
        self._set(state, "")

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Run a tool; the caller bounds the wait (and cancels this task)."""
        start = time.monotonic()
        # A server that just broke still says "ready" until its task notices: wait for
        # the next life rather than call the dead one.
        while self.state != "ready" or self._broken.is_set():
            if self.state == "failed" or self._stop:
                return ToolResult(f"The server {self.config.name} is not running.", True)
            await asyncio.sleep(0.05)
        session = self.session
        if session is None:
            return ToolResult(f"The server {self.config.name} is not running.", is_error=True)
        try:
            result = await session.call_tool(name, arguments)
        except MCPError as exc:
            if exc.error.code == TOO_LARGE:  # read within the bound, cut (oversize.py)
                found = oversize_result(exc.error.data, MAX_RESULT_CHARS)
                return dataclasses.replace(found, ms=(time.monotonic() - start) * 1000)
            if self._broken.is_set() or exc.error.code == CONNECTION_CLOSED:
                return ToolResult(await self._stopped_text(), is_error=True)
            why = redact_text(exc.error.message[:500])  # the SDK's may name a redirect's URL
            return ToolResult(f"The server refused the call: {why}", True)
        ms = (time.monotonic() - start) * 1000
        return tool_result(result, ms)

    async def _stopped_text(self) -> str:
        # The closed stdout can be seen before the stderr thread has read the last lines
        # the server wrote as it died; its pipe ends with the process, so wait that long.
        if self.stderr is not None:
            await asyncio.to_thread(self.stderr.join, 1.0)
        why = self._why or "it stopped"
        tail = self._tail()
        return f"The server {self.config.name} failed during the call: {why}.{tail}"

    def _tail(self) -> str:
        lines = self.stderr.tail(3) if self.stderr else []
        return redact_text(" Its last words: " + " | ".join(lines)) if lines else ""

    def _set(self, state: ServerState, error: str) -> None:
        self.state, self.error = state, error
        self._changed()

    async def _run(self) -> None:
        failures = 0
        while not self._stop:
            started = time.monotonic()
            self._broken = asyncio.Event()
            self._why = ""
            try:
                await self._attempt()
                why = self._why or "it stopped"
            except Exception as exc:
                why = describe(exc)
            finally:
                self.session = None
            if self.stopping:
                return
            if self.stderr is not None:  # its last lines, before they are shown
                await asyncio.to_thread(self.stderr.join, 1.0)
            if self.state == "ready" and time.monotonic() - started > STABLE_S:
                failures = 0
            failures += 1
            if failures > self.limits.max_restarts or _hopeless(why):
                self._set("failed", f"{why}{self._tail()}")
                return
            delay = min(self.limits.backoff_s * 2 ** (failures - 1), self.limits.backoff_cap_s)
            self._set("starting", f"{why}; restarting in {delay:g} s{self._tail()}")
            self._wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)

    async def _attempt(self) -> None:
        """One life of the server: start, initialize, list, hold until broken."""
        broken = self._broken
        async with self._transport() as (read, write):
            send, receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._pump, read, send)
                tg.start_soon(_cancel_when, broken, tg.cancel_scope)
                async with ClientSession(receive, write, client_info=CLIENT_INFO) as session:
                    with anyio.fail_after(self.limits.start_timeout_s):
                        await session.initialize()
                        listed = await _list_tools(session)
                    self.tools, notes = bounded_tools(self.config.name, listed)
                    self.session = session
                    self._set("ready", "; ".join(notes))
                    await broken.wait()
                tg.cancel_scope.cancel()

    async def _pump(self, read: Any, send: Any) -> None:
        """Pass the transport's messages on; what is not MCP, or the end, breaks."""
        async with send:
            async for item in read:
                if isinstance(item, Exception):
                    self._break(f"it sent something that is not MCP ({describe(item)})")
                    return
                await send.send(item)
        self._break("it closed the connection" if self.config.transport == "http" else "it exited")

    def _break(self, why: str) -> None:
        if not self._broken.is_set():
            self._why = why
            self._broken.set()

    @asynccontextmanager
    async def _transport(self) -> AsyncIterator[tuple[Any, Any]]:
        if self.config.transport == "http":
            headers, _ = resolved(self.config.name, self.config.headers)
            async with http_transport(self.config.url, headers) as streams:
                yield streams
            return
        env, _ = resolved(self.config.name, self.config.env)
        tree = ProcessTree()
        self.stderr = StderrLog()
        params = StdioServerParameters(
            command=self.config.command,
            args=list(self.config.args),
            env=server_environment(env, tree.env()),  # not Lamplight's: least privilege
            cwd=self.config.cwd or None,
            encoding_error_handler="replace",
        )
        try:
            async with stdio_transport(params, self.stderr.writer) as streams:
                self.stderr.spawned()
                tree.find()
                try:
                    yield streams
                finally:
                    tree.remember()
        finally:
            self.stderr.spawned()
            await asyncio.to_thread(tree.kill)


async def _cancel_when(event: asyncio.Event, scope: anyio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


async def _list_tools(session: ClientSession) -> list[types.Tool]:
    tools: list[types.Tool] = []
    cursor: str | None = None
    for _ in range(MAX_PAGES):
        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await session.list_tools(params=params)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if not cursor or len(tools) > MAX_TOOLS:
            break
    return tools


def describe(exc: BaseException) -> str:
    """A short sentence for what went wrong (exception groups unwrapped), without the
    secrets a URL in it may carry (it is shown, logged and may reach a transcript)."""
    return redact_text(_describe(exc))


def _describe(exc: BaseException) -> str:
    inner = getattr(exc, "exceptions", None)  # an exception group (3.10: anyio's backport)
    while isinstance(inner, tuple) and inner and isinstance(inner[0], BaseException):
        exc = inner[0]
        inner = getattr(exc, "exceptions", None)
    if isinstance(exc, TimeoutError):
        return "it did not answer in time"
    if isinstance(exc, FileNotFoundError):
        return f"the command was not found ({exc.filename or exc})"
    if isinstance(exc, PermissionError):
        return f"the command may not be run ({exc.filename or exc})"
    if isinstance(exc, MCPError):
        return exc.error.message[:300]
    if isinstance(exc, httpx2.HTTPError):
        return f"{type(exc).__name__}: {str(exc)[:300]}"
    text = str(exc).splitlines()[0][:300] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _hopeless(why: str) -> bool:
    # Retrying a command that does not exist only delays the message.
    return why.startswith(("the command was not found", "the command may not be run"))
