"""The window's MCP host: made when first needed, shared with the chat, closed at quit.

Importing the SDK takes about a second, so nothing is imported before the window shows:
``start`` makes the host in the background (``run_in_background``) when an ``mcp.json``
exists, and the first use (the settings page, or the chat asking for tools) makes it
otherwise. ``HostProxy`` is the ``ToolHost`` the chat gets at once; it forwards to the
host once there is one.

Signals (``McpControl``, on the GUI thread):
    changed(): a server's status changed, or the host appeared.
    consentNeeded(object): the chat asked for tools while these ``ServerStatus`` wait for
        the user's OK (to run their command, or to connect to their address).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from PySide6.QtCore import QObject, Qt, Signal

from app.mcp.approvals import ApprovalStore
from app.mcp.tool_host import McpTool, ServerStatus, ToolHost, ToolResult
from ui.common.background import Job, run_in_background

log = logging.getLogger(__name__)

CONFIG_NAME = "mcp.json"
APPROVALS_NAME = "mcp_approvals.json"


class Host(ToolHost, Protocol):
    """The MCP host as the page drives it (``app.mcp.host.McpHost``): the chat's
    ``ToolHost``, and the page's switches."""

    config_path: Path

    def set_server_enabled(self, name: str, on: bool) -> None: ...
    def set_tool_enabled(self, server: str, tool: str, on: bool) -> None: ...
    def consent(self, name: str, server_id: str) -> None: ...
    def reload(self) -> None: ...
    def restart(self, name: str) -> None: ...
    def problems(self) -> list[str]: ...
    def close(self) -> None: ...


def real_host(data_dir: Path) -> Host:
    """``app.mcp.host.McpHost`` on ``data_dir`` (imports the SDK)."""
    from app.mcp.host import McpHost

    return McpHost(data_dir)


# Tests replace it with a fake; called with the data folder, on any thread.
HOST_FACTORY: Callable[[Path], Host] = real_host


class HostProxy:
    """A ``ToolHost`` that makes the real host on first need and forwards to it.

    Thread-safe: the chat calls ``tools``/``call`` on its own thread, the page on the GUI
    thread. A host that cannot be made (the SDK missing, a broken install) leaves
    ``unavailable`` saying why; tools are then simply absent.
    """

    def __init__(self, data_dir: Path, on_consent: Callable[[list[ServerStatus]], None]) -> None:
        self.config_path = data_dir / CONFIG_NAME
        self._data_dir = data_dir
        self._on_consent = on_consent
        self._lock = threading.Lock()
        self._host: Host | None = None
        self._closed = False
        self._subscribers: list[Callable[[], None]] = []
        self.unavailable = ""

    @property
    def host(self) -> Host | None:
        """The real host, if made."""
        return self._host

    def ensure(self) -> Host | None:
        """The real host, made now if need be (None when it cannot be, or after close)."""
        with self._lock:
            if self._host is not None or self._closed or self.unavailable:
                return self._host
            try:
                made = HOST_FACTORY(self._data_dir)
            except Exception as exc:  # an ImportError, a broken install: no tools, no crash
                log.warning("MCP host unavailable", exc_info=True)
                self.unavailable = f"{type(exc).__name__}: {exc}"[:500]
            else:
                for fn in self._subscribers:
                    made.subscribe(fn)
                self._host = made
            host = self._host
        for fn in list(self._subscribers):  # the host appeared, or will not
            fn()
        return host

    def _needed(self) -> Host | None:
        # No config, no servers: the chat's question is answered without the SDK.
        if self._host is None and not self.config_path.exists():
            return None
        return self.ensure()

    def statuses(self) -> list[ServerStatus]:
        host = self._host
        return host.statuses() if host is not None else []

    def tools(self, wait_s: float = 10.0) -> list[McpTool]:
        start = time.monotonic()
        host = self._needed()
        if host is None:
            return []
        found = host.tools(max(0.0, wait_s - (time.monotonic() - start)))
        waiting = [s for s in host.statuses() if s.enabled and s.state == "consent"]
        if waiting:
            self._on_consent(waiting)
        return found

    def call(
        self,
        qualified: str,
        arguments: Mapping[str, Any],
        timeout_s: float,
        cancel: threading.Event | None = None,
        server_id: str | None = None,
    ) -> ToolResult:
        host = self._needed()
        if host is None:
            return ToolResult(f"No tool host to run {qualified!r}.", is_error=True)
        return host.call(qualified, arguments, timeout_s, cancel, server_id)

    def subscribe(self, fn: Callable[[], None]) -> None:
        with self._lock:
            self._subscribers.append(fn)
            host = self._host
        if host is not None:
            host.subscribe(fn)

    def close(self) -> None:
        """End the servers (their process trees too); no host is made after this."""
        with self._lock:
            self._closed = True
            host, self._host = self._host, None
        if host is not None:
            host.close()


class McpControl(QObject):
    """Owns the window's ``HostProxy`` and ``ApprovalStore``; see the module docstring."""

    changed = Signal()
    consentNeeded = Signal(object)
    _posted = Signal(object)

    def __init__(self, data_dir: Path, parent: QObject | None = None) -> None:
        super().__init__(parent)
        # Queued even on the GUI thread: a posted function never runs inside its caller.
        self._posted.connect(self._run, Qt.ConnectionType.QueuedConnection)
        self.proxy = HostProxy(data_dir, lambda s: self.post(lambda: self._consent(s)))
        self.proxy.subscribe(lambda: self.post(self.changed.emit))
        self.approvals = ApprovalStore(data_dir / APPROVALS_NAME)
        self._noticed: set[tuple[str, str]] = set()  # (name, server_id): an edit asks anew
        self._starter: Job | None = None

    def post(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the GUI thread, soon (safe from any thread)."""
        self._posted.emit(fn)

    def _run(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception:  # a posted function's failure must not end the event loop
            log.exception("posted function failed")

    def start(self) -> None:
        """After the window shows: make the host off the GUI thread if a config exists
        (so its problems show early); else wait for the first need."""
        if self._starter is None and self.proxy.config_path.exists():
            self._starter = run_in_background(self.proxy.ensure)

    def host(self) -> Host | None:
        """The host, made now if need be (on the GUI thread: the page is opening)."""
        return self.proxy.ensure()

    def _consent(self, waiting: list[ServerStatus]) -> None:
        new = [s for s in waiting if (s.name, s.server_id) not in self._noticed]
        self._noticed.update((s.name, s.server_id) for s in new)
        if new:
            self.consentNeeded.emit(new)

    def close(self) -> None:
        """At quit: the servers end with the app."""
        if self._starter is not None:
            self._starter.wait(timeout=10)
        self.proxy.close()
