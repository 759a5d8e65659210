"""A conversation as Markdown (``to_markdown``), and its pictures copied beside the file
(``export_images``): what "Export" writes. No metrics, no cache."""

from __future__ import annotations

import re
from pathlib import Path

from app.chat.conversation import Conversation, Message
from app.chat.doc_refs import sources_markdown
from app.chat.image_store import ImageStore, copy_images, markdown_image
from app.chat.tool_records import RESULT_CHARS, calls_markdown, result_markdown


def to_markdown(conv: Conversation) -> str:
    """The conversation as Markdown text (no metrics, no cache); the versions not shown
    follow under "Other versions", each after the message it branches from."""
    lines = [f"# {conv.title or 'Conversation'}", ""]
    if conv.model_name:
        lines += [f"*Model: {conv.model_name}*", ""]
    if conv.system_prompt.strip():
        lines += ["**System**", "", conv.system_prompt.strip(), ""]
    names = {"user": "You", "assistant": "Assistant", "system": "System", "tool": "Tool"}
    for i, m in enumerate(conv.messages):
        position, count = conv.version_of(i)
        version = f" *(version {position} of {count})*" if count > 1 else ""
        lines += [f"**{_who(m, names)}**{version}", "", *_body(m)]
    if conv.alternatives:
        lines += ["---", "", "## Other versions", ""]
        where = {m.id: m for m in conv.every_message()}
        for n, b in enumerate(conv.alternatives, 1):
            parent = where.get(b.after)
            start = "the start" if parent is None else f"“{' '.join(parent.content.split())[:40]}”"
            lines += [f"### Version {n + 1} after {start}", ""]
            for m in b.messages:
                lines += [f"**{_who(m, names)}**", "", *_body(m)]
    return "\n".join(lines).rstrip() + "\n"


def _who(m: Message, names: dict[str, str]) -> str:
    """A message's heading: who wrote it, and whether it is a compaction's summary or
    summarised in one (``app.chat.compaction``)."""
    if m.summary_of:
        return "Summary of the earlier messages"
    name = names.get(m.role, m.role)
    return f"{name} (summarised)" if m.summarised else name


# Tags in the thinking that would end the collapsed section early, open another, or
# swallow its closing tag (raw text elements, a comment): written as text, not HTML.
_SECTION_TAGS = re.compile(
    r"<(/?(?:details|summary|pre|script|style|textarea|title|xmp)\b|!--)", re.IGNORECASE
)


def _body(m: Message) -> list[str]:
    """A message's Markdown lines: its pictures, its thinking (if any) as a collapsed
    section, then its text. Tags in the thinking cannot close the section or open
    another one."""
    if m.images or m.sources:
        pics = [*(markdown_image(r) for r in m.images), ""] if m.images else []
        return [*pics, m.content.strip(), "", *sources_markdown(m.sources)]
    if m.role == "tool":
        return result_markdown(m.name, m.content[:RESULT_CHARS], m.is_error)
    calls = calls_markdown(m.tool_calls)
    thinking = m.reasoning.strip()
    if not thinking:
        return [m.content.strip(), "", *calls]
    safe = _closed_fence(_SECTION_TAGS.sub(r"&lt;\1", thinking))
    return [
        "<details><summary>Thinking</summary>",
        "",
        safe,
        "",
        "</details>",
        "",
        m.content.strip(),
        "",
        *calls,
    ]


def export_images(
    conv: Conversation, store: ImageStore, dest_dir: Path, notes: list[str] | None = None
) -> list[Path]:
    """Copy the pictures of ``conv`` (every version) into ``dest_dir/images/``, where the
    links of its ``to_markdown`` point; the files written. One that cannot be copied is
    skipped with a line in ``notes``.

    Raises:
        OSError: a file could not be written.
    """
    refs = [r for m in conv.every_message() for r in m.images]
    return copy_images(refs, store, dest_dir, [] if notes is None else notes)


_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})")


def _closed_fence(text: str) -> str:
    """``text`` with a code fence it leaves open closed (thinking cut off mid-code would
    otherwise hold the section's closing tag and the answer in its code block)."""
    fence = ""
    for line in text.splitlines():
        found = _FENCE.match(line)
        if found is None:
            continue
        mark = found.group(1)
        if not fence:
            fence = mark if mark[0] == "~" or "`" not in line[found.end() :] else ""
        elif mark[0] == fence[0] and len(mark) >= len(fence) and not line[found.end() :].strip():
            fence = ""
    return f"{text}\n{fence}" if fence else text
