"""The server's answers to what never reaches a handler, or fails in one: the OpenAI
error shape for an ``ApiError``, an unknown URL or method, a crash, and a malformed
request (``H11``: uvicorn's h11 protocol answering in that shape). Imported only by
``app.api.server`` (Starlette and uvicorn are loaded when a server starts)."""

from __future__ import annotations

import logging

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from uvicorn.protocols.http.h11_impl import H11Protocol

from app.api.errors import ApiError

log = logging.getLogger(__name__)

ROUTES_HINT = (
    "/v1/models, /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/messages "
    "and /v1/responses"
)


def error_response(error: ApiError, path: str = "") -> Response:
    """``error`` as a response to a request for ``path`` (its API's shape)."""
    headers = {k.decode(): v.decode() for k, v in error.response_headers()}
    return JSONResponse(error.body(path), status_code=error.status, headers=headers)


async def on_api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc, request.url.path)


async def on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    headers = dict(exc.headers or {})
    where = f"{request.method} {request.url.path}"
    if exc.status_code == 404:
        error = ApiError(404, f"Unknown URL: {where}. This server serves {ROUTES_HINT}.")
    elif exc.status_code == 405:
        allowed = headers.get("Allow", "")
        error = ApiError(
            405, f"{where} is not allowed; use {allowed or 'another method'}.", headers=headers
        )
    else:
        error = ApiError(exc.status_code, exc.detail or "Request refused.", headers=headers)
    return error_response(error, request.url.path)


async def on_crash(request: Request, exc: Exception) -> Response:
    log.error("API request failed", exc_info=exc)
    crash = ApiError(500, f"Internal error: {type(exc).__name__}: {exc}")
    return error_response(crash, request.url.path)


class H11(H11Protocol):
    """uvicorn's h11 protocol, answering a malformed request in the OpenAI error shape."""

    def send_400_response(self, msg: str) -> None:
        import h11

        error = ApiError(400, f"{msg} ({ROUTES_HINT} take HTTP/1.1 with JSON bodies.)")
        payload = error.encoded()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
            (b"connection", b"close"),
            *error.response_headers(),
        ]
        try:
            self.transport.write(self.conn.send(h11.Response(status_code=400, headers=headers)))
            self.transport.write(self.conn.send(h11.Data(data=payload)) or b"")
            self.transport.write(self.conn.send(h11.EndOfMessage()) or b"")
        except h11.LocalProtocolError:  # a response had begun: just close
            pass
        self.transport.close()
