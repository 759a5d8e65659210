"""``McpHost``: the MCP servers of ``mcp.json``, run on one event loop of their own.

The loop runs on a daemon thread owned by the host (started when first needed); each
server is a ``Connection`` task on it. Public methods may be called from any thread:
they post work to the loop and, for ``tools`` and ``call``, wait for it with a bound.
Lamplight's own switches live in ``mcp_state.json`` (``McpState``), so the user's
``mcp.json`` is only rewritten to move secrets into the keyring.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, TypeVar

from app.mcp.config import McpConfig, ServerConfig, load_config, move_secrets, resolved
from app.mcp.connection import Connection, Limits
from app.mcp.consent import consent_details
from app.mcp.results import qualify
from app.mcp.state import McpState
from app.mcp.tool_host import McpTool, ServerState, ServerStatus, ToolResult
from app.util.redact import redact_text

log = logging.getLogger(__name__)

T = TypeVar("T")
_POLL_S = 0.05


class McpHost:
    """Implements ``app.mcp.tool_host.ToolHost`` on the official ``mcp`` SDK."""

    def __init__(self, data_dir: Path, limits: Limits | None = None) -> None:
        self.config_path = data_dir / "mcp.json"
        self.limits = limits or Limits()
        self._state = McpState(data_dir / "mcp_state.json")
        self._cond = threading.Condition(threading.RLock())
        self._conns: dict[str, Connection] = {}
        self._tools: dict[str, McpTool] = {}  # by qualified name
        self._problems: list[str] = []
        self._subscribers: list[Callable[[], None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._read_config()

    # -- the ToolHost protocol -----------------------------------------------------

    def statuses(self) -> list[ServerStatus]:
        with self._cond:
            by_server: dict[str, list[McpTool]] = {}
            for tool in self._tools.values():
                by_server.setdefault(tool.server, []).append(tool)
            return [
                ServerStatus(
                    name=name,
                    transport=conn.config.transport,
                    command=conn.config.display(),
                    enabled=self._enabled(conn.config),
                    state=self._state_of(conn),
                    error=conn.error,
                    tools=tuple(by_server.get(name, ())),
                    server_id=conn.config.server_id(),
                    details=consent_details(conn.config),
                )
                for name, conn in self._conns.items()
            ]

    def tools(self, wait_s: float = 10.0) -> list[McpTool]:
        """The enabled tools of the enabled servers that are ready within ``wait_s``."""
        with self._cond:
            if self._closed:
                return []
            wanted = [c for c in self._conns.values() if self._state_of(c) == "idle"]
        deadline = time.monotonic() + wait_s
        if wanted:
            # Wait for the tasks to exist, so that "starting" below is what they report.
            with contextlib.suppress(concurrent.futures.TimeoutError):
                self._submit(self._start_all(wanted)).result(timeout=max(wait_s, 0.0))
        with self._cond:
            while not self._closed:
                pending = [c for c in self._conns.values() if self._state_of(c) == "starting"]
                left = deadline - time.monotonic()
                if not pending or left <= 0:
                    break
                self._cond.wait(min(left, 0.5))
            return [
                t
                for t in self._tools.values()
                if t.enabled and self._state_of(self._conns[t.server]) == "ready"
            ]

    def call(
        self,
        qualified: str,
        arguments: Mapping[str, Any],
        timeout_s: float,
        cancel: threading.Event | None = None,
        server_id: str | None = None,
    ) -> ToolResult:
        """Run a tool; a failure, timeout or cancel comes back as ``is_error``."""
        with self._cond:
            tool = self._tools.get(qualified)
            conn = self._conns.get(tool.server) if tool else None
            state = self._state_of(conn) if conn else "off"
        if self._closed:
            return ToolResult("The MCP host has been closed.", is_error=True)
        if tool is None or conn is None:
            return ToolResult(f"There is no tool named {qualified[:80]!r}.", is_error=True)
        if server_id is not None and conn.config.server_id() != server_id:
            # mcp.json changed since the call was offered or approved: not what was allowed.
            text = f"The server {tool.server} was changed in mcp.json; the call was not run."
            return ToolResult(text, is_error=True)
        if not tool.enabled:
            return ToolResult(f"The tool {tool.name} is switched off.", is_error=True)
        if state not in ("ready", "starting"):
            why = f": {conn.error}" if conn.error else ""
            return ToolResult(f"The server {tool.server} is not running{why}.", is_error=True)
        start = time.monotonic()
        future = self._submit(conn.call(tool.name, dict(arguments)))
        while True:
            done, _ = concurrent.futures.wait({future}, timeout=_POLL_S)
            if done:
                return _outcome(future, start)
            if cancel is not None and cancel.is_set():
                future.cancel()
                return ToolResult("Cancelled.", is_error=True, ms=_ms(start))
            if time.monotonic() - start >= timeout_s or self._closed:
                future.cancel()
                text = f"The tool did not answer within {timeout_s:g} s."
                return ToolResult(text, is_error=True, ms=_ms(start))

    def subscribe(self, fn: Callable[[], None]) -> None:
        with self._cond:
            self._subscribers.append(fn)

    # -- the settings page -----------------------------------------------------------

    def problems(self) -> list[str]:
        """Lines about ``mcp.json`` (and the MCP files) for the user."""
        with self._cond:
            return list(self._problems)

    def set_server_enabled(self, name: str, on: bool) -> None:
        """Switch a server on (it starts when next needed) or off (it stops now)."""
        with self._cond:
            conn = self._conns.get(name)
        self._state.set_enabled(name, on)
        if conn is not None and not on and self._loop is not None:
            self._submit(conn.stop("idle"))
        self._changed()

    def set_tool_enabled(self, server: str, tool: str, on: bool) -> None:
        self._state.set_tool_enabled(server, tool, on)
        self._requalify()

    def consent(self, name: str, server_id: str) -> None:
        """The user has read what server ``name`` runs or connects to (``server_id``:
        the configuration shown) and allows it; a server configured otherwise by now
        is not allowed (it asks again)."""
        with self._cond:
            conn = self._conns.get(name)
        if conn is not None and conn.config.server_id() == server_id:
            self._state.consent(name, server_id)
            self._changed()

    def restart(self, name: str) -> None:
        """Stop server ``name`` and start it again (its restart count starts over)."""
        with self._cond:
            conn = self._conns.get(name)
            state = self._state_of(conn) if conn else "off"
        if conn is None or state in ("off", "consent"):
            return
        self._submit(self._restart(conn))

    def reload(self) -> None:
        """Read ``mcp.json`` again; servers whose configuration changed restart."""
        old = dict(self._conns)
        self._read_config()
        stale = [c for n, c in old.items() if self._conns.get(n) is not c]
        restart = [
            self._conns[n]
            for n, c in old.items()
            if n in self._conns and self._conns[n] is not c and c.state != "idle"
        ]
        if self._loop is not None and (stale or restart):
            self._submit(self._swap(stale, restart))

    def close(self) -> None:
        """Stop every server and its process tree, then the loop; idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
            loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        conns = list(self._conns.values())
        future = asyncio.run_coroutine_threadsafe(_stop_all(conns), loop)
        try:
            future.result(timeout=15.0)
        except Exception:  # a server that would not stop must not keep the app open
            log.warning("MCP servers did not all stop in time", exc_info=True)
        # The SDK runs blocking work on the loop's default executor: end its threads too.
        done = asyncio.run_coroutine_threadsafe(loop.shutdown_default_executor(), loop)
        with contextlib.suppress(Exception):
            done.result(timeout=5.0)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5.0)

    # -- inside ------------------------------------------------------------------------

    def _read_config(self) -> None:
        notes = move_secrets(self.config_path)
        config = load_config(self.config_path)
        problems = [*config.problems, *notes, *_missing_secrets(config)]
        if self._state.note:
            problems.append(self._state.note)
        with self._cond:
            conns: dict[str, Connection] = {}
            for server in config.servers:
                old = self._conns.get(server.name)
                same = old is not None and old.config.identity() == server.identity()
                conns[server.name] = old if same and old else self._connection(server)
            self._conns = conns
            self._problems = problems
        self._requalify()

    def _connection(self, config: ServerConfig) -> Connection:
        return Connection(config, self.limits, self._on_connection_changed)

    def _enabled(self, config: ServerConfig) -> bool:
        return self._state.enabled(config.name, not config.disabled)

    def _state_of(self, conn: Connection) -> ServerState:
        if not self._enabled(conn.config):
            return "off"
        consented = self._state.consented(conn.config.name, conn.config.server_id())
        if not consented and not conn.running:
            return "consent"
        return conn.state

    def _on_connection_changed(self) -> None:
        self._requalify()

    def _requalify(self) -> None:
        """Recompute the tools' qualified names and switches, then tell subscribers."""
        with self._cond:
            lists = []
            for name, conn in self._conns.items():
                tools = [
                    McpTool(
                        t.server,
                        t.name,
                        t.qualified,
                        t.description,
                        t.input_schema,
                        self._state.tool_enabled(name, t.name),
                        conn.config.server_id(),
                    )
                    for t in conn.tools
                ]
                lists.append((name, tools))
            self._tools = {t.qualified: t for t in qualify(lists)}
            self._cond.notify_all()
        self._changed()

    def _changed(self) -> None:
        with self._cond:
            fns = list(self._subscribers)
            self._cond.notify_all()
            loop = self._loop
        for fn in fns:
            if loop is not None and loop.is_running() and not self._on_loop():
                loop.call_soon_threadsafe(_safely, fn)
            else:
                _safely(fn)

    def _on_loop(self) -> bool:
        return self._thread is threading.current_thread()

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._cond:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()
                thread = threading.Thread(
                    target=_run_loop, args=(loop, ready), name="mcp-host", daemon=True
                )
                thread.start()
                ready.wait(5.0)
                self._loop, self._thread = loop, thread
            return self._loop

    def _submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self._ensure_loop())

    async def _start_all(self, conns: list[Connection]) -> None:
        for conn in conns:
            with self._cond:
                startable = self._state_of(conn) == "idle" and not self._closed
            if startable:
                conn.start()

    async def _restart(self, conn: Connection) -> None:
        await conn.stop("idle")
        if not self._closed:
            conn.start()

    async def _swap(self, stale: list[Connection], restart: list[Connection]) -> None:
        await _stop_all(stale)
        for conn in restart:
            if not self._closed and self._state_of(conn) == "idle":
                conn.start()


def _run_loop(loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
    asyncio.set_event_loop(loop)
    loop.call_soon(ready.set)
    try:
        loop.run_forever()
    finally:
        loop.close()


async def _stop_all(conns: list[Connection]) -> None:
    await asyncio.gather(*(c.stop("idle") for c in conns), return_exceptions=True)


def _outcome(future: concurrent.futures.Future[ToolResult], start: float) -> ToolResult:
    try:
        return dataclasses.replace(future.result(), ms=_ms(start))
    except concurrent.futures.CancelledError:
        return ToolResult("Cancelled.", is_error=True, ms=_ms(start))
    except Exception as exc:  # the SDK raises what it likes; a call never raises
        log.warning("MCP call failed", exc_info=True)
        text = f"The call failed: {type(exc).__name__}: {redact_text(str(exc)[:300])}"
        return ToolResult(text, is_error=True, ms=_ms(start))


def _ms(start: float) -> float:
    return (time.monotonic() - start) * 1000


def _missing_secrets(config: McpConfig) -> list[str]:
    out = []
    for server in config.servers:
        _, missing = resolved(server.name, (*server.env, *server.headers))
        for key in missing:
            out.append(
                f"Server {server.name}: the secret {key} is not in the keyring; "
                "put its value in mcp.json again."
            )
    return out


def _safely(fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception:  # a subscriber's bug must not stop the host
        log.warning("an MCP status subscriber failed", exc_info=True)
