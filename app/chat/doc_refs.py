"""A conversation's attached documents and collections, and a message's passages, as
stored in its transcript: read defensively, shown in Markdown exports."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.documents.sources import sources_from_list

MAX_DOCUMENTS = 500  # attached to one conversation (a folder's files each count)
MAX_COLLECTIONS = 32
_PATH_MAX = 4096
_NAME_MAX = 80


def _strings(value: Any, limit: int, length: int) -> list[str]:
    if not isinstance(value, list):
        return []
    out: list[str] = []
    for item in value[: limit * 2]:
        ok = isinstance(item, str) and item and len(item) <= length and "\x00" not in item
        if ok and item not in out:
            out.append(item)
    return out[:limit]


def read_paths(value: Any) -> list[str]:
    """The attached documents' paths of a saved conversation (bad entries skipped)."""
    return _strings(value, MAX_DOCUMENTS, _PATH_MAX)


def read_names(value: Any) -> list[str]:
    """The attached collections' names of a saved conversation (bad entries skipped)."""
    return _strings(value, MAX_COLLECTIONS, _NAME_MAX)


def read_sources(value: Any) -> list[dict[str, Any]]:
    """A saved user turn's passages, each read defensively (``sources_from_list``)."""
    return [s.to_dict() for s in sources_from_list(value)]


def sources_markdown(sources: Sequence[dict[str, Any]]) -> list[str]:
    """A message's passages as Markdown lines for an export ("" when there are none)."""
    found = sources_from_list(list(sources))
    if not found:
        return []
    return ["*Sources:*", "", *(f"- [{s.n}] {s.where()}" for s in found), ""]


def given_whole(messages: Sequence[Any], edit_index: int | None = None) -> set[str]:
    """The documents already in the conversation whole (in a user turn's passages that
    the model still remembers): the KV cache holds them, so they are not given again.
    ``edit_index``: the message being edited; an edit drops what follows it, and the
    edited message keeps its whole documents (``user_turn.edited_turn``)."""
    out: set[str] = set()
    for m in messages if edit_index is None else messages[: edit_index + 1]:
        if getattr(m, "forgotten", False):  # dropped from the context: give it again
            continue
        for s in sources_from_list(getattr(m, "sources", [])):
            if s.whole:
                out.add(s.path)
    return out
