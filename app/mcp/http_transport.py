"""The streamable HTTP transport, bounded like stdio (``oversize``).

The SDK (mcp 2.3) reads a JSON answer whole (``aread``, no limit) and refuses a
server-sent event over 1 MiB by failing the request as if the connection had closed:
a tool's result of ~0.5 MB (the SDK's server sends the text twice: as content and as
structured content) came back as "the server failed during the call". Here a response
hook wraps each answer's byte stream: a JSON body or an event is collected up to
``MAX_MESSAGE_BYTES``; over it, it is replaced by a ``TOO_LARGE`` error for the request
(the text it began with kept), so the call gets its result with a note and the session
stays up. The client asks for uncompressed answers, so the bound counts what is
parsed; a JSON answer compressed anyway is refused (its size unknown until inflated),
and a compressed event stream is left to the SDK's own event limit.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import httpx2
from mcp.client._transport import TransportStreams
from mcp.client.streamable_http import streamable_http_client

from app.mcp.oversize import MAX_MESSAGE_BYTES, Collector, replacement

log = logging.getLogger(__name__)

_REQUEST_ID_BYTES = 1 << 20  # a request we sent is small; its id is read from it


class ResponseTooLarge(httpx2.StreamError):
    """An answer that cannot be read within the bound (the SDK fails that request)."""


@asynccontextmanager
async def http_transport(
    url: str, headers: Mapping[str, str], limit: int = MAX_MESSAGE_BYTES
) -> AsyncIterator[TransportStreams]:
    """``streamable_http_client`` on a client whose answers are bounded by ``limit``."""

    async def bound(response: httpx2.Response) -> None:
        bound_response(response, limit)

    client = httpx2.AsyncClient(
        headers={"Accept-Encoding": "identity", **headers},
        timeout=httpx2.Timeout(30.0, read=300.0),
        event_hooks={"response": [bound]},
    )
    # The SDK's own event limit stays as a second bound, above any event passed on here.
    async with (
        client,
        streamable_http_client(url, http_client=client, max_sse_event_size=2 * limit) as streams,
    ):
        yield streams


def bound_response(response: httpx2.Response, limit: int) -> None:
    """Wrap ``response``'s stream so that no answer over ``limit`` is read whole."""
    kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
    encoding = response.headers.get("content-encoding", "").strip().lower()
    if kind not in ("application/json", "text/event-stream"):
        return
    if encoding not in ("", "identity"):
        if kind == "application/json":
            response.stream = _Refused(response.stream, f"a {encoding}-compressed answer")
        return
    msg_id = request_id(_sent(response))
    if kind == "application/json":
        response.stream = _BoundedBody(response.stream, limit, msg_id)
    else:
        response.stream = _BoundedEvents(response.stream, limit, msg_id)


def _sent(response: httpx2.Response) -> bytes:
    try:
        return response.request.content
    except (RuntimeError, httpx2.RequestNotRead):  # no request, or a streamed body
        return b""


def request_id(body: bytes) -> Any:
    """The id of the JSON-RPC request a POST carried (None: none)."""
    if not body or len(body) > _REQUEST_ID_BYTES:
        return None
    try:
        value = json.loads(body)
    except ValueError:
        return None
    found = value.get("id") if isinstance(value, dict) else None
    return found if isinstance(found, int | str) and not isinstance(found, bool) else None


class _Wrapped(httpx2.AsyncByteStream):
    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def aclose(self) -> None:
        await self._inner.aclose()


class _Refused(_Wrapped):
    def __init__(self, inner: Any, what: str) -> None:
        super().__init__(inner)
        self._what = what

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._what:  # always: the test only makes this an async generator
            raise ResponseTooLarge(f"The server sent {self._what}, which is not read.")
        yield b""


class _BoundedBody(_Wrapped):
    """A JSON body, whole up to the limit, else its replacement."""

    def __init__(self, inner: Any, limit: int, msg_id: Any) -> None:
        super().__init__(inner)
        self._body = Collector(limit)
        self._id = msg_id

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            self._body.add(chunk)
        size, out = self._body.size, self._body.take(self._id)
        if out is None:
            raise ResponseTooLarge(f"The server's answer was {size:,} bytes, over the limit.")
        yield out


class _BoundedEvents(_Wrapped):
    """Server-sent events, each passed on whole when it ends (a blank line), or replaced
    when over the limit. Line ends are made ``\\n`` (as the SSE parser would)."""

    def __init__(self, inner: Any, limit: int, msg_id: Any) -> None:
        super().__init__(inner)
        self._event = Collector(limit)
        self._id = msg_id
        self._ends_in_newline = False
        self._cr = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            for event in self._events(self._normalized(chunk)):
                yield event
        if self._cr:
            self._event.add(b"\n")
        if self._event.size:
            tail = self._emit()
            if tail:
                yield tail

    def _normalized(self, chunk: bytes) -> bytes:
        if self._cr:
            chunk = b"\r" + chunk
        self._cr = chunk.endswith(b"\r")
        if self._cr:
            chunk = chunk[:-1]
        return chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")

    def _events(self, chunk: bytes) -> list[bytes]:
        done: list[bytes] = []
        start = 0
        if self._ends_in_newline and chunk.startswith(b"\n"):
            self._event.add(b"\n")
            done.append(self._emit())
            start = 1
        while (end := chunk.find(b"\n\n", start)) >= 0:
            self._event.add(chunk[start : end + 2])
            done.append(self._emit())
            start = end + 2
        rest = chunk[start:]
        self._event.add(rest)
        if rest:
            self._ends_in_newline = rest.endswith(b"\n")
        return [e for e in done if e]

    def _emit(self) -> bytes:
        self._ends_in_newline = False
        if not self._event.over:
            return self._event.take() or b""
        size, head, tail = self._event.size, self._event.head, self._event.tail
        self._event.take()
        data = replacement(_data(head), _last_line(tail), size, self._event.limit, self._id)
        if data is None:
            log.warning("a %d-byte event from an MCP server without an id was left out", size)
            return b""
        return b"event: message\ndata: " + data + b"\n\n"


def _data(head: bytes) -> bytes:
    """The ``data`` of an event's first bytes (its data lines joined, as SSE does)."""
    lines = [line for line in head.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(_value(line) for line in lines)


def _last_line(tail: bytes) -> bytes:
    line = tail.rstrip(b"\n").rpartition(b"\n")[2]
    return _value(line) if line.startswith(b"data:") else line


def _value(line: bytes) -> bytes:
    return line[6:] if line.startswith(b"data: ") else line[5:]
