"""The OpenAI error shape, for every non-2xx answer the server gives.

``{"error": {"message", "type", "param", "code"}}``, with the status code's usual
type and code; 4xx answers a retry cannot fix carry ``x-should-retry: false`` so
the ``openai`` client does not resend them; 429 and 503 carry ``Retry-After``.
Qt-free and Starlette-free: ``limits`` sends these as raw ASGI messages.

A reply cut short (the window's Stop, the server stopping, a lost upstream server)
is an error too (``cut_short``), as llama-server does: a stream ends with one
``data: {"error": ...}`` event and no ``[DONE]`` (the ``openai`` client raises
``APIError``), a whole response is a 5xx. An ordinary ``finish_reason: "stop"``
would let the client take half a reply for all of it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from app.api.gateway import ApiFailure, ApiJob
from app.api.messages_reply import error_body as anthropic_error
from app.api.sse import FINISH, error_body
from app.engine.backend import Finished
from app.util.errors import LamplightError

# status -> (type, code) when the raiser names none.
_DEFAULTS: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "invalid_request"),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "forbidden"),
    404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    413: ("invalid_request_error", "request_too_large"),
    415: ("invalid_request_error", "unsupported_media_type"),
    429: ("requests", "rate_limit_exceeded"),
    500: ("server_error", "internal_error"),
    503: ("server_error", "server_busy"),
}
RETRYABLE = frozenset({408, 409, 429, 500, 502, 503, 504})


class ApiError(LamplightError):
    """A request the server refuses; becomes one OpenAI-shaped error response."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        code: str | None = None,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        default_type, default_code = _DEFAULTS.get(
            status, ("server_error" if status >= 500 else "invalid_request_error", "error")
        )
        self.status = status
        self.message = message
        self.type = type or default_type
        self.code = code or default_code
        self.param = param
        self.headers = dict(headers or {})

    @classmethod
    def from_failure(cls, failure: ApiFailure) -> ApiError:
        """The error for a job's terminal ``ApiFailure`` (Retry-After on a 503)."""
        headers = {"Retry-After": "2"} if failure.status == 503 and failure.retry else {}
        if not failure.retry:
            headers["x-should-retry"] = "false"
        return cls(
            failure.status,
            failure.message,
            type=failure.type,
            code=failure.code,
            param=failure.param,
            headers=headers,
        )

    def body(self, path: str = "") -> dict[str, Any]:
        """The error for a request to ``path``: Anthropic's shape under ``/v1/messages``,
        OpenAI's elsewhere."""
        if anthropic_path(path):
            return anthropic_error(self.status, self.message)
        message, param = self.message, self.param
        if path.startswith("/v1/responses") and param and param.startswith("messages"):
            param = "input" + param.removeprefix("messages")  # a response's messages
            if self.code == "context_length_exceeded":
                message += ' Send `"truncation": "auto"` to drop the oldest turns instead.'
        return error_body(message, self.type, self.code, param)

    def encoded(self, path: str = "") -> bytes:
        return json.dumps(self.body(path), ensure_ascii=False).encode()

    def response_headers(self) -> list[tuple[bytes, bytes]]:
        """Headers for the response (content type and length are added by the sender)."""
        headers = {k.lower(): v for k, v in self.headers.items()}
        if self.status not in RETRYABLE:
            headers.setdefault("x-should-retry", "false")
        return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]


def bad(message: str, param: str | None, code: str = "invalid_value") -> ApiError:
    """A 400 for a request field ``param`` whose value cannot be used."""
    return ApiError(400, message, code=code, param=param)


def unsupported(param: str, what: str) -> ApiError:
    """A 400 for a field asking for something Lamplight's server does not do."""
    return ApiError(
        400,
        f"{what} is not supported by Lamplight's server.",
        code="unsupported_parameter",
        param=param,
    )


# Replies the model's own server cut (Lamplight connected to a remote one): the
# stop reasons of ``app.remote`` (``app.engine.backend``'s SIZE_LIMIT and the like).
_UPSTREAM: dict[str, tuple[int, str, str]] = {
    "connection_lost": (
        502,
        "upstream_connection_lost",
        "The connection to the model's server was lost",
    ),
    "server_error": (502, "upstream_error", "The model's server failed"),
    "size_limit": (
        502,
        "upstream_reply_too_large",
        "The model's server sent more text than the tokens asked for could make; it was cut",
    ),
    "time_limit": (504, "upstream_timeout", "The model's server fell silent or took too long"),
}


def cut_short(job: ApiJob, done: Finished) -> ApiFailure | None:
    """The failure a reply that ended before its end becomes (None: it is whole)."""
    m = done.metrics
    if m.stop_reason in FINISH:
        return None
    after = f"after {m.generated_tokens} token{'s' if m.generated_tokens != 1 else ''}"
    upstream = _UPSTREAM.get(m.stop_reason)
    if upstream is not None:
        status, code, what = upstream
        return ApiFailure(status, "server_error", code, f"{what} {after}; the reply is incomplete.")
    if m.stop_reason != "cancelled":
        return ApiFailure(
            500,
            "server_error",
            "incomplete_reply",
            f"The reply ended early ({m.stop_reason or 'no reason given'}) {after}; "
            "it is incomplete.",
        )
    if job.stopped_by == "operator":
        return ApiFailure(
            503,
            "server_error",
            "request_stopped",
            f"The reply was stopped at the server (Lamplight's Stop) {after}; it is incomplete.",
            retry=False,  # the person at the server stopped it: sending it again defeats that
        )
    if job.stopped_by == "shutdown":
        return ApiFailure(
            503,
            "server_error",
            "server_shutting_down",
            f"The server stopped {after}; the reply is incomplete. "
            "Send the request again once the server is back.",
        )
    return ApiFailure(
        503,
        "server_error",
        "request_cancelled",
        f"The reply was stopped {after}; it is incomplete.",
    )


def anthropic_path(path: str) -> bool:
    """Whether a request to ``path`` speaks Anthropic's Messages API (its errors too)."""
    return path == "/v1/messages" or path.startswith("/v1/messages/")


async def send_error(send: Any, error: ApiError, path: str = "") -> None:
    """Send ``error`` as a whole response to a request for ``path`` over raw ASGI ``send``."""
    payload = error.encoded(path)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
        *error.response_headers(),
    ]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": payload, "more_body": False})
