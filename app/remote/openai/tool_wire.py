"""Tool calls on the OpenAI wire: what a request sends (``tools``, ``tool_choice``,
``parallel_tool_calls``, the history's calls and results), what a reply streams back
(``delta.tool_calls`` pieces, put together by ``index``), and the refusal of a server
that cannot use tools.

Pure functions and data: every field of an answer is type-checked before use, so any
JSON value is safe to feed ``ToolCallStream``. What a server sends is bounded
(``MAX_CALLS`` calls, ``MAX_ARGUMENT_BYTES`` of arguments each); past that the stream
is ``over`` and the reply ends with a note, its calls unmade.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.engine.chat_message import ChatMessage, ToolCall
from app.engine.tool_spec import AUTO, CHOICES, ToolRequest
from app.remote.http import ServerError, sentence
from app.remote.image_wire import IMAGE_CHARS, content_parts
from app.util.errors import LamplightError

MAX_CALLS = 32  # calls in one reply
MAX_ARGUMENT_BYTES = 256 * 1024  # UTF-8 bytes of one call's arguments
MAX_NAME = 256  # characters of a tool name or call id
TOOL_FIELDS = ("tools", "tool_choice", "parallel_tool_calls")

# Words of the 400s that say the server (or its model, or its template) has no tools:
# llama-server without --jinja ("tools param requires --jinja flag"), Ollama ("does not
# support tools"), vLLM ("requires --enable-auto-tool-choice"), templates without tools.
_REFUSAL_WORDS = (
    "tools param",
    "tool_choice param",
    "does not support tools",
    "not support tool",
    "tool calling",
    "tool-call",
    "tool call",
    "tool_choice",
    "function calling",
    "enable-auto-tool-choice",
    "tools",
)


class ToolsRefused(LamplightError):
    """The server refused a request because it cannot use tools (with this model)."""


def tool_fields(tools: ToolRequest | None, refused: Collection[str] = ()) -> dict[str, Any]:
    """The request fields for ``tools`` (none without tools), less those ``refused``.

    ``choice`` "none" still sends the tools: the server's prompt (and its cache) stays
    the same whether or not the model may call them.
    """
    if tools is None or not tools.tools:
        return {}
    choice: Any = tools.choice
    if choice not in CHOICES:
        choice = {"type": "function", "function": {"name": choice}}
    out: dict[str, Any] = {"tools": [t.openai() for t in tools.tools]}
    if tools.choice != AUTO:  # the default: servers that know no tool_choice still work
        out["tool_choice"] = choice
    if not tools.parallel:  # likewise: parallel calls are the default
        out["parallel_tool_calls"] = False
    return {k: v for k, v in out.items() if k not in refused}


def wire_message(m: ChatMessage) -> dict[str, Any]:
    """One message as the chat completions API takes it: an assistant turn's calls
    (its empty content as null, which some servers require beside calls), a tool
    turn's call id and tool name, a user turn's images (``image_wire``)."""
    out: dict[str, Any] = {"role": m.role, "content": content_parts(m)}
    if m.role == "assistant" and m.tool_calls:
        out["tool_calls"] = [c.openai() for c in m.tool_calls]
        if not m.content:
            out["content"] = None
    if m.role == "tool":
        out["tool_call_id"] = m.tool_call_id
        if m.name:
            out["name"] = m.name
    return out


def message_chars(m: ChatMessage) -> int:
    """The characters of ``m`` a server's template renders (for the token estimate)."""
    calls = sum(len(c.name) + len(c.arguments) + 8 for c in m.tool_calls)
    return len(m.content) + calls + IMAGE_CHARS * len(m.images)


def tools_chars(tools: ToolRequest | None) -> int:
    """The characters the tool definitions add to the prompt (for the token estimate)."""
    if tools is None:
        return 0
    return sum(len(json.dumps(t.openai(), ensure_ascii=False)) for t in tools.tools)


def refuses_tools(exc: ServerError) -> bool:
    """A 400 (or 422, or llama-server's 500 for a template without tools) whose words
    say the server cannot use tools."""
    if exc.status not in (400, 422, 500):
        return False
    text = str(exc).lower()
    return any(w in text for w in _REFUSAL_WORDS)


def tools_refused(exc: ServerError, server: str) -> ToolsRefused:
    return ToolsRefused(
        f"The server at {server} cannot use tools with this model: {sentence(str(exc))} "
        "Turn the tools off for this chat, or use a server and model that support them "
        "(llama-server needs --jinja and a chat template with tools)."
    )


@dataclass
class _Pending:
    """One call as its pieces arrive."""

    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)
    size: int = 0  # UTF-8 bytes of ``arguments``


@dataclass
class ToolCallStream:
    """The calls of a streamed reply, put together from ``delta.tool_calls`` pieces.

    A piece names its call by ``index``; the first carries ``id`` and
    ``function.name``, and every piece's ``function.arguments`` is appended. A piece
    without an index (some servers; a whole ``message.tool_calls``) starts a new call
    when it names one, and otherwise continues the last. Past ``MAX_CALLS`` calls or
    ``MAX_ARGUMENT_BYTES`` of one call's arguments the stream is ``over`` (``problem``
    says why) and takes nothing more.
    """

    deltas: int = 0  # pieces that brought anything
    problem: str = ""
    _calls: dict[int, _Pending] = field(default_factory=dict, repr=False)
    _last: int = -1

    @property
    def over(self) -> bool:
        return bool(self.problem)

    def feed(self, pieces: Any) -> None:
        """Take a delta's (or message's) ``tool_calls`` value."""
        if self.over or not isinstance(pieces, list):
            return
        for piece in pieces[: MAX_CALLS + 1]:
            if isinstance(piece, dict) and self._take(piece):
                self.deltas += 1
            if self.problem:
                return

    def _take(self, piece: dict[str, Any]) -> bool:
        fn = piece.get("function")
        fn = fn if isinstance(fn, dict) else {}
        name = _short(fn.get("name"))
        ident = _short(piece.get("id"))
        args = fn.get("arguments")
        if isinstance(args, dict):  # a server that sends the object, not its text
            args = json.dumps(args, ensure_ascii=False)
        args = args if isinstance(args, str) else ""
        index = piece.get("index")
        if isinstance(index, bool) or not isinstance(index, int):
            index = self._last + 1 if (name or ident or self._last < 0) else self._last
        if index < 0:
            return False
        if index >= MAX_CALLS or (index not in self._calls and len(self._calls) >= MAX_CALLS):
            self.problem = f"the server sent more than {MAX_CALLS} tool calls in one reply"
            return False
        call = self._calls.setdefault(index, _Pending())
        self._last = index
        call.id = call.id or ident
        call.name = call.name or name
        if args:
            call.size += len(args.encode("utf-8"))
            if call.size > MAX_ARGUMENT_BYTES:
                self.problem = (
                    f"the server sent a tool call whose arguments are over "
                    f"{MAX_ARGUMENT_BYTES // 1024} KiB"
                )
                return False
            call.arguments.append(args)
        return bool(name or ident or args)

    def calls(self) -> tuple[ToolCall, ...]:
        """The calls so far, in index order; a call without a name is left out, one
        without an id gets one, empty arguments become ``{}``."""
        out: list[ToolCall] = []
        seen: set[str] = set()
        for _, call in sorted(self._calls.items()):
            if not call.name:
                continue
            ident = call.id if call.id and call.id not in seen else new_call_id()
            seen.add(ident)
            arguments = "".join(call.arguments).strip() or "{}"
            out.append(ToolCall(ident, call.name, arguments))
        return tuple(out)

    @property
    def nameless(self) -> int:
        """Calls that never got a name (left out of ``calls``)."""
        return sum(1 for c in self._calls.values() if not c.name)


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def _short(value: Any) -> str:
    return value[:MAX_NAME] if isinstance(value, str) else ""


def calls_note(calls: Sequence[ToolCall], nameless: int) -> list[str]:
    """Notes on calls whose arguments are no JSON object, and calls left out."""
    notes = []
    for c in calls:
        if not _is_object(c.arguments):
            notes.append(f"the arguments of the call to {c.name} are not a JSON object")
    if nameless:
        notes.append(f"{nameless} tool call(s) without a tool name were left out")
    return notes


def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except (ValueError, RecursionError):
        return False
