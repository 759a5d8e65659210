"""``HostGateway``: the API server's ``EngineGateway`` over the engine host.

An ``ApiJob`` becomes a ``ReplyJob`` on the host's one queue, through its line of API
replies (``ReplyLine``): behind the API replies before it, and behind at most one of
them for a window reply. What the model is comes from the host's
backend itself, the one owner of "what is loaded"; while a load or connect runs
there is no model to serve. The host's events become the API's: tokens pass, prefill
progress is dropped, ``ReplyFailed`` becomes the ``ApiFailure`` that ``failure_for``
picks (the HTTP status is decided here, in ``app.api``, never in the host).
"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

from app.api.gateway import ApiJob, ProjectView, failure_for
from app.chat.project_chat import stored_tools, system_text
from app.chat.projects import ProjectError, ProjectStore
from app.config.setting_records import SamplingParams
from app.engine.backend import Finished, ModelInfo, Token
from app.engine.chat_message import ChatMessage
from app.engine.templates.override import PLAIN
from app.engine.tool_spec import ToolRequest
from app.host.host import EngineHost
from app.host.jobs import ReplyEvent, ReplyFailed, ReplyJob
from app.host.line import ReplyLine


class HostGateway:
    """``EngineGateway`` over an ``EngineHost``; every method may be called from any thread."""

    def __init__(self, host: EngineHost, projects: ProjectStore | None = None) -> None:
        self.host = host
        self.projects = projects  # None: no project is reachable (``project`` is a 404)

    def model(self) -> ModelInfo | None:
        if self.host.loading:  # the backend is being replaced: nothing to serve yet
            return None
        # The backend in use and its model are single attribute reads (atomic under
        # the GIL); the host swaps them on its own thread, and a job that started on a
        # model that is gone fails there with a clear message.
        return self.host.engine.model

    def loading(self) -> bool:
        return self.host.loading

    @property
    def line(self) -> ReplyLine:
        return self.host.line

    def join(self, job: ApiJob, limit: int) -> int:
        return self.host.line.join(reply_job(job), limit)

    def count(
        self, messages: list[ChatMessage], params: SamplingParams, tools: ToolRequest | None
    ) -> Future[int]:
        return self.host.count_prompt(messages, params, tools)

    def response_folder(self) -> Path | None:
        root = self.host.data_root
        return root / "responses" if root is not None else None

    def project(self, ref: str) -> ProjectView | None:
        if self.projects is None:
            return None
        for row in self.projects.list():
            if row.api and not row.error and ref in (row.id, row.name):
                try:
                    found = self.projects.load(row.id)
                except ProjectError:
                    return None
                if not found.api:
                    return None
                return ProjectView(found.id, system_text(found), stored_tools(found))
        return None


def reply_job(job: ApiJob) -> ReplyJob:
    """The host's job for an API request, checked against its model: a chat in the
    chat template chosen for the model (the window's, ``lamplight serve
    --chat-template``; the model's own when none was), a text completion plain."""

    def sink(event: ReplyEvent) -> None:
        if isinstance(event, Token | Finished):
            job.emit(event)
        elif isinstance(event, ReplyFailed):
            job.emit(failure_for(event.error))

    return ReplyJob(
        id=job.id,
        origin="api",
        messages=job.messages,
        params=job.params,
        sink=sink,
        stop=job.stop,
        model_id=job.model_id,
        template=PLAIN if job.kind == "completion" else "model",
        reuse=job.reuse,
        next_turn=job.kind == "chat",
        client=job.client,
        tools=job.tools,
        party=job.party,
        prefix=job.prefix,
        compaction=job.compaction,
        on_halt=job.halt,
    )
