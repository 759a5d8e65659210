"""The user turn a send makes when it replaces one: an unanswered message merged with the
new text (after a failed reply), or an edited message. What each keeps of the pictures
and passages the old one had, so that no document the model was given is lost."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from app.chat.conversation import Message
from app.documents.sources import MAX_SOURCES, Source, sources_from_list


def merge_sources(*groups: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The passages of every group, each once, numbered again from 1.

    A passage repeated (same file and chunk) is kept once; a passage of a document that
    is also there whole is left out (the whole text holds it). Whole documents come
    first; past ``MAX_SOURCES`` (what a transcript reads back) the last passages go.
    """
    every = [s for g in groups for s in sources_from_list(list(g))]
    whole = {s.path for s in every if s.whole}
    seen: set[tuple[str, int, bool]] = set()
    kept: list[Source] = []
    for s in sorted(every, key=lambda s: not s.whole):  # stable: order kept within each
        key = (s.path, s.chunk, s.whole)
        if key in seen or (not s.whole and s.path in whole):
            continue
        seen.add(key)
        kept.append(s)
    return [replace(s, n=i).to_dict() for i, s in enumerate(kept[:MAX_SOURCES], 1)]


def merged_turn(
    last: Message, text: str, images: list[dict[str, Any]], sources: list[dict[str, Any]]
) -> Message:
    """``last`` (a user turn left without a reply) with ``text`` after its own, its
    pictures then ``images``, and the passages of both (``merge_sources``)."""
    both = "\n\n".join(t for t in (last.content, text) if t)
    merged = Message("user", both, created=last.created, images=last.images + images)
    merged.sources = merge_sources(last.sources, sources) if sources else list(last.sources)
    merged.id = last.id
    return merged


def edited_turn(
    old: Message, text: str, images: list[dict[str, Any]], sources: list[dict[str, Any]]
) -> Message:
    """The new version of ``old``: ``text``, its pictures unless new ones are given, and
    its passages unless new ones are found. The documents it had whole stay with it
    either way: the search for the new text skips them (``doc_refs.given_whole``)."""
    if sources:
        had_whole = [s for s in old.sources if s.get("whole") is True]
        sources = merge_sources(had_whole, sources)
    return Message("user", text, images=images or old.images, sources=sources or old.sources)
