"""Safe defaults as pure ASGI middleware (no ``BaseHTTPMiddleware``: ``receive`` must
reach the handlers, which watch it for the client's disconnect).

- ``ConcurrencyLimit``: at most ``limit`` requests in the app at once (503 + Retry-After).
- ``HostCheck``: the ``Host`` header must name a loopback host or the configured one
  (400), so a web page cannot reach a loopback server through DNS rebinding. A
  wildcard bind (0.0.0.0, ::) takes any host name: it needs an API key anyway.
- ``ApiKeyCheck``: ``Authorization: Bearer <key>`` (or Anthropic's ``x-api-key``)
  compared in constant time (401 + ``WWW-Authenticate``); CORS preflights (OPTIONS)
  pass, to be answered by CORS.
- ``BodyLimit``: POST bodies must be ``application/json`` (415: a cross-origin page
  then needs a CORS preflight) and at most ``max_bytes`` long, by ``Content-Length`` or
  counted as a chunked body arrives (413).

A refused request's body is read and dropped (up to a bound) before the answer, so
the client reads the error instead of a connection reset.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import anyio

from app.api.errors import ApiError, send_error
from app.config.api_settings import is_loopback

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Asgi = Callable[[Scope, Receive, Send], Awaitable[None]]

WILDCARDS = ("0.0.0.0", "::", "")
DRAIN_BYTES = 64 * 2**20  # read at most this much of a refused body
DRAIN_SECONDS = 2.0


def header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value)
    return None


async def drain(receive: Receive, limit: int = DRAIN_BYTES) -> None:
    """Read and drop the request body (at most ``limit`` bytes, ``DRAIN_SECONDS``)."""
    total = 0
    with anyio.move_on_after(DRAIN_SECONDS):
        while total <= limit:
            message = await receive()
            if message["type"] != "http.request":
                return
            total += len(message.get("body", b""))
            if not message.get("more_body", False):
                return


async def refuse(scope: Scope, receive: Receive, send: Send, error: ApiError) -> None:
    if scope.get("method") in ("POST", "PUT", "PATCH"):
        await drain(receive)
    await send_error(send, error, scope.get("path", ""))


def host_name(value: str) -> str:
    """The host of a ``Host`` header: ``[::1]:1234`` -> ``::1``, ``a:80`` -> ``a``."""
    value = value.strip()
    if value.startswith("["):
        end = value.find("]")
        return value[1:end] if end > 0 else value
    if value.count(":") == 1:
        return value.split(":", 1)[0]
    return value


class ConcurrencyLimit:
    def __init__(self, app: Asgi, limit: int = 64) -> None:
        self.app = app
        self.limit = limit
        self.active = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.active >= self.limit:
            error = ApiError(
                503,
                f"The server is handling {self.active} requests; try again shortly.",
                code="server_busy",
                headers={"Retry-After": "1"},
            )
            await refuse(scope, receive, send, error)
            return
        self.active += 1  # one event loop: no lock needed
        try:
            await self.app(scope, receive, send)
        finally:
            self.active -= 1


class HostCheck:
    def __init__(self, app: Asgi, host: str, url: str = "") -> None:
        self.app = app
        self.host = host.lower().strip("[]")
        self.url = url  # the bound address, which the refusal names

    def allowed(self, name: str) -> bool:
        name = name.lower()
        return self.host in WILDCARDS or is_loopback(name) or name == self.host

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = header(scope, b"host") if scope["type"] == "http" else None
        if raw is not None:
            name = host_name(raw.decode("latin-1"))
            if not self.allowed(name):
                error = ApiError(
                    400,
                    f"Host {name!r} is not this server; use {self.url or 'its address'} "
                    "(a web page cannot reach this server through another name).",
                    code="invalid_host",
                )
                await refuse(scope, receive, send, error)
                return
        await self.app(scope, receive, send)


class ApiKeyCheck:
    def __init__(self, app: Asgi, api_key: str) -> None:
        self.app = app
        self.expected = b"Bearer " + api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") == "OPTIONS":
            await self.app(scope, receive, send)
            return
        given = header(scope, b"authorization") or b""
        if given[:7].lower() == b"bearer ":
            given = b"Bearer " + given[7:].strip()
        elif not given and (key := header(scope, b"x-api-key")):  # Anthropic's clients
            given = b"Bearer " + key.strip()
        if not hmac.compare_digest(given, self.expected):
            message = (
                "Incorrect API key provided."
                if given
                else "This server needs an API key: send `Authorization: Bearer <key>` "
                "(or `x-api-key: <key>`)."
            )
            error = ApiError(
                401,
                message,
                code="invalid_api_key",
                headers={"WWW-Authenticate": 'Bearer realm="lamplight"'},
            )
            await refuse(scope, receive, send, error)
            return
        await self.app(scope, receive, send)


class BodyLimit:
    def __init__(self, app: Asgi, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def too_large(self, size: int | None = None) -> ApiError:
        limit = f"{self.max_bytes / 2**20:g} MiB"
        said = f" ({size / 2**20:.1f} MiB)" if size is not None else ""
        return ApiError(413, f"The request body{said} is larger than the limit of {limit}.")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        content_type = (header(scope, b"content-type") or b"").decode("latin-1")
        if content_type.split(";", 1)[0].strip().lower() != "application/json":
            error = ApiError(
                415,
                "Send the request as JSON with `Content-Type: application/json` "
                f"(got {content_type[:60]!r}).",
            )
            await refuse(scope, receive, send, error)
            return
        length = header(scope, b"content-length")
        if length is not None:
            if not length.strip().isdigit():
                await refuse(scope, receive, send, ApiError(400, "Bad Content-Length header."))
                return
            if int(length) > self.max_bytes:
                await refuse(scope, receive, send, self.too_large(int(length)))
                return
        total = 0
        started = False

        async def counted() -> Message:
            nonlocal total
            message = await receive()
            if message["type"] == "http.request":
                total += len(message.get("body", b""))
                if total > self.max_bytes:
                    if message.get("more_body", False):
                        await drain(receive)
                    raise self.too_large()
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except ApiError as error:
            if started:
                raise
            await send_error(send, error, scope.get("path", ""))  # the body is drained already
