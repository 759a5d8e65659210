"""What servers send back, made safe: tool lists, qualified names, call results.

A server is untrusted: at most ``MAX_TOOLS`` tools, descriptions and schemas bounded
(a tool whose schema is too big or too deep is left out, with a note), result text at
most ``MAX_RESULT_CHARS``; images and other binary blocks become a short placeholder.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from mcp import types

from app.mcp.tool_host import McpTool, ToolResult

MAX_TOOLS = 256
MAX_DESCRIPTION = 8 * 1024
MAX_SCHEMA_CHARS = 32 * 1024
MAX_SCHEMA_DEPTH = 16
MAX_RESULT_CHARS = 2_000_000  # the transcript keeps as much (tool_records.RESULT_CHARS)
MAX_STRUCTURED_CHARS = 1024 * 1024
_NAME_BAD = re.compile(r"[^A-Za-z0-9_-]")


def bounded_tools(server: str, listed: Sequence[types.Tool]) -> tuple[list[McpTool], list[str]]:
    """The usable tools of a listing (``qualified`` not yet set) and notes on the rest."""
    tools: list[McpTool] = []
    notes: list[str] = []
    seen: set[str] = set()
    if len(listed) > MAX_TOOLS:
        notes.append(f"only the first {MAX_TOOLS} of its {len(listed)} tools are used")
    for tool in listed[:MAX_TOOLS]:
        name = tool.name
        if not name or len(name) > 128 or name in seen:
            notes.append(f"a tool with a bad or repeated name ({name[:40]!r}) was left out")
            continue
        schema = tool.input_schema if isinstance(tool.input_schema, dict) else {}
        why = schema_problem(schema)
        if why:
            notes.append(f"the tool {name[:64]} was left out: its schema is {why}")
            continue
        seen.add(name)
        description = (tool.description or "")[:MAX_DESCRIPTION]
        tools.append(McpTool(server, name, name, description, schema))
    return tools, notes


def schema_problem(schema: Mapping[str, Any]) -> str:
    """Why a tool's input schema cannot be offered ("" when it can)."""
    if _depth(schema, 0) > MAX_SCHEMA_DEPTH:
        return f"nested deeper than {MAX_SCHEMA_DEPTH} levels"
    try:
        size = len(json.dumps(schema))
    except (TypeError, ValueError):
        return "not plain JSON"
    if size > MAX_SCHEMA_CHARS:
        return f"{size // 1024} KB, over the limit of {MAX_SCHEMA_CHARS // 1024} KB"
    return ""


def _depth(value: Any, level: int) -> int:
    if level > MAX_SCHEMA_DEPTH:
        return level
    if isinstance(value, dict):
        return max((_depth(v, level + 1) for v in value.values()), default=level + 1)
    if isinstance(value, list):
        return max((_depth(v, level + 1) for v in value), default=level + 1)
    return level


def sanitize(name: str) -> str:
    """A tool name models accept: ``[A-Za-z0-9_-]{1,64}``."""
    clean = _NAME_BAD.sub("_", name)[:64]
    return clean or "tool"


def qualify(by_server: Iterable[tuple[str, Sequence[McpTool]]]) -> list[McpTool]:
    """Every tool with a unique ``qualified`` name: the tool's own name where no other
    server has it, else ``server__name``; both sanitized, a number added on a clash left."""
    pairs = [(server, tool) for server, tools in by_server for tool in tools]
    counts: dict[str, int] = {}
    for _, tool in pairs:
        key = sanitize(tool.name)
        counts[key] = counts.get(key, 0) + 1
    taken: set[str] = set()
    out: list[McpTool] = []
    for server, tool in pairs:
        base = sanitize(tool.name)
        if counts[base] > 1:
            base = sanitize(f"{server}__{tool.name}")
        name, n = base, 2
        while name in taken:
            suffix = f"_{n}"
            name, n = base[: 64 - len(suffix)] + suffix, n + 1
        taken.add(name)
        out.append(dataclasses.replace(tool, server=server, qualified=name))  # keeps server_id
    return out


def tool_result(result: types.CallToolResult, ms: float) -> ToolResult:
    """A call's result as text for the model (bounded) plus its structured content."""
    parts = [block_text(block) for block in result.content[:1024]]
    text = "\n".join(p for p in parts if p)
    structured = result.structured_content
    if structured is not None and len(_dumps(structured)) > MAX_STRUCTURED_CHARS:
        structured = None
    if not text and structured is not None:
        text = _dumps(structured)
    return ToolResult(cut_with_note(text, MAX_RESULT_CHARS), bool(result.is_error), structured, ms)


def cut_with_note(text: str, limit: int, why: str = "") -> str:
    """``text`` in at most ``limit`` characters, with a note saying what was left out
    when it is cut (the note fits inside, so nothing downstream cuts it off)."""
    if len(text) <= limit:
        return text
    keep = max(0, limit - 64 - len(why))
    return text[:keep] + f"\n[… {len(text) - keep:,} more characters left out{why}]"


def block_text(block: Any) -> str:
    """One content block as text: text itself, anything else as a short placeholder."""
    if isinstance(block, types.TextContent):
        return block.text
    if isinstance(block, (types.ImageContent, types.AudioContent)):
        kind = "image" if isinstance(block, types.ImageContent) else "audio"
        return f"[{kind}: {block.mime_type[:64]}, {_size(len(block.data) * 3 // 4)}]"
    if isinstance(block, types.EmbeddedResource):
        res = block.resource
        if isinstance(res, types.TextResourceContents):
            return res.text
        return f"[resource: {str(res.uri)[:200]}, {_size(len(res.blob) * 3 // 4)}]"
    if isinstance(block, types.ResourceLink):
        return f"[resource link: {str(block.uri)[:200]}]"
    return f"[{str(getattr(block, 'type', 'content'))[:32]}]"


def _size(n: int) -> str:
    return f"{n} bytes" if n < 1024 else f"{(n + 512) // 1024} KB"


def _dumps(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)[:MAX_RESULT_CHARS]
