"""A chat in a project (issue 44): what it starts from.

A new chat in a project takes the project's instructions, with its pinned documents
given whole after them, as its system prompt, and names the project
(``Conversation.project_id``). The chat keeps that text as it was: a later change of the
project leaves its chats (and their caches) as they are, and only new chats start from
the new opening (``app/host/prefixes.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from app.chat.conversation import Conversation
from app.chat.projects import Project
from app.config.setting_records import SamplingParams
from app.documents.sources import source_from_dict
from app.engine.tool_spec import AUTO, REQUIRED, ToolRequest, ToolSpec
from app.mcp.tool_host import McpTool


def system_text(project: Project) -> str:
    """The system prompt of a new chat in ``project``: its instructions, then each
    pinned document whole, named."""
    parts = [project.instructions.strip()] if project.instructions.strip() else []
    for entry in project.pinned:
        source = source_from_dict(entry)
        if source is None or not source.text.strip():
            continue
        parts.append(f"Pinned document: {source.where()}\n{source.text.strip()}")
    return "\n\n".join(parts)


def new_conversation(project: Project) -> Conversation:
    """An empty chat in ``project``."""
    return Conversation(
        system_prompt=system_text(project),
        project_id=project.id,
        collections=list(project.collections),
    )


def offered_tools(
    project: Project | None, listed: Sequence[McpTool]
) -> tuple[list[McpTool], list[str]]:
    """The tools a reply in ``project``'s chat is offered, of those the MCP host
    ``listed`` (switched on, servers ready), and the project's tools that are not there.

    A project that chose tools offers only those, in its order (its opening was read
    with them in that order); one that chose none offers every listed tool, by name (the
    order does not hang on which server started first); a chat in no project offers
    them as listed.
    """
    if project is None:
        return list(listed), []
    if not project.mcp_tools:
        return sorted(listed, key=lambda t: t.qualified), []
    by_name = {t.qualified: t for t in listed}
    offered = [by_name[n] for n in project.mcp_tools if n in by_name]
    return offered, [n for n in project.mcp_tools if n not in by_name]


def stored_tools(project: Project) -> tuple[ToolSpec, ...]:
    """The tools ``project`` chose, as last listed (``Project.tool_specs``), in its
    order: what its opening is read with before any server has started."""
    specs = {str(s["name"]): s for s in project.tool_specs}
    return tuple(
        ToolSpec(n, str(specs[n]["description"]), dict(specs[n]["parameters"]))
        for n in project.mcp_tools
        if n in specs
    )


def opening_request(
    project: Project, app_tools: Sequence[ToolSpec], params: SamplingParams
) -> ToolRequest | None:
    """The tools a new chat in ``project`` offers in its first round (as
    ``tool_request`` words it), for reading its opening ahead: the project's stored
    ones, or when it chose none ``app_tools`` (those switched on in the app now)."""
    specs = stored_tools(project) if project.mcp_tools else tuple(sorted(app_tools, key=_name))
    if params.tools == "off" or not specs:
        return None
    return ToolRequest(specs, REQUIRED if params.tools == "required" else AUTO, parallel=True)


def _name(spec: ToolSpec) -> str:
    return spec.name
