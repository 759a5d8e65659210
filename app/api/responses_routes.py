"""OpenAI's Responses API on the server (issue 46): ``POST /v1/responses`` answered
through the chat's one path (``Handlers.complete`` with the Responses shape), and the
stored responses (``GET`` / ``DELETE /v1/responses/{id}``).

A request naming ``previous_response_id`` goes on from that response's items (its
input chain and its output), which the party's own store holds
(``response_store``): the messages are the instructions, those items and the new
input, so the prompt extends the previous one and only the new items are read. A
response stored by another API key is the same 404 as a missing one. Storing runs on
the server's parser thread, after the answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Executor
from dataclasses import replace
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from app.api.errors import ApiError
from app.api.gateway import ApiJob, EngineGateway
from app.api.job_runs import Shape, StreamWriter
from app.api.response_store import ResponseStore, StoredResponse
from app.api.responses_reply import ResponseEvents, ResponsesReply
from app.api.responses_schema import items_to_messages
from app.api.schema import ApiRequest, ResponsesAsk

log = logging.getLogger(__name__)


def not_found(response_id: str, param: str | None = None) -> ApiError:
    return ApiError(
        404,
        f"No response {response_id!r} is stored here (or it was made with another API key, "
        "or it was deleted or stored with `store: false`).",
        code="response_not_found",
        param=param,
    )


class Handling(Protocol):
    """What the routes use of the server's handlers (``server.Handlers``)."""

    gateway: EngineGateway
    parser: Executor  # the one thread bodies are parsed on
    party: str  # whose cached and stored things its requests reach

    async def parse(self, kind: Any, request: Request) -> ApiRequest:
        """The request's body, checked as ``kind``."""

    async def complete(
        self, request: Request, req: ApiRequest, shape: Shape | None = None
    ) -> Response:
        """Answer ``req`` in ``shape``."""


class ResponsesRoutes:
    """``/v1/responses`` for ``handlers``, stored where its gateway says."""

    def __init__(self, handlers: Handling) -> None:
        self.handlers = handlers

    @property
    def store(self) -> ResponseStore | None:
        """The store (None: nothing is stored); the gateway's folder, asked each time."""
        folder = self.handlers.gateway.response_folder()
        return ResponseStore(folder) if folder is not None else None

    async def _io(self, call: Any, *args: Any) -> Any:
        """``call(*args)`` on the parser thread (file work, one at a time)."""
        return await asyncio.get_running_loop().run_in_executor(self.handlers.parser, call, *args)

    async def create(self, request: Request) -> Response:
        req = await self.handlers.parse("responses", request)
        ask = req.responses
        assert ask is not None
        earlier: list[dict[str, Any]] = []
        if ask.previous:
            stored = await self._load(ask.previous)
            if stored is None:
                raise not_found(ask.previous, "previous_response_id")
            earlier = stored.items
            head = req.messages[:1] if ask.echo.get("instructions") else []
            req = replace(req, messages=[*head, *items_to_messages([*earlier, *ask.items])])
        return await self.handlers.complete(request, req, self._shaper(ask, earlier))

    def _shaper(self, ask: ResponsesAsk, earlier: list[dict[str, Any]]) -> Any:
        loop = asyncio.get_running_loop()

        def shape(
            req: ApiRequest, job: ApiJob, _found: dict[str, Any] | None
        ) -> tuple[ResponsesReply, StreamWriter]:
            def ended(body: dict[str, Any]) -> None:
                store = self.store
                if ask.store and store is not None:
                    stored = StoredResponse(job.id, [*earlier, *ask.items, *body["output"]], body)
                    future = loop.run_in_executor(
                        self.handlers.parser, store.save, self.handlers.party, stored
                    )
                    future.add_done_callback(_logged)

            reply = ResponsesReply(
                job.id, job.model_id, int(time.time()), ask.echo, ask.previous, ask.store
            )
            reply.ended = ended
            return reply, ResponseEvents(reply)

        return shape

    async def _load(self, response_id: str) -> StoredResponse | None:
        store = self.store
        if store is None:
            return None
        found: StoredResponse | None = await self._io(store.load, self.handlers.party, response_id)
        return found

    async def retrieve(self, request: Request) -> Response:
        response_id = str(request.path_params["response_id"])
        stored = await self._load(response_id)
        if stored is None:
            raise not_found(response_id)
        return JSONResponse(stored.body)

    async def delete(self, request: Request) -> Response:
        response_id = str(request.path_params["response_id"])
        store = self.store
        if store is None or not await self._io(store.delete, self.handlers.party, response_id):
            raise not_found(response_id)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})


def _logged(future: asyncio.Future[None]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("a response was not stored: %s", future.exception())
