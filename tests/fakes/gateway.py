"""A scripted ``EngineGateway`` for fast API server tests (mypy checks the protocol
through ``as_gateway``)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path

from app.api.gateway import ApiFailure, ApiJob, EngineGateway, ProjectView
from app.api.host_gateway import reply_job
from app.config.setting_records import SamplingParams
from app.engine.backend import Finished, ModelInfo, Token
from app.engine.chat_message import ChatMessage, ToolCall
from app.engine.metrics import MessageMetrics
from app.engine.tool_spec import ToolRequest
from app.host.jobs import ReplyEvent, ReplyFailed, ReplyJob
from app.host.line import ReplyLine


class Scripted(Exception):
    """A ``FakeGateway`` failure that reaches the client as the ``ApiFailure`` it holds."""

    def __init__(self, failure: ApiFailure) -> None:
        super().__init__(failure.message)
        self.failure = failure


class FakeGateway:
    """A scripted ``EngineGateway`` for fast server tests: the host's ``ReplyLine`` in
    front of one worker thread that runs the jobs handed to it (``submitted``) in order,
    emitting ``tokens`` ``delay`` seconds apart and honouring ``job.stop``; ``fail`` ends
    a job with an ``ApiFailure`` after ``fail_after`` tokens.
    ``tool_calls``: a job offered tools ends asking for these (its tokens the text
    before them), unless its last message is a tool result. ``close()`` joins its thread."""

    def __init__(
        self,
        tokens: Sequence[str] = ("Hello", " there", ",", " friend", "."),
        delay: float = 0.0,
        path: Path = Path("/models/gemma-3-270m-it-Q4_K_M.gguf"),
    ) -> None:
        self.tokens = list(tokens)
        self.delay = delay
        self.fail: ApiFailure | None = None
        self.fail_after = 0
        self.stop_reason = "eos"
        self.stop_match = ""  # the stop string a "stop_string" reply ended on
        self.thinking: list[str] = []  # thinking tokens, before the answer's
        self.responses: Path | None = None  # where /v1/responses stores (None: nowhere)
        self.cached_tokens = 3
        self.is_loading = False
        self.projects: dict[str, ProjectView] = {}  # shared with the API, by id and name
        self.tool_calls: tuple[ToolCall, ...] = ()
        self.submitted: list[ApiJob] = []  # jobs the line handed to the worker
        self.started: list[ApiJob] = []  # jobs the worker began to run
        self._asked: dict[str, ApiJob] = {}  # a reply's id -> its request
        self.release = threading.Event()  # cleared: a job waits for it before its first token
        self.release.set()
        self.info: ModelInfo | None = ModelInfo(
            path=path,
            name="Gemma 3 270M",
            architecture="gemma3",
            n_params=270_000_000,
            file_size=1,
            n_ctx=2048,
            n_ctx_train=32768,
            n_threads=1,
            n_gpu_layers=0,
            template="gemma",
            backend="CPU",
            load_ms=1.0,
        )
        self.line = ReplyLine(self.submit)
        self._jobs: queue.Queue[ReplyJob | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="fake-gateway", daemon=True)
        self._thread.start()

    def model(self) -> ModelInfo | None:
        return self.info

    def loading(self) -> bool:
        return self.is_loading

    def project(self, ref: str) -> ProjectView | None:
        return self.projects.get(ref)

    def response_folder(self) -> Path | None:
        return self.responses

    def count(
        self, messages: list[ChatMessage], params: SamplingParams, tools: ToolRequest | None
    ) -> Future[int]:
        """A word per token, as ``_one`` counts a prompt."""
        done: Future[int] = Future()
        done.set_result(sum(len(m.content.split()) + 2 for m in messages))
        return done

    def join(self, job: ApiJob, limit: int) -> int:
        reply = reply_job(job)
        self._asked[job.id] = job
        api_sink = reply.sink

        def sink(event: ReplyEvent) -> None:  # a scripted ApiFailure goes as it is
            if isinstance(event, ReplyFailed) and isinstance(event.error, Scripted):
                job.emit(event.error.failure)
            else:
                api_sink(event)

        return self.line.join(replace(reply, sink=sink), limit)

    def submit(self, job: ReplyJob) -> None:
        self.submitted.append(self._asked[job.id])
        self._jobs.put(job)

    def close(self) -> None:
        self._jobs.put(None)
        self.release.set()
        self._thread.join(5)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            self.started.append(self._asked[job.id])
            self._one(job)

    def _one(self, job: ReplyJob) -> None:
        t0 = time.perf_counter()
        prompt = sum(len(m.content.split()) + 2 for m in job.messages)
        metrics = MessageMetrics(
            prompt_tokens=prompt,
            cached_tokens=min(self.cached_tokens, prompt),
            evaluated_tokens=prompt - min(self.cached_tokens, prompt),
            prefill_ms=2.0,
            n_ctx=2048,
        )
        while not self.release.wait(0.01):
            if job.stop.is_set():
                break
        parts: list[str] = []
        for text in self.thinking:
            metrics.generated_tokens += 1
            job.relay.send(Token(text, reasoning=True))
        thought = "".join(self.thinking)
        for i, text in enumerate(self.tokens[: job.params.max_tokens]):
            if self.fail is not None and i >= self.fail_after:
                job.relay.send(ReplyFailed(Scripted(self.fail)))
                return
            if job.stop.is_set():
                metrics.stop_reason = "cancelled"
                job.relay.send(Finished("".join(parts), metrics))
                return
            if self.delay:
                job.stop.wait(self.delay)
            parts.append(text)
            metrics.generated_tokens += 1
            metrics.token_times_ms.append((time.perf_counter() - t0) * 1000 + i)
            job.relay.send(Token(text))
        if self.fail is not None:
            job.relay.send(ReplyFailed(Scripted(self.fail)))
            return
        limited = len(self.tokens) > job.params.max_tokens
        metrics.stop_reason = "max_tokens" if limited else self.stop_reason
        metrics.stop_match = self.stop_match if metrics.stop_reason == "stop_string" else ""
        calling = self.tool_calls and job.tools and job.tools.active
        if calling and not limited and job.messages[-1].role != "tool":
            metrics.stop_reason = "tool_calls"
            calls = self.tool_calls
            job.relay.send(Finished("".join(parts), metrics, thought, tool_calls=calls))
            return
        job.relay.send(Finished("".join(parts), metrics, thought))


def as_gateway(fake: FakeGateway) -> EngineGateway:
    """The fake where an EngineGateway is wanted (mypy checks the protocol)."""
    return fake
