"""The HTTP surface: a Starlette app over an ``EngineGateway`` and its ``ApiRequests``.

``GET /v1/models``, ``GET /v1/models/{id}``, ``POST /v1/chat/completions``,
``POST /v1/completions``, ``POST /v1/embeddings`` (``embeddings``: the embed worker,
not the engine's queue), Anthropic's ``POST /v1/messages`` and
``POST /v1/messages/count_tokens`` (``messages_schema``, ``messages_reply``), and
``GET /lamplight/status``. Imported only when a server starts
(``runner.ApiServer.start``), so the GUI's start-up never loads Starlette.

Every answer takes one path (``job_runs.JobRuns``: queued on the host's line, waited
for, whole or streamed); only its shape differs (OpenAI's ``sse.ChunkWriter``,
Anthropic's ``messages_reply.MessageEvents``), errors included (``ApiError.body``).

Bodies are parsed on a worker thread, one at a time (``schema.parse_request``), so a
large one never stalls the event loop and the other clients. The ``model`` a request
names is not checked: the loaded model answers any name, as llama-server does (clients
have a default name, "gpt-3.5-turbo" and the like), and the response says which.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from concurrent.futures import Executor
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.api import compact_field, limits
from app.api.config import api_party
from app.api.embeddings import (
    EmbedService,
    no_embedder,
    parse_embeddings,
    response_json,
    run_embedding,
)
from app.api.errors import ApiError
from app.api.gateway import ApiFailure, ApiJob, ApiKind, EngineGateway, failure_for
from app.api.http_errors import on_api_error, on_crash, on_http_error
from app.api.image_parts import check_vision
from app.api.job_runs import Body, JobRuns, Shape, StreamWriter
from app.api.messages_reply import MessageEvents, MessagesReply
from app.api.project_field import project_tools, with_project
from app.api.request_bodies import BodyKind, parse_body
from app.api.requests import ApiRequests, JobView
from app.api.responses_routes import ResponsesRoutes
from app.api.schema import ApiRequest
from app.api.sse import ChunkWriter, Reply
from app.chat.composer import tool_offer
from app.engine.backend import Finished, ModelInfo
from app.engine.chat_message import ChatMessage
from app.engine.tool_spec import NONE, ToolRequest
from app.host.jobs import model_id
from app.host.kv_pool import LOCAL_API
from app.util.errors import LamplightError

if TYPE_CHECKING:
    from app.api.config import ApiConfig

log = logging.getLogger(__name__)

CONCURRENCY = 64  # requests inside the app at once (streams included)


class Handlers:
    def __init__(
        self,
        gateway: EngineGateway,
        requests: ApiRequests,
        max_wait_s: float,
        parser: Executor,
        embedder: EmbedService | None = None,
        party: str = LOCAL_API,
    ) -> None:
        self.gateway = gateway
        self.requests = requests
        self.runs = JobRuns(requests, max_wait_s)
        self.parser = parser  # one thread: bodies are parsed one at a time, off the loop
        self.embedder = embedder  # None: /v1/embeddings answers 503
        self.party = party  # whose cached conversations its requests reuse (the key's)

    # -- models ------------------------------------------------------------------------

    def model_object(self, info: ModelInfo) -> dict[str, Any]:
        try:
            created = int(info.path.stat().st_mtime) if info.path.name else 0
        except (OSError, ValueError):
            created = 0
        return {
            "id": model_id(info),
            "object": "model",
            "created": created,
            "owned_by": "lamplight",
            "meta": {
                "name": info.name,
                "n_ctx": info.n_ctx,
                "n_ctx_train": info.n_ctx_train,
                "n_params": info.n_params,
                "size": info.file_size,
                "vision": info.capabilities.vision,  # takes image_url parts
                "projector": info.projector,
            },
        }

    def names(self, info: ModelInfo) -> set[str]:
        return {model_id(info), info.name, info.path.name} - {""}

    async def models(self, request: Request) -> Response:
        info = self.gateway.model()
        data = [self.model_object(info)] if info is not None else []
        return JSONResponse({"object": "list", "data": data})

    async def model(self, request: Request) -> Response:
        wanted = str(request.path_params["model"])
        info = self.gateway.model()
        if info is None or wanted not in self.names(info):
            raise self.unknown_model(wanted, info)
        return JSONResponse(self.model_object(info))

    def unknown_model(self, wanted: str, info: ModelInfo | None) -> ApiError:
        serving = f"this server serves {model_id(info)!r}" if info else "no model is loaded"
        return ApiError(
            404,
            f"The model {wanted!r} does not exist; {serving}.",
            code="model_not_found",
            param="model",
        )

    def loaded(self) -> ModelInfo:
        if self.gateway.loading():
            raise ApiError(
                503,
                "A model is loading; try again in a moment.",
                code="model_loading",
                headers={"Retry-After": "2"},
            )
        info = self.gateway.model()
        if info is None:
            raise ApiError(
                503,
                "No model is loaded: open one in Lamplight (or start `lamplight serve --model`).",
                code="model_not_loaded",
                headers={"Retry-After": "5"},
            )
        return info

    # -- status ------------------------------------------------------------------------

    async def status(self, request: Request) -> Response:
        info = self.gateway.model()
        now = time.monotonic()

        def view(v: JobView | None) -> dict[str, Any] | None:
            if v is None:
                return None
            return {
                "id": v.id,
                "kind": v.kind,
                "client": v.client,
                "tokens": v.tokens,
                "seconds": round(now - v.started, 3),
            }

        return JSONResponse(
            {
                "model": model_id(info) if info else None,
                "loading": self.gateway.loading(),
                "running": view(self.requests.running()),
                "queued": [view(v) for v in self.requests.queued()],
                "recent": [
                    {
                        "id": o.id,
                        "client": o.client,
                        "finish": o.finish,
                        "tokens": o.tokens,
                        "prompt_tokens": o.prompt_tokens,
                        "cached_tokens": o.cached_tokens,
                        "ended": o.ended,
                    }
                    for o in self.requests.recent()
                ],
            }
        )

    # -- embeddings --------------------------------------------------------------------

    async def embeddings(self, request: Request) -> Response:
        raw = await request.body()  # read first, so the client reads any refusal
        if self.embedder is None:
            raise no_embedder()
        loop = asyncio.get_running_loop()
        req = await loop.run_in_executor(self.parser, parse_embeddings, raw)
        result = await run_embedding(self.embedder, req, request.receive)
        if result is None:  # the client went away
            return Response(status_code=204)
        payload = await loop.run_in_executor(self.parser, response_json, req, result)
        return Response(payload, media_type="application/json")

    # -- completions -------------------------------------------------------------------

    async def chat(self, request: Request) -> Response:
        return await self.complete(request, await self.parse("chat", request))

    async def completion(self, request: Request) -> Response:
        return await self.complete(request, await self.parse("completion", request))

    async def messages(self, request: Request) -> Response:
        """Anthropic's Messages API (``messages_schema``, ``messages_reply``)."""
        return await self.complete(request, await self.parse("messages", request))

    async def count_tokens(self, request: Request) -> Response:
        """Anthropic's ``/v1/messages/count_tokens``: the prompt counted on the engine's
        thread, behind what is queued there (at most ``max_wait_s``)."""
        req = await self.parse("count", request)
        info = self.loaded()
        check_vision(req.messages, info.capabilities)
        counted = self.gateway.count(req.messages, req.params, self.tools_for(req, info))
        try:
            with anyio.fail_after(self.runs.max_wait_s):
                n = await asyncio.wrap_future(counted)
        except TimeoutError:
            raise self.runs.queue_timeout() from None
        except LamplightError as exc:
            raise ApiError.from_failure(failure_for(exc)) from exc
        return JSONResponse({"input_tokens": n})

    async def parse(self, kind: ApiKind | BodyKind, request: Request) -> ApiRequest:
        """The request's body, checked on the parser's thread (one body at a time, so
        the memory parses take is bounded too)."""
        raw = await request.body()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.parser, parse_body, kind, raw)

    async def complete(
        self, request: Request, req: ApiRequest, shape: Shape | None = None
    ) -> Response:
        """Answer ``req``; ``shape``: its answer's body and stream (by default the
        chat completions' or Anthropic's, by ``req.dialect``)."""
        info = self.loaded()  # whatever ``req.model`` says: see the module's docstring
        check_vision(req.messages, info.capabilities)
        address = job_client(request)
        prefix = "chatcmpl-" if req.kind == "chat" else "cmpl-"
        if req.dialect != "openai":
            prefix = "msg_" if req.dialect == "anthropic" else "resp_"
        messages, project = req.messages, None
        if req.project:
            project = self.gateway.project(req.project)
            messages = with_project(project, req.project, messages)
            if info.capabilities.tools:  # else a project's tools are left out, not refused
                req = replace(req, tools=project_tools(project, req.tools))
        tools = self.tools_for(req, info)  # refused before a summary is written
        found: dict[str, Any] | None = None
        if req.compact is not None:
            compacting = await self.compact(request, req, messages, info, tools)
            if compacting is None:  # the client went away while the summary was written
                return Response(status_code=204)
            messages, found = compacting
        job = ApiJob(
            id=prefix + uuid.uuid4().hex[:24],
            kind=req.kind,
            model_id=model_id(info),
            messages=messages,
            params=req.params_for(info.n_ctx),
            reuse=req.reuse,
            client=req.user or address,
            tools=tools,
            party=self.party,
            prefix=project.id if project is not None and _first_turn(messages) else "",
        )
        queue, events = await self.runs.run(request, job, first_token=req.stream)
        if events is None:  # the client went away before its answer began
            return Response(status_code=204)
        last = events[-1]
        if isinstance(last, ApiFailure):
            raise ApiError.from_failure(last)
        reply, writer = (shape or _shape)(req, job, found)
        if not req.stream:
            assert isinstance(last, Finished)
            headers = {"x-lamplight-cached-tokens": str(last.metrics.cached_tokens)}
            return JSONResponse(reply.body(last), headers=headers)
        return self.runs.stream(job, queue, events, writer)

    async def compact(
        self,
        request: Request,
        req: ApiRequest,
        messages: list[ChatMessage],
        info: ModelInfo,
        tools: ToolRequest | None,
    ) -> tuple[list[ChatMessage], dict[str, Any]] | None:
        """The messages to answer from, and the response's ``compaction``
        (``app.api.compact_field``); None when the client went away meanwhile. The
        summary is offered the request's ``tools``, none callable: the history renders
        as the cache holds it."""
        ask = req.compact
        found = compact_field.plan(messages, ask.keep) if ask is not None else None
        if ask is None or found is None:
            return messages, compact_field.too_little(ask or compact_field.CompactAsk())
        job = ApiJob(
            id="compact-" + uuid.uuid4().hex[:24],
            kind="chat",
            model_id=model_id(info),
            messages=compact_field.summary_request(messages, found, ask),
            params=compact_field.summary_params(req.params, ask),
            reuse=req.reuse,
            client=req.user or job_client(request),
            party=self.party,
            compaction="api",
            tools=replace(tools, choice=NONE) if tools is not None else None,
        )
        _, events = await self.runs.run(request, job, first_token=False)
        if events is None:
            return None
        done = events[-1]
        if isinstance(done, ApiFailure):
            if done.code != "context_length_exceeded":
                raise ApiError.from_failure(done)
            return messages, compact_field.no_room(info.n_ctx)
        assert isinstance(done, Finished)
        if done.metrics.stop_reason == "context_full":
            return messages, compact_field.no_room(info.n_ctx)
        if not done.text.strip():
            return messages, compact_field.skipped(compact_field.EMPTY)
        after = compact_field.compacted(messages, found, done.text)
        offset = len(messages) - len(req.messages)  # a project's system message
        in_project = bool(req.project)
        system = compact_field.summary_block(done.text) if in_project else after[0].content
        return after, compact_field.report(found, done, system, offset)

    def tools_for(self, req: ApiRequest, info: ModelInfo) -> ToolRequest | None:
        """The request's tools, if the model can take them: tools it may call are
        refused (400) where the backend has no tool calling; ``tool_choice: "none"``
        tools are then dropped, as they could not be called anyway."""
        offer = tool_offer(info.capabilities, req.tools)  # ``app.chat.composer``'s decision
        if offer.refusal:
            raise ApiError(400, offer.refusal, code="unsupported_parameter", param="tools")
        return offer.tools


def build_app(
    gateway: EngineGateway,
    requests: ApiRequests,
    config: ApiConfig,
    url: str,
    parser: Executor,
    embedder: EmbedService | None = None,
) -> Starlette:
    """The app for ``config``; ``url`` is the base URL of the address it is bound to,
    ``parser`` the one thread that parses request bodies, ``embedder`` the worker that
    answers ``/v1/embeddings`` (None: 503)."""
    party = api_party(config.api_key)
    handlers = Handlers(gateway, requests, config.max_wait_s, parser, embedder, party)
    responses = ResponsesRoutes(handlers)
    routes = [
        Route("/v1/models", handlers.models, methods=["GET"]),
        Route("/v1/models/{model:path}", handlers.model, methods=["GET"]),
        Route("/v1/chat/completions", handlers.chat, methods=["POST"]),
        Route("/v1/completions", handlers.completion, methods=["POST"]),
        Route("/v1/embeddings", handlers.embeddings, methods=["POST"]),
        Route("/v1/messages", handlers.messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", handlers.count_tokens, methods=["POST"]),
        Route("/v1/responses", responses.create, methods=["POST"]),
        Route("/v1/responses/{response_id}", responses.retrieve, methods=["GET"]),
        Route("/v1/responses/{response_id}", responses.delete, methods=["DELETE"]),
        Route("/lamplight/status", handlers.status, methods=["GET"]),
    ]
    middleware = [
        Middleware(limits.ConcurrencyLimit, limit=CONCURRENCY),
        Middleware(limits.HostCheck, host=config.host, url=url),
    ]
    if config.cors_origins:
        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=list(config.cors_origins),
                allow_methods=["GET", "POST", "DELETE"],
                allow_headers=["*"],
                allow_credentials=False,
                expose_headers=["x-lamplight-cached-tokens", "retry-after"],
            )
        )
    if config.api_key:
        middleware.append(Middleware(limits.ApiKeyCheck, api_key=config.api_key))
    middleware.append(Middleware(limits.BodyLimit, max_bytes=config.max_body_bytes))
    return Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={
            ApiError: on_api_error,
            HTTPException: on_http_error,
            Exception: on_crash,
        },
    )


def _shape(req: ApiRequest, job: ApiJob, found: dict[str, Any] | None) -> tuple[Body, StreamWriter]:
    """A chat completion's (or completion's) answer, or Anthropic's message."""
    if req.dialect == "anthropic":
        message = MessagesReply(job.id, job.model_id, req.params.stop)
        return message, MessageEvents(message)
    reply = Reply(req.kind, job.id, job.model_id, int(time.time()), found)
    return reply, ChunkWriter(reply, req.include_usage)


def job_client(request: Request) -> str:
    """The client's address, for the UI ("" when not known)."""
    client = request.client
    return f"{client.host}:{client.port}" if client else ""


def _first_turn(messages: list[ChatMessage]) -> bool:
    """A project's system turn and one question: the reply starts from its opening."""
    return len(messages) == 2 and messages[0].role == "system" and messages[1].role == "user"
