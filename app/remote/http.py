"""HTTP to an inference server: JSON calls and event streams that stop when asked.

Everything a server sends is untrusted: bodies are read up to a size limit and
parsed with a depth limit, and each streamed event is bounded (httpx2's
``EventSource``). Transport failures become ``ServerUnreachable`` with a
sentence a user can act on; HTTP errors become ``ServerError`` carrying the
server's own message and error type.

A streamed reply is read on a short-lived thread so that ``stop`` is noticed
within ``POLL_S`` even while the server is silent (a long prompt evaluation):
the generator closes the response, which drops the connection, and the server
stops the slot.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from app.engine.metrics import MessageMetrics
from app.remote.connection import Connection
from app.util.datafiles import DataFileError, parse_json
from app.util.errors import LamplightError

log = logging.getLogger(__name__)

MAX_BODY = 16 << 20  # a /v1/models list or /props with a long template
MAX_EVENT = 1 << 20  # one streamed event (a token, progress, final timings)
JSON_DEPTH = 12
POLL_S = 0.05
CONNECT_S = 5.0
READ_S = 600.0  # a silent stream: prompt evaluation of a long chat on a slow server


class ServerUnreachable(LamplightError):
    """The server could not be reached, or the connection dropped."""


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


def end_lost(metrics: MessageMetrics, why: str) -> None:
    """End a reply the connection cut off: its text is kept, and a note says why."""
    metrics.stop_reason = "connection_lost"
    metrics.notes.append(f"{why} The reply is incomplete; the text so far is kept")


def unfinished(url: str) -> str:
    """Why a reply ended when the stream closed without its final event."""
    return f"The server at {where(url)} ended the reply without finishing it."


def make_client(url: str, api_key: str = "", verify_tls: bool = True) -> Any:
    """An ``httpx2.Client`` for ``url``. TLS certificates are checked unless told not to."""
    import httpx2

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx2.Client(
        base_url=check_url(url),
        headers=headers,
        verify=verify_tls,
        timeout=httpx2.Timeout(READ_S, connect=CONNECT_S),
        follow_redirects=False,
        trust_env=False,  # a proxy set for the shell must not see the user's API key
    )


def call(client: Any, method: str, path: str, body: Any = None, timeout: float = 30.0) -> Any:
    """One JSON request; the parsed answer.

    Raises:
        ServerUnreachable, ServerError.
    """
    import httpx2

    for attempt in (1, 2):
        try:
            with client.stream(method, path, json=body, timeout=timeout) as response:
                raw = _read_limited(response)
                status = int(response.status_code)
            break
        except httpx2.RemoteProtocolError as exc:
            if attempt == 1 and _stale(exc):
                continue
            raise unreachable(client, exc) from None
        except httpx2.TransportError as exc:
            raise unreachable(client, exc) from None
    data = _parse(raw)
    if status >= 400:
        raise error_of(status, data, raw)
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

    Iterating yields parsed events until the stream ends, ``[DONE]`` arrives or
    ``stop`` is set. ``close()`` drops the connection and joins the reader.
    """

    def __init__(self, client: Any, path: str, body: Any, stop: threading.Event) -> None:
        self._client = client
        self._path = path
        self._body = body
        self._stop = stop
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._response: Any = None
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._read, name="lamplight-stream", daemon=True)
        self.stopped = False  # ended because ``stop`` was set
        self._thread.start()

    def _read(self) -> None:
        import httpx2

        try:
            self._stream()
        except Exception as exc:  # the consumer decides; the thread must end quietly
            if not self._closing.is_set():
                is_transport = isinstance(exc, httpx2.TransportError)
                self._queue.put(("error", unreachable(self._client, exc) if is_transport else exc))
        finally:
            self._queue.put(("end", None))

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

        with self._client.stream("POST", self._path, json=self._body) as response:
            self._response = response
            if self._closing.is_set():
                return
            if response.status_code >= 400:
                raw = _read_limited(response)
                self._queue.put(("error", error_of(response.status_code, _parse(raw), raw)))
                return
            for sse in httpx2.EventSource(response, max_event_size=MAX_EVENT):
                if sse.data == "[DONE]":
                    break
                try:
                    self._queue.put(("event", parse_json(sse.data, JSON_DEPTH)))
                except DataFileError as exc:
                    self._queue.put(("error", ServerError(0, f"The server sent {exc}.")))
                    return

    def __iter__(self) -> Iterator[Any]:
        while True:
            if self._stop.is_set():
                self.stopped = True
                self.close()
                return
            try:
                kind, value = self._queue.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if kind == "event":
                yield value
            elif kind == "error":
                raise value
            else:
                return

    def close(self) -> None:
        """Drop the connection (the server notices and stops) and wait for the reader."""
        self._closing.set()
        response = self._response
        if response is not None:
            try:
                response.close()
            except Exception:  # closing from another thread may race the reader's own close
                log.debug("closing the stream raised", exc_info=True)
        self._thread.join(timeout=10)
        if self._thread.is_alive():  # pragma: no cover - a stuck socket; the thread is a daemon
            log.warning("the stream reader did not stop")


def _stale(exc: BaseException) -> bool:
    """A kept-alive connection the server had closed: nothing was sent back, so the
    request never ran and is sent once more on a fresh connection."""
    return "without sending a response" in str(exc)


def _read_limited(response: Any) -> bytes:
    chunks, size = [], 0
    for chunk in response.iter_bytes():
        size += len(chunk)
        if size > MAX_BODY:
            raise ServerError(0, f"The server sent more than {MAX_BODY >> 20} MB for one answer.")
        chunks.append(chunk)
    return b"".join(chunks)


def _parse(raw: bytes) -> Any:
    if not raw.strip():
        return None
    try:
        return parse_json(raw, JSON_DEPTH)
    except DataFileError:
        return raw[:300].decode("utf-8", "replace")
