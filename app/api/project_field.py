"""The API's ``project`` extension field (issue 44): a chat request may name a project
shared with the API (by id or name), to be answered with the project's instructions and
pinned documents as its system turn and its tools (unless it sends its own), starting
from the project's warm opening.

A project is reached only when its "Reachable through the API" switch is on
(``Project.api``); another name gets the one answer a missing project gets (404
``project_not_found``), so the API does not tell which private projects exist. A
request that names a project and sends its own system (or developer) message is
refused (400 ``project_conflict``): the two are never merged silently. The one
system message it may send is the summary a compaction returned (``compaction.system``,
which starts with ``SUMMARY_HEADING``): it is put after the project's instructions.
"""

from __future__ import annotations

from typing import Any

from app.api.errors import ApiError, bad
from app.api.gateway import ProjectView
from app.chat.conversation import SUMMARY_HEADING
from app.engine.chat_message import ChatMessage
from app.engine.tool_spec import AUTO, ToolRequest

MAX_CHARS = 128


def read_project(data: dict[str, Any]) -> str:
    """The request's ``project`` ("" when it names none).

    Raises:
        ApiError: 400 when it is not a string of at most ``MAX_CHARS`` characters.
    """
    value = data.get("project")
    if value is None or value == "":
        return ""
    if not isinstance(value, str) or len(value) > MAX_CHARS:
        raise bad(
            f"`project` must be a project's id or name, a string of at most {MAX_CHARS} "
            "characters.",
            "project",
        )
    return value


def with_project(
    view: ProjectView | None, ref: str, messages: list[ChatMessage]
) -> list[ChatMessage]:
    """``messages`` after the project's system turn.

    Raises:
        ApiError: 404 (no such project shared with the API), 400 (the request has its
            own system message).
    """
    if view is None:
        raise ApiError(
            404,
            f"No project {ref!r} is shared with the API (in Lamplight: Chat → Projects…, "
            "“Reachable through the API”).",
            code="project_not_found",
            param="project",
        )
    if messages and summary_message(messages[0]):
        system = "\n\n".join(t for t in (view.system_text, messages[0].content) if t.strip())
        messages = messages[1:]
    else:
        system = view.system_text
    if any(m.role in ("system", "developer") for m in messages):
        raise bad(
            "A request that names a project takes its instructions from the project: "
            "leave out the system message, or the `project` field.",
            "project",
            "project_conflict",
        )
    return [ChatMessage("system", system), *messages] if system else messages


def summary_message(message: ChatMessage) -> bool:
    """Whether ``message`` is the summary a compaction returned for a project's chat."""
    return message.role == "system" and message.content.startswith(SUMMARY_HEADING)


def project_tools(view: ProjectView | None, tools: ToolRequest | None) -> ToolRequest | None:
    """What a request naming the project offers: its own ``tools`` when it has some
    (with its ``tool_choice``), else the project's."""
    if view is None or not view.tools or tools is not None:
        return tools
    return ToolRequest(view.tools, AUTO, parallel=True)
