"""A chat in a project (issue 44): what it starts from.

A new chat in a project takes the project's instructions, with its pinned documents
given whole after them, as its system prompt, and names the project
(``Conversation.project_id``). The chat keeps that text as it was: a later change of the
project leaves its chats (and their caches) as they are, and only new chats start from
the new opening (``app/host/prefixes.py``).
"""

from __future__ import annotations

from app.chat.conversation import Conversation
from app.chat.projects import Project
from app.documents.sources import source_from_dict


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
