"""``POST /v1/embeddings``: the body checked, the job for the embed worker, the answer.

OpenAI's shape: ``input`` is a string or a list of at most ``MAX_INPUTS`` non-empty
strings (``MAX_INPUT_CHARS`` each, ``MAX_TOTAL_CHARS`` in all); token-id arrays are
refused. ``encoding_format`` is ``"float"`` or ``"base64"`` (little-endian float32
bytes); ``dimensions``, if given, must be the model's own (vectors are not cut).
``model`` is not checked, as for chat: the one embedding model answers any name and
the response says which. Texts longer than the model's context are truncated by the
embedder (``Embedder.max_tokens``); ``usage`` counts their whole tokens.

The job runs on the embed worker's thread, urgent (before queued indexing batches):
the vectors and the token counts in one submit. The event loop only awaits it; a
client that goes away sets the job's ``stop`` (the embedder stops between batches).
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

import anyio
import numpy as np
import numpy.typing as npt

from app.api.errors import ApiError, bad
from app.api.schema import load_body
from app.util.errors import DocumentCancelled, ModelFileError

MAX_INPUTS = 256
MAX_INPUT_CHARS = 32_000
MAX_TOTAL_CHARS = 2_000_000
NO_EMBEDDER = "No embedding model is available on this server."

T = TypeVar("T")
Encoding = Literal["float", "base64"]
Receive = Callable[[], Awaitable[Mapping[str, Any]]]


class TextEmbedder(Protocol):
    """What the route uses of ``app.engine.local.embedder.Embedder`` (on the worker's thread)."""

    @property
    def name(self) -> str: ...

    @property
    def dim(self) -> int: ...

    def count_tokens(self, text: str) -> int: ...

    def embed(
        self, texts: Sequence[str], stop: threading.Event | None = None
    ) -> npt.NDArray[Any]: ...


class EmbedService(Protocol):
    """What the route uses of ``app.engine.local.embed_worker.EmbedWorker``."""

    def submit(self, fn: Callable[[TextEmbedder], T], urgent: bool = False) -> Future[T]: ...


@dataclass(frozen=True)
class EmbedRequest:
    """A checked ``/v1/embeddings`` body."""

    texts: tuple[str, ...]
    model: str  # "" when the request named none
    encoding: Encoding = "float"
    dimensions: int | None = None


@dataclass(frozen=True)
class Embedded:
    """A job's result: the model's name, one row per text, the tokens counted."""

    name: str
    vectors: npt.NDArray[np.float32]
    tokens: int


# -- the body ------------------------------------------------------------------------------


def parse_embeddings(raw: bytes) -> EmbedRequest:
    """A raw ``/v1/embeddings`` body, checked (on the server's parser thread).

    Raises:
        ApiError: 400 naming the field, or 413 (``schema.load_body``).
    """
    data = load_body(raw)
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise bad("`model` must be a string.", "model")
    encoding: Encoding = "float"
    given = data.get("encoding_format")
    if given == "base64":
        encoding = "base64"
    elif given not in (None, "float"):
        raise bad('`encoding_format` must be "float" or "base64".', "encoding_format")
    dimensions = data.get("dimensions")
    if dimensions is not None and (
        isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1
    ):
        raise bad("`dimensions` must be a positive whole number.", "dimensions")
    return EmbedRequest(_texts(data.get("input")), model or "", encoding, dimensions)


def _texts(value: object) -> tuple[str, ...]:
    if value is None:
        raise bad(
            "`input` is required: a string or a list of strings.",
            "input",
            "missing_required_parameter",
        )
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise bad("`input` must be a string or a list of strings.", "input")
    if not items:
        raise bad("`input` is an empty list; send at least one string.", "input")
    if not all(isinstance(t, str) for t in items):
        if all(isinstance(t, int | list) and not isinstance(t, bool) for t in items):
            raise bad(
                "This server takes text input for embeddings: send `input` as a string or "
                "a list of strings, not token ids (LangChain's `OpenAIEmbeddings` sends "
                "token ids unless it is made with `check_embedding_ctx_length=False`).",
                "input",
                "unsupported_parameter",
            )
        raise bad("`input` must be a string or a list of strings.", "input")
    if len(items) > MAX_INPUTS:
        raise bad(
            f"`input` holds {len(items):,} strings; at most {MAX_INPUTS} are accepted per "
            "request. Send them in smaller batches.",
            "input",
        )
    total = 0
    for i, text in enumerate(items):
        where = "`input`" if isinstance(value, str) else f"`input[{i}]`"
        if not text:
            raise bad(f"{where} is an empty string; every input must hold some text.", "input")
        if len(text) > MAX_INPUT_CHARS:
            raise bad(
                f"{where} is {len(text):,} characters long; at most {MAX_INPUT_CHARS:,} are "
                "accepted. Split the text into smaller pieces.",
                "input",
            )
        total += len(text)
    if total > MAX_TOTAL_CHARS:
        raise bad(
            f"`input` holds {total:,} characters in all; at most {MAX_TOTAL_CHARS:,} are "
            "accepted per request. Send them in smaller batches.",
            "input",
        )
    return tuple(items)


# -- the job ---------------------------------------------------------------------------------


def no_embedder() -> ApiError:
    """The 503 of a server started without an embedding model (a retry cannot help)."""
    return ApiError(
        503, NO_EMBEDDER, code="embedder_not_available", headers={"x-should-retry": "false"}
    )


def embedding_job(req: EmbedRequest, stop: threading.Event) -> Callable[[TextEmbedder], Embedded]:
    """The worker's job for ``req``: checks ``dimensions``, counts, embeds."""

    def job(embedder: TextEmbedder) -> Embedded:
        dim = embedder.dim
        if req.dimensions is not None and req.dimensions != dim:
            raise bad(
                f"`dimensions` is {req.dimensions}, but {embedder.name!r} makes vectors of "
                f"{dim} dimensions only; leave `dimensions` out or send {dim}.",
                "dimensions",
            )
        tokens = sum(embedder.count_tokens(t) for t in req.texts)
        vectors = np.asarray(embedder.embed(req.texts, stop=stop), dtype=np.float32)
        return Embedded(embedder.name, vectors, tokens)

    return job


async def run_embedding(
    service: EmbedService, req: EmbedRequest, receive: Receive
) -> Embedded | None:
    """The job's result, awaited off the loop; None if the client went away first (the
    job is then stopped). A failure of the model becomes an ``ApiError``."""
    stop = threading.Event()
    future = service.submit(embedding_job(req, stop), urgent=True)
    outcome: list[Embedded] = []
    failure: list[BaseException] = []
    gone = False
    async with anyio.create_task_group() as group:

        async def watch() -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            gone = True
            group.cancel_scope.cancel()

        group.start_soon(watch)
        try:
            outcome.append(await asyncio.wrap_future(future))
        except Exception as exc:  # raised below, outside the task group
            failure.append(exc)
        finally:
            if not outcome:  # the client left, or the server is stopping
                stop.set()
                future.cancel()
            group.cancel_scope.cancel()
    if gone and not outcome:
        return None
    if failure:
        raise api_error(failure[0])
    return outcome[0]


def api_error(exc: BaseException) -> BaseException:
    """The error a job's failure answers with (other exceptions stay 500s)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ModelFileError):  # EmbedderError: the worker's load failed
        text = str(exc)
        if not text[:1].isupper():  # a reason, not a sentence of its own
            text = f"The embedding model cannot be used: {text}"
        return ApiError(
            503,
            text,
            code="embedder_not_available",
            headers={"x-should-retry": "false"},
        )
    if isinstance(exc, DocumentCancelled):
        return ApiError(
            503,
            "The embedding was stopped because the server is stopping; try again shortly.",
            code="server_shutting_down",
            headers={"Retry-After": "2"},
        )
    return exc


# -- the answer ------------------------------------------------------------------------------


def response_json(req: EmbedRequest, result: Embedded) -> bytes:
    """The response body (built on the parser thread: 256 vectors as JSON take a while)."""
    vectors = np.nan_to_num(result.vectors, nan=0.0, posinf=0.0, neginf=0.0)
    data = [
        {"object": "embedding", "index": i, "embedding": _encoded(row, req.encoding)}
        for i, row in enumerate(vectors)
    ]
    body = {
        "object": "list",
        "data": data,
        "model": result.name,
        "usage": {"prompt_tokens": result.tokens, "total_tokens": result.tokens},
    }
    return json.dumps(body, separators=(",", ":")).encode()


def _encoded(row: npt.NDArray[np.float32], encoding: Encoding) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(row.astype("<f4").tobytes()).decode("ascii")
    return [float(x) for x in row.tolist()]
