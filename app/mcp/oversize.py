"""Messages from a server over ``MAX_MESSAGE_BYTES``: never held whole, answered with a note.

Both transports collect a message (a stdio line, an HTTP body, a server-sent event)
in a ``Collector``: whole up to the limit, then only its first ``limit`` bytes and
its last ``TAIL_BYTES``. A message over the limit is replaced by a JSON-RPC error of
our own (``TOO_LARGE``) for the same request id, carrying the text its first content
block began with; ``oversize_result`` turns that into the call's result: the text cut,
with a note saying what was left out. The server's connection is not touched.

The id is read where a JSON-RPC message has it at the top level: first after the
opening brace (and ``"jsonrpc"``), or last before the closing one. ``"id"`` followed
by a colon cannot occur inside a JSON string (its quotes would be escaped), and a
nested object's ``"id"`` is not at either end.
"""

from __future__ import annotations

import json
import re
from typing import Any

from app.mcp.results import MAX_RESULT_CHARS
from app.mcp.tool_host import ToolResult

MAX_MESSAGE_BYTES = 8 * 1024 * 1024
TAIL_BYTES = 1024
TOO_LARGE = -32090  # in JSON-RPC's range for implementation-defined server errors

_ID = rb'(-?[0-9]{1,18}|"(?:[^"\\]|\\.){0,256}")'
_HEAD_ID = re.compile(rb'\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"id"\s*:\s*' + _ID)
_TAIL_ID = re.compile(
    rb'[,{]\s*"id"\s*:\s*' + _ID + rb'\s*(?:,\s*"jsonrpc"\s*:\s*"2\.0"\s*)?\}\s*$'
)
_CONTENT = re.compile(rb'"content"\s*:\s*\[')
_TEXT_KEY = re.compile(rb'"text"\s*:\s*"')


class Collector:
    """One message's bytes: all of them up to ``limit``, then its head and tail."""

    def __init__(self, limit: int = MAX_MESSAGE_BYTES) -> None:
        self.limit = limit
        self.size = 0
        self._parts: list[bytes] = []
        self._head: bytes | None = None  # set once over the limit
        self._tail = b""

    def add(self, piece: bytes) -> None:
        if not piece:
            return
        if self._head is None and self.size + len(piece) <= self.limit:
            self._parts.append(piece)
        elif self._head is None:
            whole = b"".join([*self._parts, piece])
            self._head, self._tail, self._parts = whole[: self.limit], whole[-TAIL_BYTES:], []
        else:
            self._tail = (self._tail + piece[-TAIL_BYTES:])[-TAIL_BYTES:]
        self.size += len(piece)

    @property
    def over(self) -> bool:
        return self._head is not None

    @property
    def head(self) -> bytes:
        """The first ``limit`` bytes (once over the limit)."""
        return self._head or b""

    @property
    def tail(self) -> bytes:
        """The last ``TAIL_BYTES`` (once over the limit)."""
        return self._tail

    def take(self, fallback_id: Any = None) -> bytes | None:
        """The message (a replacement when it was over the limit; None when that one's
        id cannot be found), and start over."""
        if self._head is None:
            out: bytes | None = b"".join(self._parts)
        else:
            out = replacement(self._head, self._tail, self.size, self.limit, fallback_id)
        self.size, self._parts, self._head, self._tail = 0, [], None, b""
        return out


def replacement(
    head: bytes, tail: bytes, size: int, limit: int, fallback_id: Any = None
) -> bytes | None:
    """A ``TOO_LARGE`` error for the message of ``size`` bytes that began with ``head``
    and ended with ``tail`` (None when neither says its id and no fallback is given)."""
    msg_id = message_id(head, tail)
    if msg_id is None:
        msg_id = fallback_id
    if msg_id is None:
        return None
    data: dict[str, Any] = {"bytes": size, "limit": limit}
    salvaged = first_text(head)
    if salvaged is not None:  # no more than a result keeps; how much there was, if known
        text, complete = salvaged
        data.update(text=text[:MAX_RESULT_CHARS], complete=complete, chars=len(text))
    message = f"The server's answer was {size:,} bytes, over the limit of {limit:,}."
    error = {"code": TOO_LARGE, "message": message, "data": data}
    body = {"jsonrpc": "2.0", "id": msg_id, "error": error}
    return json.dumps(body).encode("ascii")  # escapes: a lone surrogate stays valid JSON


def message_id(head: bytes, tail: bytes) -> int | str | None:
    """The top-level id of a JSON-RPC message known by its ends (None: not found)."""
    found = _HEAD_ID.match(head[:4096]) or _TAIL_ID.search(tail)
    if found is None:
        return None
    try:
        value = json.loads(found.group(1))
    except ValueError:
        return None
    return value if isinstance(value, int | str) and not isinstance(value, bool) else None


def first_text(head: bytes) -> tuple[str, bool] | None:
    """The first ``"text"`` string of the message's ``content`` as far as ``head``
    has it, and whether it ended there (None: no text found)."""
    content = _CONTENT.search(head)
    if content is None:
        return None
    key = _TEXT_KEY.search(head, content.end())
    if key is None:
        return None
    start = pos = key.end()
    while True:
        pos = head.find(b'"', pos)
        if pos < 0:
            body, complete = _whole_escapes(head[start:]), False
            break
        back = pos - 1
        while back >= start and head[back] == 0x5C:  # the backslashes escaping it
            back -= 1
        if (pos - 1 - back) % 2 == 0:
            body, complete = head[start:pos], True
            break
        pos += 1
    text = body.decode("utf-8", "replace")
    if not complete:
        text = text.rstrip("\ufffd")  # a character cut in half at the end
    try:
        value = json.loads(f'"{text}"', strict=False)
    except ValueError:
        return None
    if not isinstance(value, str):
        return None
    if not complete and value and "\ud800" <= value[-1] <= "\udbff":
        value = value[:-1]  # the first half of an escaped surrogate pair
    return value, complete


def _whole_escapes(body: bytes) -> bytes:
    """``body`` without an escape cut short at its end (``\\`` or ``\\u12``)."""
    backslashes = len(body) - len(body.rstrip(b"\\"))
    if backslashes % 2:
        return body[:-1]
    cut = body.rfind(b"\\u", max(0, len(body) - 5))
    if cut >= 0 and len(body) - cut < 6:
        before = len(body[:cut]) - len(body[:cut].rstrip(b"\\"))
        if before % 2 == 0:
            return body[:cut]
    return body


def oversize_result(data: Any, max_chars: int) -> ToolResult:
    """The result of a call whose answer was replaced (``data`` from ``replacement``):
    the text it began with, at most ``max_chars`` with the note, or an error that says
    why there is none."""
    data = data if isinstance(data, dict) else {}
    size, limit = _int(data.get("bytes")), _int(data.get("limit"))
    why = f"the server's answer was {size:,} bytes, over the limit of {limit:,}"
    text = data.get("text")
    if not isinstance(text, str) or not text:
        return ToolResult(f"The result was left out: {why}.", is_error=True)
    complete, chars = data.get("complete") is True, max(_int(data.get("chars")), len(text))
    if complete and chars > max_chars:
        keep = max(0, max_chars - 64 - len(why))
        note = f"\n[… {chars - keep:,} more characters left out; {why}]"
    else:
        note = f"\n[… {'what followed this text' if complete else 'the rest'} left out: {why}]"
        keep = max(0, max_chars - len(note))
    return ToolResult(text[:keep] + note)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
