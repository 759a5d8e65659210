"""A project exported with its chats, and imported back (issue 44, item 5).

    {"lamplight_project": 1, "project": {...}, "conversations": [{...}, ...]}

Markdown is for reading: the project's settings and instructions, then each chat as
``transcript_markdown`` writes it. JSON comes back in: a new project (a new id, its
name made unique), each chat a new conversation in it. Like an imported chat
(``import_review``), an imported project could reach outside itself: its pinned
documents and adapters name paths on this computer, its model a file or a server
connection, its tools the user's MCP servers, its API switch would open it to
clients. All of it is held back (``ProjectHeld``) until the user confirms the list;
its chats' own documents, collections and tools likewise, each chat on its own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from app.chat.conversation import Conversation, ConversationError, new_id
from app.chat.import_review import HeldBack
from app.chat.projects import NAME_MAX, Project, ProjectError, ProjectStore
from app.chat.store import ConversationStore
from app.chat.transcript_markdown import to_markdown
from app.util.datafiles import DataFileError, parse_json, reason

FORMAT = 1
MAX_BYTES = 256 * 1024 * 1024  # a project's chats, each at most a transcript's size
MAX_DEPTH = 48  # a chat nests 40 deep, one level under the bundle
MAX_CHATS = 10_000


@dataclass
class ProjectHeld:
    """What ``import_bundle`` took out of an imported project, for the user to confirm."""

    pinned: list[dict[str, Any]] = field(default_factory=list)
    collections: list[str] = field(default_factory=list)
    model: dict[str, Any] = field(default_factory=dict)
    lora: list[dict[str, Any]] = field(default_factory=list)
    mcp_tools: list[str] = field(default_factory=list)
    tool_specs: list[dict[str, Any]] = field(default_factory=list)
    api: bool = False

    def __bool__(self) -> bool:
        return bool(
            self.pinned or self.collections or self.model or self.lora or self.mcp_tools
        ) or (self.api)

    def lines(self) -> list[str]:
        """What the confirmation lists, one item a line (paths shown as they are)."""
        out = [f"Pinned document: {p.get('path', '')}" for p in self.pinned]
        out += [f"Collection of yours: {name}" for name in self.collections]
        if self.model.get("path"):
            out.append(f"Model file: {self.model['path']}")
        elif self.model.get("connection"):
            out.append(f"Server connection: {self.model['connection']}")
        out += [f"LoRA adapter: {entry.get('path', '')}" for entry in self.lora]
        if self.mcp_tools:
            out.append(f"Tools: replies may call {', '.join(self.mcp_tools)}")
        if self.api:
            out.append("Reachable through the local API server")
        return out


@dataclass
class ImportedProject:
    """A project imported from a bundle, saved without what was held back."""

    project: Project
    held: ProjectHeld
    chats: list[tuple[Conversation, HeldBack]]


def export_json(project: Project, chats: list[Conversation]) -> str:
    """The bundle for ``project`` and its ``chats``."""
    body = {
        "lamplight_project": FORMAT,
        "project": project.to_dict(),
        "conversations": [c.to_dict() for c in chats],
    }
    return json.dumps(body, ensure_ascii=False, indent=1)


def export_markdown(project: Project, chats: list[Conversation]) -> str:
    """The project's settings and instructions, then each chat, for reading."""
    lines = [f"# Project: {project.name}", ""]
    if project.model:
        lines.append(f"- Model: {project.model.get('name') or project.model.get('connection')}")
    if project.preset:
        lines.append(f"- Preset: {project.preset}")
    lines += [f"- LoRA adapter: {e.get('name', e.get('path', ''))}" for e in project.lora]
    lines += [f"- Tool: {name}" for name in project.mcp_tools]
    lines += [f"- Pinned document: {p.get('name', '')}" for p in project.pinned]
    lines += [f"- Collection: {name}" for name in project.collections]
    if project.instructions.strip():
        lines += ["", "## Instructions", "", project.instructions.strip()]
    for conv in chats:
        lines += ["", "---", "", to_markdown(conv)]
    return "\n".join(lines).rstrip("\n") + "\n"


def import_bundle(text: str, projects: ProjectStore, store: ConversationStore) -> ImportedProject:
    """A project and its chats from an exported bundle, saved as new ones, without what
    would reach outside them (``ProjectHeld``, each chat's ``HeldBack``).

    Raises:
        ProjectError: not a project bundle, or a damaged one (nothing is saved then).
        OSError: a file could not be written.
    """
    if len(text) > MAX_BYTES:
        raise ProjectError("The project file is too large to import.")
    try:
        data = parse_json(text, MAX_DEPTH)
    except DataFileError as exc:
        raise ProjectError(f"The file is not a project ({reason(exc)}).") from exc
    if not isinstance(data, dict) or data.get("lamplight_project") != FORMAT:
        raise ProjectError("The file is not a Lamplight project export.")
    raw, chats = data.get("project"), data.get("conversations", [])
    if not isinstance(raw, dict) or not isinstance(chats, list) or len(chats) > MAX_CHATS:
        raise ProjectError("The project file is damaged (its project or its chats).")
    project = Project.from_dict({**raw, "id": new_id()}, where="imported project")
    project.name = _unique(project.name, {row.name for row in projects.list()})
    held = _hold_back(project)
    projects.save(project)  # saved without: a crash before the user answers keeps none
    imported = []
    for entry in chats:
        try:
            conv, chat_held = store.import_data(entry)
        except ConversationError:
            continue  # one damaged chat does not cost the others
        imported.append((store.set_project(conv.id, project.id), chat_held))
    return ImportedProject(project, held, imported)


def restore_project(project: Project, held: ProjectHeld) -> None:
    """Give ``project`` back what the import held back (the user confirmed the list)."""
    project.pinned = [*project.pinned, *held.pinned]
    project.collections = [*project.collections, *held.collections]
    project.model = held.model or project.model
    project.lora = [*project.lora, *held.lora]
    project.mcp_tools = [*project.mcp_tools, *held.mcp_tools]
    project.tool_specs = [*project.tool_specs, *held.tool_specs]
    project.api = project.api or held.api


def _hold_back(project: Project) -> ProjectHeld:
    held = ProjectHeld(
        pinned=project.pinned,
        collections=project.collections,
        model=project.model,
        lora=project.lora,
        mcp_tools=project.mcp_tools,
        tool_specs=project.tool_specs,
        api=project.api,
    )
    project.pinned, project.collections, project.model, project.lora = [], [], {}, []
    project.mcp_tools, project.tool_specs, project.api = [], [], False
    return held


def _unique(name: str, taken: set[str]) -> str:
    """``name``, or ``name (2)``, ``name (3)``... the first that no project has."""
    if name not in taken:
        return name
    name = name[: NAME_MAX - 8].rstrip()  # room for the number within the limit
    n = 2
    while f"{name} ({n})" in taken:
        n += 1
    return f"{name} ({n})"
