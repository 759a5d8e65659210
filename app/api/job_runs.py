"""Running an ``ApiJob`` for an HTTP request: queued on the host's line, its events
back on the event loop, and its answer whole or streamed (``JobRuns``), whatever the
API's dialect (OpenAI's chunks, Anthropic's events: a ``StreamWriter``).

Tokens come back from the engine thread through ``job.emit``, which posts them to
this request's ``asyncio.Queue`` with ``call_soon_threadsafe``. A streamed response
starts (200) only with its first token: a job that fails before it gets its real
status code; a failure after it, or a reply cut short (``errors.cut_short``), is the
dialect's error event. A client that goes away, while waiting or while streaming,
sets ``job.stop`` and is dropped from the queue.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import anyio
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from app.api.errors import ApiError, cut_short
from app.api.gateway import ApiEvent, ApiFailure, ApiJob
from app.api.requests import ApiRequests, QueueFull
from app.api.schema import ApiRequest
from app.engine.backend import Finished, Token


class StreamWriter(Protocol):
    """The bytes of one streamed answer, in an API's dialect."""

    def start(self) -> bytes:
        """What opens the stream (sent with the first token)."""

    def token(self, text: str, reasoning: bool = False) -> bytes:
        """A piece of the answer, or of its thinking."""

    def finish(self, done: Finished) -> bytes:
        """The end: calls, finish reason, usage, the closing event."""

    def failure(self, failure: ApiFailure) -> bytes:
        """A failure after the stream began: the dialect's error event."""


class Body(Protocol):
    def body(self, done: Finished) -> dict[str, Any]:
        """The whole answer."""


Shape = Callable[[ApiRequest, ApiJob, dict[str, Any] | None], tuple[Body, StreamWriter]]


def make_emit(
    loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[ApiEvent], job: ApiJob
) -> Callable[[ApiEvent], None]:
    """``job.emit``: thread-safe and never blocking; a closed loop stops the job."""

    def emit(event: ApiEvent) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody listens any more
            job.stop.set()

    return emit


def terminal(event: ApiEvent) -> bool:  # the job's relay lets exactly one through
    return isinstance(event, Finished | ApiFailure)


def ending(job: ApiJob, event: ApiEvent) -> ApiEvent:
    """``event``, or the failure a reply cut short becomes."""
    if isinstance(event, Finished):
        return cut_short(job, event) or event
    return event


class JobStream(StreamingResponse):
    """A streamed reply whose end, however it comes (a disconnect included), runs
    ``on_close``: the job is stopped and dropped from the line (nothing, once it ended)."""

    def __init__(
        self, content: AsyncIterator[bytes], on_close: Callable[[], None], headers: dict[str, str]
    ) -> None:
        super().__init__(content, media_type="text/event-stream", headers=headers)
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


class JobRuns:
    """Queues jobs on ``requests`` and waits for their answers (a job may wait
    ``max_wait_s`` in the line before it is given up)."""

    def __init__(self, requests: ApiRequests, max_wait_s: float) -> None:
        self.requests = requests
        self.max_wait_s = max_wait_s

    async def run(
        self, request: Request, job: ApiJob, first_token: bool
    ) -> tuple[asyncio.Queue[ApiEvent], list[ApiEvent] | None]:
        """Queue ``job`` and wait for its answer (or its first token): its queue and
        events, the last one as the client sees it; None when the client went away."""
        queue: asyncio.Queue[ApiEvent] = asyncio.Queue()
        job.emit = make_emit(asyncio.get_running_loop(), queue, job)
        try:
            self.requests.enqueue(job)
        except QueueFull as exc:
            wait = str(self.requests.retry_after())
            raise ApiError(429, str(exc), headers={"Retry-After": wait}) from exc
        events = await self.wait(request, job, queue, first_token)
        if events is not None:
            events[-1] = ending(job, events[-1])
        return queue, events

    async def wait(
        self,
        request: Request,
        job: ApiJob,
        queue: asyncio.Queue[ApiEvent],
        first_token: bool,
    ) -> list[ApiEvent] | None:
        """Events up to the terminal one (or the first token), or None if the client left."""
        events: list[ApiEvent] = []
        gone = timed_out = False
        async with anyio.create_task_group() as group:

            async def watch() -> None:
                nonlocal gone
                while (await request.receive())["type"] != "http.disconnect":
                    pass
                gone = True
                group.cancel_scope.cancel()

            group.start_soon(watch)
            try:
                while True:
                    event = await self.next_event(job, queue, waited=bool(events))
                    if event is None:
                        timed_out = True
                        break
                    events.append(event)
                    if terminal(event) or (first_token and isinstance(event, Token)):
                        break
            finally:
                answered = bool(events) and (
                    terminal(events[-1]) or (first_token and isinstance(events[-1], Token))
                )
                if not answered:  # the client left, or the server is stopping
                    self.requests.abandon(job)
            group.cancel_scope.cancel()
        if timed_out and not gone:
            raise self.queue_timeout()
        return None if gone else events

    async def next_event(
        self, job: ApiJob, queue: asyncio.Queue[ApiEvent], waited: bool
    ) -> ApiEvent | None:
        """The job's next event; None when it is still queued after ``max_wait_s``
        (its place is given up)."""
        if waited:
            return await queue.get()
        with anyio.move_on_after(self.max_wait_s):
            return await queue.get()
        if self.requests.withdraw(job):
            return None
        return await queue.get()  # it runs (a long prompt, say): its answer comes

    def queue_timeout(self) -> ApiError:
        wait = self.requests.retry_after()
        return ApiError(
            503,
            f"The request waited {self.max_wait_s:g} s in the queue without starting; "
            f"try again in {wait} s.",
            code="queue_timeout",
            headers={"Retry-After": str(wait)},
        )

    def stream(
        self,
        job: ApiJob,
        queue: asyncio.Queue[ApiEvent],
        first: list[ApiEvent],
        writer: StreamWriter,
    ) -> Response:
        def write(events: list[ApiEvent]) -> tuple[bytes, bool]:
            """The events' bytes, and whether the last was the reply's end."""
            out = bytearray()
            for event in map(lambda e: ending(job, e), events):
                if isinstance(event, Token):
                    out += writer.token(event.text, event.reasoning)
                elif isinstance(event, Finished):
                    return bytes(out + writer.finish(event)), True
                elif isinstance(event, ApiFailure):
                    return bytes(out + writer.failure(event)), True
            return bytes(out), False

        async def body() -> AsyncIterator[bytes]:
            chunk, ended = write(first)
            yield writer.start() + chunk
            while not ended:
                events = [await queue.get()]
                while not queue.empty():  # what arrived meanwhile goes out in one send
                    events.append(queue.get_nowait())
                chunk, ended = write(events)
                yield chunk

        def on_close() -> None:
            # A stream cut before its end stops its job; a job that ended is left as it is.
            self.requests.abandon(job)

        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return JobStream(body(), on_close, headers)
