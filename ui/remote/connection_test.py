"""One "Test" of a connection, run off the GUI thread and cut short at once by ``cancel``.

``cancel`` must end a test at once, even one waiting on a server that accepted the
connection and never answers: closing an httpx client does not wake a thread blocked
reading its socket, but shutting the socket down does. The sockets are caught as they
connect through httpcore's ``trace`` extension, which a request hook adds to every
request of the test's client.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from typing import Any

from app.remote.connection import Connection
from app.remote.connection_store import Probe, probe
from app.remote.http import make_client
from app.util.errors import LamplightError

log = logging.getLogger(__name__)


class ConnectionTest:
    """Asks one server who it is (``run``, on a worker thread); ``cancel`` from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._client: Any = None
        self._sockets: list[socket.socket] = []
        self._closing = False

    def run(self, connection: Connection, api_key: str) -> Probe | None:
        """The server's answer, or None when cancelled before it started."""
        try:
            client = make_client(connection.url, api_key, connection.verify_tls)
        except LamplightError as exc:
            return Probe(False, str(exc))
        client.event_hooks = {"request": [self._traced], "response": []}
        with self._lock:
            if self._closing:
                client.close()
                return None
            self._client = client
        try:
            return probe(connection, api_key, client)
        finally:
            with self._lock:
                self._client = None
                self._sockets.clear()
            client.close()

    def _traced(self, request: Any) -> None:
        request.extensions["trace"] = self._on_trace

    def _on_trace(self, event: str, info: dict[str, Any]) -> None:
        if event != "connection.connect_tcp.complete":
            return
        stream = info.get("return_value")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if isinstance(sock, socket.socket):
            with self._lock:
                self._sockets.append(sock)
                closing = self._closing
            if closing:
                _shut(sock)

    def cancel(self) -> None:
        """Any thread: cut the test short, or keep it from starting."""
        with self._lock:
            self._closing = True
            client, sockets = self._client, list(self._sockets)
        for sock in sockets:
            _shut(sock)
        if client is not None:
            try:
                client.close()
            except Exception:  # closing under a running request may race its own cleanup
                log.debug("closing the test client raised", exc_info=True)


def _shut(sock: socket.socket) -> None:
    """Wake a thread blocked on ``sock`` (its owner closes it)."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
