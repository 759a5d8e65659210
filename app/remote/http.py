"""HTTP to an inference server: JSON calls and event streams, every wait bounded.

Everything a server sends is untrusted: bodies are read up to a size limit and
parsed with a depth limit, and each streamed event is bounded (httpx2's
``EventSource``). Whatever goes wrong in the HTTP stack (a body that claims gzip
and is not, a wrong content type, a redirect, a damaged stream) becomes one of
two errors with a sentence a user can act on: ``ServerUnreachable`` (nothing
answered, the connection dropped, no answer in time) or ``ServerError`` (the
server answered, with an error or with something this app cannot read).

Waits (``Limits``): a JSON call has a deadline for its whole answer, not only
per read, which a server trickling bytes would never trip. A stream ends when
``stop`` is set, when the server sends no event for ``silence_s``, or at the
reply's deadline (``Budget``); the backend then ends the reply with the text so
far. The stream is read on a helper thread; its socket is caught as it connects
(httpcore's ``trace`` extension) so that ``close`` can shut it down, which wakes
the reader at once even while the server says nothing (closing the response
would wait for the read to time out). Streams go over a connection of their own
(``make_client(keep_alive=False)``): a kept-alive one would be reused without
connecting, and a server silent before its headers could not be cut.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from app.engine.backend import reply_byte_cap
from app.engine.metrics import MessageMetrics
from app.remote.connection import Connection
from app.util.datafiles import DataFileError, parse_json
from app.util.errors import LamplightError

log = logging.getLogger(__name__)

MAX_BODY = 16 << 20  # a /v1/models list or /props with a long template
TOO_LARGE = "answer_too_large"  # ServerError.kind of an answer over MAX_BODY
MAX_EVENT = 1 << 20  # one streamed event (a token, progress, final timings)
JSON_DEPTH = 12
POLL_S = 0.05
CONNECT_S = 5.0
READ_S = 600.0  # a silent stream: prompt evaluation of a long chat on a slow server
TOKEN_SLACK = 16  # tokens a server may send beyond the limit asked for before it is cut off
QUEUE_EVENTS = 256  # events read ahead of the consumer
STOP_JOIN_S = 2.0  # close() waits this long for the reader (only a connect in progress is slower)
_SOCKET_EVENTS = ("connection.connect_tcp.complete", "connection.start_tls.complete")


@dataclass(frozen=True)
class Limits:
    """How long a server may take; tests pass small ones."""

    call_s: float = 30.0  # one JSON request, its whole answer
    silence_s: float = READ_S  # a stream with no event (a long prompt evaluation)
    start_s: float = 600.0  # a reply may take this long for its prompt ...
    per_token_s: float = 2.0  # ... plus this per token asked for (half a token a second)
    ready_s: float = 600.0  # llama-server loading its model (/health answers 503)

    def budget(self, max_tokens: int) -> Budget:
        """The bounds of a reply of up to ``max_tokens`` tokens, starting now."""
        seconds = self.start_s + self.per_token_s * max(1, max_tokens)
        return Budget(
            time.monotonic() + seconds, seconds, self.silence_s, reply_byte_cap(max_tokens)
        )


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class Budget:
    """How much a reply may take: it ends at ``deadline`` (``time.monotonic``), ``seconds``
    after it began, after ``silence_s`` without an event, or at ``max_bytes`` of text."""

    deadline: float
    seconds: float
    silence_s: float
    max_bytes: int


class ServerUnreachable(LamplightError):
    """The server could not be reached, or the connection dropped."""


class ServerSilent(ServerUnreachable):
    """A stream ran out of time (silence, or the reply's deadline) before any text."""


class ServerError(LamplightError):
    """The server answered with an error status."""

    def __init__(self, status: int, message: str, kind: str = "", body: Any = None) -> None:
        self.status = status
        self.kind = kind
        self.body = body if isinstance(body, dict) else {}
        super().__init__(message)


def check_url(url: str) -> str:
    """``url`` without a trailing slash, if it is an http(s) URL with a host.

    Raises:
        LamplightError: the URL cannot be used; the message says why.
    """
    url = url.strip()
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # an unclosed IPv6 bracket, say
        raise LamplightError(f"The server address cannot be read ({exc}).") from None
    if parts.scheme not in ("http", "https"):
        raise LamplightError(f"The server address must start with http:// or https:// ({url!r}).")
    if not parts.hostname:
        raise LamplightError(f"The server address has no host name ({url!r}).")
    if parts.query or parts.fragment:
        raise LamplightError("The server address cannot have a query (?…) or fragment (#…).")
    try:
        parts.port  # noqa: B018  # raises on a port out of range
    except ValueError as exc:
        raise LamplightError(f"The server address has a bad port ({exc}).") from None
    return url.rstrip("/")


def where(url: str) -> str:
    """Host and port, for messages."""
    return urlsplit(url).netloc or url


@contextlib.contextmanager
def client_for(existing: Any, connection: Connection, api_key: str) -> Iterator[Any]:
    """``existing``, or a client made for this call and closed after it."""
    client = existing or make_client(connection.url, api_key, connection.verify_tls)
    try:
        yield client
    finally:
        if client is not existing:
            client.close()


def cannot_connect(connection: Connection, exc: LamplightError) -> str:
    """The load error for a server that could not be reached or refused."""
    return f"Could not connect to {connection.name}: {exc}"


def end_early(metrics: MessageMetrics, reason: str, why: str) -> None:
    """End a reply before its end (``reason``): its text is kept, and a note says why."""
    metrics.stop_reason = reason
    metrics.notes.append(f"{why} The reply is incomplete; the text so far is kept")


def end_lost(metrics: MessageMetrics, why: str) -> None:
    """End a reply the connection cut off: its text is kept, and a note says why."""
    end_early(metrics, "connection_lost", why)


def too_large(max_bytes: int) -> str:
    """Why a reply was cut at its size limit."""
    size = f"{max_bytes >> 20} MB" if max_bytes >= 1 << 20 else f"{max_bytes >> 10} KB"
    return (
        f"The server sent more text than a reply of this length may hold ({size}), more "
        "than the tokens asked for could make."
    )


def sentence(text: str) -> str:
    """``text`` ending with a full stop (or another end mark)."""
    text = text.rstrip()
    return text if text.endswith((".", "!", "?")) else text + "."


def unfinished(url: str) -> str:
    """Why a reply ended when the stream closed without its final event."""
    return f"The server at {where(url)} ended the reply without finishing it."


def make_client(
    url: str, api_key: str = "", verify_tls: bool = True, keep_alive: bool = True
) -> Any:
    """An ``httpx2.Client`` for ``url``. TLS certificates are checked unless told not to.

    ``keep_alive`` False opens a connection per request (for ``EventStream``).
    """
    import httpx2

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx2.Client(
        base_url=check_url(url),
        headers=headers,
        verify=verify_tls,
        timeout=httpx2.Timeout(READ_S, connect=CONNECT_S),
        limits=httpx2.Limits(max_keepalive_connections=None if keep_alive else 0),
        follow_redirects=False,
        trust_env=False,  # a proxy set for the shell must not see the user's API key
    )


def make_clients(url: str, api_key: str = "", verify_tls: bool = True) -> tuple[Any, Any]:
    """The two clients a backend keeps: one for calls (connections kept alive) and one for
    streams (a connection each, so that a stop can shut its socket down)."""
    return (
        make_client(url, api_key, verify_tls),
        make_client(url, api_key, verify_tls, keep_alive=False),
    )


def call(client: Any, method: str, path: str, body: Any = None, timeout: float = 30.0) -> Any:
    """One JSON request; the parsed answer, all of it within ``timeout`` seconds.

    Raises:
        ServerUnreachable, ServerError.
    """
    import httpx2

    deadline = time.monotonic() + timeout
    for attempt in (1, 2):
        try:
            with client.stream(method, path, json=body, timeout=timeout) as response:
                status = int(response.status_code)
                location = str(response.headers.get("location", ""))
                raw = _read_limited(response, client, deadline)
            break
        except httpx2.RemoteProtocolError as exc:
            if attempt == 1 and _stale(exc):
                continue
            raise unreachable(client, exc) from None
        except LamplightError:
            raise
        except Exception as exc:  # a body that claims gzip, say: never past this call
            raise failure(client, exc) from None
    data = _parse(raw)
    if status >= 400:
        raise error_of(status, data, raw)
    if status >= 300:
        raise redirected(client, status, location)
    return data


def unreachable(client: Any, exc: BaseException) -> ServerUnreachable:
    """The message for a transport failure, naming the server and the reason."""
    import httpx2

    host = where(str(client.base_url))
    if isinstance(exc, httpx2.ConnectError):
        text = str(exc)
        if "CERTIFICATE" in text.upper() or "SSL" in text.upper():
            why = f"its TLS certificate was refused ({text[:200]})"
        else:
            why = f"nothing answered ({text[:200] or 'connection refused'})"
    elif isinstance(exc, httpx2.TimeoutException):
        why = "it did not answer in time"
    elif isinstance(exc, httpx2.RemoteProtocolError | httpx2.ReadError):
        why = f"the connection dropped ({str(exc)[:200] or type(exc).__name__})"
    else:
        why = str(exc)[:200] or type(exc).__name__
    return ServerUnreachable(f"Cannot reach the server at {host}: {why}.")


def failure(client: Any, exc: BaseException) -> LamplightError:
    """Our error for anything the HTTP stack raised while talking to the server."""
    import httpx2

    if isinstance(exc, LamplightError):
        return exc
    host = where(str(client.base_url))
    text = str(exc)[:200] or type(exc).__name__
    if isinstance(exc, httpx2.SSEError):  # a transport error only by its class
        return ServerError(0, f"The server at {host} sent a damaged event stream: {text}")
    if isinstance(exc, httpx2.TransportError):
        return unreachable(client, exc)
    if isinstance(exc, httpx2.DecodingError):
        return ServerError(
            0,
            f"The server at {host} sent an answer that cannot be decoded (its "
            f"Content-Encoding does not match the body): {text}",
        )
    if not isinstance(exc, httpx2.HTTPError | httpx2.StreamError | ValueError | OSError):
        log.warning("unexpected error talking to %s", host, exc_info=exc)
    return ServerError(0, f"The server at {host} sent an answer this app cannot read: {text}")


def redirected(client: Any, status: int, location: str) -> ServerError:
    """The error for a redirect (never followed: the API key would go along)."""
    host = where(str(client.base_url))
    to = f" to {location[:200]}" if location else ""
    return ServerError(
        status,
        f"The server at {host} answered {status}, a redirect{to}. Put the address of the "
        "server's API itself in the connection (a login page or proxy in front of it "
        "cannot be used).",
    )


def error_of(status: int, data: Any, raw: bytes = b"") -> ServerError:
    """A ``ServerError`` from an error body in llama-server's or OpenAI's shape."""
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict):
        message = str(err.get("message") or "")[:500]
        kind = str(err.get("type") or err.get("code") or "")[:100]
        body = err
    else:
        message = str(err)[:500] if isinstance(err, str) else raw[:300].decode("utf-8", "replace")
        kind, body = "", {}
    if status == 401 or status == 403:
        text = "The server refused the API key"
    elif status == 404:
        text = "The server does not have this endpoint or model"
    elif status == 503:
        text = "The server is busy or still loading its model"
    else:
        text = f"The server answered {status}"
    return ServerError(status, f"{text}: {message}" if message else f"{text}.", kind, body)


class EventStream:
    """The JSON ``data:`` events of one streamed POST, read on a helper thread.

    Iterating yields parsed events until the stream ends, ``[DONE]`` arrives, ``stop``
    is set (``stopped``), or ``budget`` runs out (``timed_out`` says how). Errors
    come out as ``ServerUnreachable`` or ``ServerError``. ``close()`` shuts the
    connection (the server notices and stops) and joins the reader.
    """

    def __init__(
        self,
        client: Any,
        path: str,
        body: Any,
        stop: threading.Event,
        budget: Budget | None = None,
    ) -> None:
        self._client = client
        self._path = path
        self._body = body
        self._stop = stop
        self._budget = budget
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue(QUEUE_EVENTS)
        self._response: Any = None
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._read, name="lamplight-stream", daemon=True)
        self.stopped = False  # ended because ``stop`` was set
        self.timed_out = ""  # why it ended for time: silence or the reply's deadline
        self._thread.start()

    # -- the reader thread ---------------------------------------------------------------

    def _read(self) -> None:
        try:
            self._stream()
        except Exception as exc:  # the consumer decides; the thread must end quietly
            if not self._closing.is_set():
                self._put("error", failure(self._client, exc))
        finally:
            self._put("end", None)

    def _put(self, kind: str, value: Any) -> None:
        while not self._closing.is_set():
            try:
                self._queue.put((kind, value), timeout=POLL_S)
                return
            except queue.Full:
                continue

    def _stream(self) -> None:
        import httpx2

        for attempt in (1, 2):
            try:
                self._stream_once()
                return
            except httpx2.RemoteProtocolError as exc:
                if attempt == 2 or self._response is not None or not _stale(exc):
                    raise

    def _stream_once(self) -> None:
        import httpx2

        extensions = {"trace": self._on_trace}
        with self._client.stream(
            "POST", self._path, json=self._body, extensions=extensions
        ) as response:
            self._response = response
            self._keep_socket(response.extensions.get("network_stream"))
            if self._closing.is_set():
                return
            status = int(response.status_code)
            if status >= 300:
                location = str(response.headers.get("location", ""))
                raw = _read_limited(response, self._client, time.monotonic() + 30.0)
                if status >= 400:
                    self._put("error", error_of(status, _parse(raw), raw))
                else:
                    self._put("error", redirected(self._client, status, location))
                return
            kind = str(response.headers.get("content-type", "")).partition(";")[0].strip()
            if kind.lower() != "text/event-stream":
                raise ServerError(
                    0,
                    f"The server at {self._host()} answered with "
                    f"{kind[:80] or 'no content type'}, not an event stream.",
                )
            for sse in httpx2.EventSource(response, max_event_size=MAX_EVENT):
                if sse.data == "[DONE]":
                    break
                if not sse.data:  # "event: ping" and the like: no data, no event (SSE spec)
                    continue
                try:
                    self._put("event", parse_json(sse.data, JSON_DEPTH))
                except DataFileError as exc:
                    why = f"The server at {self._host()} sent an event that {exc}."
                    self._put("error", ServerError(0, why))
                    return
                if self._closing.is_set():
                    return

    def _on_trace(self, event: str, info: dict[str, Any]) -> None:
        if event in _SOCKET_EVENTS:
            self._keep_socket(info.get("return_value"))

    def _keep_socket(self, stream: Any) -> None:
        """Remember the connection's socket, for ``close`` to shut down."""
        sock = stream.get_extra_info("socket") if stream is not None else None
        if not isinstance(sock, socket.socket):
            return
        with self._lock:
            self._sockets.append(sock)
            closing = self._closing.is_set()
        if closing:
            _shut(sock)

    # -- the consumer ----------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        last = time.monotonic()
        while True:
            if self._stop.is_set():
                self.stopped = True
                self.close()
                return
            if self._out_of_time(last):
                self.close()
                return
            try:
                kind, value = self._queue.get(timeout=POLL_S)
            except queue.Empty:
                continue
            last = time.monotonic()
            if kind == "event":
                yield value
            elif kind == "error":
                raise value
            else:
                return

    def _out_of_time(self, last: float) -> bool:
        budget = self._budget
        if budget is None:
            return False
        now = time.monotonic()
        if now >= budget.deadline:
            self.timed_out = (
                f"The server at {self._host()} was still sending after {budget.seconds:.0f} "
                "s, the longest a reply of this length may take."
            )
        elif now - last >= budget.silence_s:
            self.timed_out = (
                f"The server at {self._host()} sent nothing for {budget.silence_s:.0f} s."
            )
        return bool(self.timed_out)

    def _host(self) -> str:
        return where(str(self._client.base_url))

    def close(self) -> None:
        """Shut the connection (the server notices and stops) and wait for the reader."""
        with self._lock:
            self._closing.set()
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)
        response = self._response
        if not sockets and response is not None:
            try:
                response.close()
            except Exception:  # closing from another thread may race the reader's own close
                log.debug("closing the stream raised", exc_info=True)
        self._thread.join(timeout=STOP_JOIN_S)
        if self._thread.is_alive():  # pragma: no cover - a connect in progress (CONNECT_S)
            log.info("the stream reader is still connecting; it ends on its own")


def _shut(sock: socket.socket) -> None:
    """Wake a thread blocked on ``sock`` (its owner closes it)."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _stale(exc: BaseException) -> bool:
    """A kept-alive connection the server had closed: nothing was sent back, so the
    request never ran and is sent once more on a fresh connection."""
    return "without sending a response" in str(exc)


def _read_limited(response: Any, client: Any, deadline: float) -> bytes:
    chunks, size = [], 0
    for chunk in response.iter_bytes():
        size += len(chunk)
        if size > MAX_BODY:
            raise ServerError(
                0, f"The server sent more than {MAX_BODY >> 20} MB for one answer.", TOO_LARGE
            )
        if time.monotonic() > deadline:  # a server trickling its answer
            raise ServerUnreachable(
                f"Cannot reach the server at {where(str(client.base_url))}: it did not "
                "finish its answer in time."
            )
        chunks.append(chunk)
    return b"".join(chunks)


def _parse(raw: bytes) -> Any:
    if not raw.strip():
        return None
    try:
        return parse_json(raw, JSON_DEPTH)
    except DataFileError:
        return raw[:300].decode("utf-8", "replace")
