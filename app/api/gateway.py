"""The seam between the HTTP server and the engine host: ``EngineGateway``.

The server thread builds an ``ApiJob`` and joins it to the host's line (``join``:
the engine host's own queue, one API reply on it at a time); the host runs it on its
own thread (``host_gateway.HostGateway``), through the same ``Backend`` the GUI uses,
and reports back through ``job.emit``: ``Token`` events, then exactly one terminal
event (``Finished`` or ``ApiFailure``). ``job.halt(why)`` may be called from
any thread (a client disconnect, the UI's Stop, shutdown): it sets ``job.stop``, which
ends the job promptly, and keeps the first reason, so the server can tell the client
why its reply was cut short.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from app.config.field_spec import SettingError
from app.config.setting_records import SamplingParams
from app.engine.backend import Finished, ModelInfo, Token
from app.engine.chat_message import ChatMessage
from app.engine.template_errors import ChatTemplateError
from app.engine.tool_spec import ToolRequest, ToolSpec
from app.host.jobs import (
    HostClosed,
    ModelGone,
    NoResult,
    StopCause,
    TemplateUnavailable,
)
from app.host.kv_pool import LOCAL_API
from app.host.line import ReplyLine
from app.util.errors import ContextOverflowError, ImageError, LamplightError, NoModelLoaded

log = logging.getLogger(__name__)

ApiKind = Literal["chat", "completion"]

# SamplingParams field -> the API request field a refusal names.
_API_PARAM = {"json_schema": "response_format", "output_format": "response_format"}


@dataclass(frozen=True)
class ApiFailure:
    """Terminal event for a job that could not run (or failed part-way)."""

    status: int  # 400 / 404 / 503 / 500
    type: str  # "invalid_request_error" | "server_error"
    code: str  # "context_length_exceeded", "model_not_loaded", ...
    message: str
    param: str | None = None
    retry: bool = True  # False: the client should not send it again (x-should-retry)


ApiEvent = Token | Finished | ApiFailure


@dataclass(frozen=True)
class ProjectView:
    """A project a request names (``app/api/project_field.py``): its id (the key of its
    warm opening), its system text, and its tools (offered when a request names none:
    the client gets the calls back, the server never runs them)."""

    id: str
    system_text: str
    tools: tuple[ToolSpec, ...] = ()


@dataclass
class ApiJob:
    """One API request for the engine worker."""

    id: str  # "chatcmpl-<24 hex>" / "cmpl-<24 hex>"
    kind: ApiKind
    model_id: str  # the model id the request was validated against
    messages: list[ChatMessage]  # a completion: [ChatMessage("user", prompt)]
    params: SamplingParams  # overflow="stop", speculative=False
    reuse: bool = True  # False: the worker starts from an empty cache (cache_prompt)
    client: str = ""  # "127.0.0.1:54321" or the request's `user`, for the UI
    stop: threading.Event = field(default_factory=threading.Event)
    # Thread-safe and never blocking; the worker calls it on its own thread.
    emit: Callable[[ApiEvent], None] = lambda _event: None
    stopped_by: StopCause = ""  # the first ``halt`` reason ("" while nobody stopped it)
    tools: ToolRequest | None = None  # what the model may call (a chat request's ``tools``)
    # Whose cached conversations it may reuse: the server's key (``config.api_party``).
    party: str = LOCAL_API
    prefix: str = ""  # a project's id: the reply starts from its opening (``ReplyJob``)
    # Not "": a compaction's summary, written on a copy of the cache (``ReplyJob``).
    compaction: str = ""

    def halt(self, why: StopCause) -> None:
        """Stop the job for ``why`` (the first reason given is the one kept)."""
        if not self.stopped_by:  # a benign race: two stoppers at once both set stop
            self.stopped_by = why
        self.stop.set()


class EngineGateway(Protocol):
    """What the server needs from the engine side; every method is callable from any thread."""

    def model(self) -> ModelInfo | None:
        """The loaded model (None when none is)."""

    def loading(self) -> bool:
        """Whether a model load is under way."""

    @property
    def line(self) -> ReplyLine:
        """Where the API's replies wait their turn on the engine's queue."""

    def join(self, job: ApiJob, limit: int) -> int:
        """Queue ``job`` on ``line``; how many replies are ahead of it (0: it runs now).

        Raises:
            LineFull: ``limit`` replies are running or waiting.
        """

    def project(self, ref: str) -> ProjectView | None:
        """The project with id or name ``ref``, if it is shared with the API."""

    def count(
        self, messages: list[ChatMessage], params: SamplingParams, tools: ToolRequest | None
    ) -> Future[int]:
        """The tokens a reply's prompt would take (counted on the engine's thread)."""

    def response_folder(self) -> Path | None:
        """Where stored responses are kept (``/v1/responses``; None: nowhere)."""


__all__ = ["ApiEvent", "ApiFailure", "ApiJob", "EngineGateway", "failure_for"]


def failure_for(exc: BaseException) -> ApiFailure:
    """The API failure for an exception raised while running a job (or the host's
    refusal of it): the one place that picks a job's HTTP status."""
    if isinstance(exc, ModelGone):
        return ApiFailure(404, "invalid_request_error", "model_not_found", str(exc), "model")
    if isinstance(exc, TemplateUnavailable):
        message = f"{exc} Use /v1/chat/completions."
        return ApiFailure(400, "invalid_request_error", "unsupported_endpoint", message, "prompt")
    if isinstance(exc, NoResult):
        return ApiFailure(500, "server_error", "internal_error", str(exc))
    if isinstance(exc, HostClosed):
        message = f"{exc} Send the request again once the server is back."
        return ApiFailure(503, "server_error", "server_shutting_down", message)
    if isinstance(exc, ContextOverflowError):
        return ApiFailure(
            400, "invalid_request_error", "context_length_exceeded", str(exc), "messages"
        )
    if isinstance(exc, SettingError):
        param = _API_PARAM.get(exc.field, exc.field)
        return ApiFailure(400, "invalid_request_error", "invalid_value", str(exc), param)
    if isinstance(exc, ImageError):  # the model cannot take an image the request holds
        return ApiFailure(400, "invalid_request_error", "invalid_value", str(exc), "messages")
    if isinstance(exc, ChatTemplateError):
        return ApiFailure(400, "invalid_request_error", "template_error", str(exc), "messages")
    if isinstance(exc, NoModelLoaded):
        message = str(exc) or "No model is loaded."
        return ApiFailure(503, "server_error", "model_not_loaded", message, "model")
    if isinstance(exc, LamplightError):
        return ApiFailure(500, "server_error", "engine_error", str(exc))
    log.error("API job failed", exc_info=exc)
    return ApiFailure(500, "server_error", "internal_error", f"Internal error: {exc}")
