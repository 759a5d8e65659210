"""``ApiServer``: uvicorn on its own thread (``lamplight-api``) over an ``EngineGateway``.

The socket is bound on the caller's thread, so a busy port is an ``OSError`` the UI
can show (not uvicorn's ``sys.exit`` on its thread); then uvicorn serves it with
the h11 protocol on an asyncio loop, without lifespan, signal handlers (none are
installed off the main thread), access log or server header. Request bodies are parsed
on one more thread (``lamplight-api-parse``), never on the event loop. ``stop()`` ends
every job, asks uvicorn to exit, and joins both threads (forcing uvicorn after 5 s).
``url`` names the address the socket is bound to (``localhost`` binds 127.0.0.1).

Starlette and uvicorn are imported here only inside ``start()``: importing this
module (the GUI does, at start-up) loads neither.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from app.api.config import ApiConfig, ApiConfigError
from app.api.gateway import EngineGateway
from app.api.requests import ApiRequests
from app.config.api_settings import LOCALHOST_NAMES

if TYPE_CHECKING:
    import uvicorn

    from app.api.embeddings import EmbedService

__all__ = ["THREAD_NAME", "ApiServer", "bind"]

log = logging.getLogger(__name__)

THREAD_NAME = "lamplight-api"
PARSER_THREAD = "lamplight-api-parse"
START_SECONDS = 5.0
JOIN_SECONDS = 5.0


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: a free one).

    Raises:
        OSError: the address is in use, not local, or cannot be resolved.
    """
    host = host.strip("[]")
    if host.lower() in LOCALHOST_NAMES:
        host = "127.0.0.1"
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        if sys.platform == "win32":  # pragma: no cover - Windows only
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_EXCLUSIVEADDRUSE, 1)  # type: ignore[attr-defined]
        else:  # a port in TIME_WAIT may be reused; one in use is still refused
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class ApiServer:
    """The OpenAI-compatible server for one gateway; ``start`` / ``stop`` from any thread
    (the GUI's, usually)."""

    def __init__(
        self, gateway: EngineGateway, config: ApiConfig, embedder: EmbedService | None = None
    ) -> None:
        self.gateway = gateway
        self.config = config
        self.embedder = embedder  # answers /v1/embeddings; the caller owns (and closes) it
        self.requests = ApiRequests(gateway, config.max_queue)  # its requests on the line
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None
        self._parser: ThreadPoolExecutor | None = None
        self._address: tuple[str, int] = (config.host, config.port)
        self._lock = threading.Lock()

    @property
    def address(self) -> tuple[str, int]:
        """The address and port the socket is bound to (``localhost`` binds, and so
        reads, ``127.0.0.1``; the real port after ``port=0``)."""
        return self._address

    @property
    def url(self) -> str:
        """The base URL clients use: ``http://127.0.0.1:1234/v1``, with the address
        bound (a name such as ``localhost`` may resolve to another, ``::1`` first)."""
        host, port = self._address
        if host in ("0.0.0.0", ""):
            host = "127.0.0.1"
        elif host == "::":
            host = "::1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{port}/v1"

    @property
    def running(self) -> bool:
        thread, server = self._thread, self._server
        return bool(thread and thread.is_alive() and server and server.started)

    def start(self) -> None:
        """Bind and start serving; returns once it accepts requests.

        Raises:
            ApiConfigError: ``config.problem()``.
            OSError: the port is busy (or the address is not this computer's), or the
                server did not start within 5 s.
        """
        problem = self.config.problem()
        if problem:
            raise ApiConfigError(problem)
        with self._lock:
            if self._thread is not None:
                return
            import uvicorn

            from app.api.http_errors import H11
            from app.api.server import build_app

            sock = bind(self.config.host, self.config.port)
            bound = sock.getsockname()
            port = int(bound[1])
            self._address = (str(bound[0]), port)
            parser = ThreadPoolExecutor(1, thread_name_prefix=PARSER_THREAD)
            parser.submit(int)  # its thread starts now: it lives exactly as long as the server
            app = build_app(
                self.gateway, self.requests, self.config, self.url, parser, self.embedder
            )
            config = uvicorn.Config(
                app,
                http=H11,
                loop="asyncio",
                lifespan="off",
                ws="none",
                interface="asgi3",
                log_config=None,
                access_log=False,
                server_header=False,
                proxy_headers=False,
                timeout_keep_alive=5,
                timeout_graceful_shutdown=3,
                limit_concurrency=256,  # connections; requests are limited to 64 inside
                h11_max_incomplete_event_size=64 * 1024,
            )
            server = uvicorn.Server(config)
            thread = threading.Thread(
                target=self._serve, args=(server, sock), name=THREAD_NAME, daemon=True
            )
            self._server, self._thread, self._socket = server, thread, sock
            self._parser = parser
            thread.start()
        deadline = time.monotonic() + START_SECONDS
        while not server.started and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        if not server.started:
            self.stop()
            raise OSError(f"The API server did not start on {self.config.host}:{port}.")
        log.info("API server listening on %s", self.url)

    def _serve(self, server: uvicorn.Server, sock: socket.socket) -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as exc:  # SystemExit from uvicorn included: log, end the thread
            log.error("API server stopped with an error", exc_info=exc)
        finally:
            sock.close()

    def stop(self) -> None:
        """Stop every job and the server; joins its thread (idempotent)."""
        self.requests.cancel_all()
        with self._lock:
            server, thread, sock = self._server, self._thread, self._socket
            parser = self._parser
            self._server = self._thread = self._socket = self._parser = None
        if server is not None and thread is not None:
            server.should_exit = True
            thread.join(JOIN_SECONDS)
            if thread.is_alive():
                log.warning("API server did not stop in %.0f s; forcing it", JOIN_SECONDS)
                server.force_exit = True
                thread.join(JOIN_SECONDS)
        if sock is not None:
            sock.close()
        if parser is not None:  # a parse under way ends (bounded: see schema.MAX_JSON_ITEMS)
            parser.shutdown(wait=True, cancel_futures=True)
