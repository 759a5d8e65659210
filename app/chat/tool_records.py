"""Tool calls and results as a transcript stores them, read back defensively.

An assistant message's ``tool_calls`` is a list of dicts, one per call it asked for::

    {"id": "call_1", "name": "search", "arguments": "{\\"q\\": \\"x\\"}",
     "server": "web", "state": "done", "ms": 812.5}

``name`` is the (qualified) name the model used, ``arguments`` the JSON object text it
ran with (the user's edit, when there was one), ``server`` the MCP server that has the
tool ("" when none has), ``state`` one of ``CALL_STATES``, ``ms`` how long it ran (only
once run). A call's result is a ``tool`` message after it (``tool_call_id``, ``name``,
the full result text, ``is_error``).
"""

from __future__ import annotations

import re
from typing import Any, TypeGuard

# ask: waiting for the user; running; done: a result came back; error: the tool failed
# or does not exist; denied by the user; timeout; cancelled: by Stop, or the app closed
# while it was asked or running.
CALL_STATES = ("ask", "running", "done", "error", "denied", "timeout", "cancelled")
OPEN_STATES = ("ask", "running")  # no result yet
MAX_CALLS = 64  # calls of one assistant turn kept from a file
CALL_ID_CHARS = 128
TOOL_NAME_CHARS = 256
SERVER_CHARS = 1000
ARGUMENT_CHARS = 100_000  # the longest arguments text kept (a model's or an edit)
RESULT_CHARS = 2_000_000  # the longest result text a transcript keeps
MAX_MS = 1e9

CANCELLED_TEXT = "The call was cancelled."
CLOSED_TEXT = "The call was cancelled: the app closed before it finished."


def read_calls(raw: Any) -> list[dict[str, Any]]:
    """Stored ``tool_calls`` made valid: at most ``MAX_CALLS``, entries that are not
    objects dropped, odd fields repaired (an unknown state reads as "error"; a call
    still asked or running, as "cancelled": the app closed mid-call)."""
    if not isinstance(raw, list):
        return []
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for n, c in enumerate(x for x in raw[:MAX_CALLS] if isinstance(x, dict)):
        call_id = c.get("id")
        if not is_call_id(call_id) or call_id in seen:
            call_id = f"call_{n}_{len(seen)}"
            while call_id in seen:
                call_id += "x"
        seen.add(call_id)
        state = c.get("state")
        state = "error" if state not in CALL_STATES else state
        args = c.get("arguments")
        call: dict[str, Any] = {
            "id": call_id,
            "name": _text(c.get("name"), TOOL_NAME_CHARS),
            "arguments": args if isinstance(args, str) and len(args) <= ARGUMENT_CHARS else "{}",
            "server": _text(c.get("server"), SERVER_CHARS),
            "state": "cancelled" if state in OPEN_STATES else state,
        }
        ms = c.get("ms")
        if isinstance(ms, int | float) and not isinstance(ms, bool) and 0 <= ms < MAX_MS:
            call["ms"] = float(ms)
        out.append(call)
    return out


def is_call_id(value: object) -> TypeGuard[str]:
    """A call id as models and servers write them: 1-128 printable ASCII characters."""
    return (
        isinstance(value, str)
        and 0 < len(value) <= CALL_ID_CHARS
        and value.isascii()
        and value.isprintable()
    )


def read_result_fields(m: dict[str, Any]) -> tuple[str, str, bool]:
    """A stored ``tool`` message's (tool_call_id, name, is_error), repaired."""
    call_id = m.get("tool_call_id")
    return (
        call_id if is_call_id(call_id) else "",
        _text(m.get("name"), TOOL_NAME_CHARS),
        m.get("is_error") is True,
    )


def cut_result(text: str, limit: int) -> str:
    """``text`` as the model reads it: at most ``limit`` characters, with a note."""
    if len(text) <= limit:
        return text
    return (
        f"{text[:limit]}\n[Result truncated: {len(text):,} characters, the first {limit:,} shown]"
    )


def _text(value: Any, limit: int) -> str:
    return value[:limit] if isinstance(value, str) else ""


# Tags that would end the collapsed section early, open another, or swallow its closing
# tag (as in the thinking's section): written as text, not HTML.
_SECTION_TAGS = re.compile(
    r"<(/?(?:details|summary|pre|script|style|textarea|title|xmp)\b|!--)", re.IGNORECASE
)
_BACKTICKS = re.compile(r"`{3,}")


def calls_markdown(calls: list[dict[str, Any]]) -> list[str]:
    """Markdown lines for an assistant turn's calls: the tool, its server and state,
    the arguments in a ``json`` fence (long enough that no text in them closes it)."""
    lines: list[str] = []
    for c in calls:
        where = f" on {_inline(c['server'])}" if c.get("server") else ""
        lines += [f"*Tool call: {_inline(c['name'])}{where} ({c['state']})*", ""]
        fence = "`" * max(
            3, 1 + max((len(r) for r in _BACKTICKS.findall(c["arguments"])), default=0)
        )
        lines += [f"{fence}json", c["arguments"], fence, ""]
    return lines


def result_markdown(name: str, text: str, is_error: bool) -> list[str]:
    """A result as a collapsed section; tags in it cannot close the section."""
    title = f"{'Error from' if is_error else 'Result of'} {_inline(name) or 'a tool'}"
    safe = _SECTION_TAGS.sub(r"&lt;\1", text.strip())
    fence = "`" * max(3, 1 + max((len(r) for r in _BACKTICKS.findall(safe)), default=0))
    return [f"<details><summary>{title}</summary>", "", fence, safe, fence, "", "</details>", ""]


def _inline(text: str) -> str:
    """``text`` safe inside a line of Markdown (no tags, backticks or line breaks)."""
    flat = " ".join(text.split())
    return flat.replace("`", "'").replace("<", "&lt;").replace("*", "\\*")[:TOOL_NAME_CHARS]
