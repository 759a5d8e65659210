"""Tool calling in a ``/v1/chat/completions`` body, checked: ``tools``, ``tool_choice``,
``parallel_tool_calls``, an assistant message's ``tool_calls`` and ``tool`` messages.

Everything here is a client's (untrusted) JSON, already bounded in size and depth by
``schema.load_body``; the tools get their own, tighter bounds (``MAX_TOOLS``,
``MAX_TOOLS_BYTES``, ``MAX_TOOLS_DEPTH``) because all of them go into every prompt.
A refusal is a 400 naming the field (``param``), never another exception. The legacy
``functions`` / ``function_call`` and ``function`` messages are refused: their reply
shape differs, and every current client sends ``tools``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from app.api.errors import bad, unsupported
from app.config.field_spec import short_repr
from app.engine.chat_message import ChatMessage, ToolCall
from app.engine.tool_spec import AUTO, CHOICES, NONE, ToolRequest, ToolSpec

MAX_TOOLS = 128
MAX_TOOLS_BYTES = 256 * 1024  # the tools as compact JSON
MAX_TOOLS_DEPTH = 32  # nesting of the ``tools`` value, its schemas' included
MAX_CALLS = 128  # tool calls in one assistant message
MAX_ID_CHARS = 256  # a call's id (OpenAI's are ~30)
MAX_CALL_NAME_CHARS = 256  # a name sent back in history (models do invent odd ones)
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


def deeper_than(value: object, limit: int) -> bool:
    """Whether ``value`` nests lists/objects more than ``limit`` levels (iterative, so
    any depth is safe to measure)."""
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth + 1 > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def parse_tools(data: dict[str, Any]) -> ToolRequest | None:
    """``tools``, ``tool_choice`` and ``parallel_tool_calls`` as a ``ToolRequest``
    (None when the request offers no tools).

    Raises:
        ApiError: 400 naming the field.
    """
    # Only the values that ask for nothing pass: no functions, or none to call.
    for name, nothing in (("functions", []), ("function_call", "none")):
        value = data.get(name)
        if value is not None and value != nothing:
            raise unsupported(name, f"The legacy `{name}` field (send `tools` / `tool_choice`)")
    parallel = data.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise bad(
            f"`parallel_tool_calls` must be true or false (got {short_repr(parallel)}).",
            "parallel_tool_calls",
        )
    tools = _tools(data.get("tools"))
    choice = _choice(data.get("tool_choice"), {t.name for t in tools})
    if not tools:
        return None
    return ToolRequest(tools, choice, parallel is not False)


def foreign_tools(
    data: dict[str, Any],
    convert: Callable[[int, object], dict[str, Any]],
    choice: Callable[[dict[str, Any]], dict[str, Any]],
) -> ToolRequest | None:
    """Another API's ``tools`` (Anthropic's, the Responses API's) through ``parse_tools``:
    each converted to a chat completions tool (``convert(i, tool)``), then ``choice``
    gives the chat completions' ``tool_choice`` / ``parallel_tool_calls`` for ``data``.
    Those APIs take a choice without tools: it is dropped.

    Raises:
        ApiError: 400 naming the field.
    """
    tools = data.get("tools")
    if tools is None and data.get("tool_choice") is None:
        return None
    if tools is not None and not isinstance(tools, list):
        raise bad("`tools` must be a list of tools.", "tools")
    converted = [convert(i, t) for i, t in enumerate(tools or [])]
    asked: dict[str, Any] = {"tools": converted, **choice(data)}
    if not converted:
        asked.pop("tool_choice", None)
    return parse_tools(asked)


def _tools(value: object) -> tuple[ToolSpec, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise bad("`tools` must be a list of function tools.", "tools")
    if len(value) > MAX_TOOLS:
        raise bad(f"`tools` holds {len(value)} tools; at most {MAX_TOOLS} are accepted.", "tools")
    if deeper_than(value, MAX_TOOLS_DEPTH):
        raise bad(f"`tools` is nested more than {MAX_TOOLS_DEPTH} levels deep.", "tools")
    size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())
    if size > MAX_TOOLS_BYTES:
        raise bad(
            f"`tools` is {size:,} bytes of JSON; at most {MAX_TOOLS_BYTES:,} are accepted "
            "(every tool goes into every prompt).",
            "tools",
        )
    specs = tuple(_tool(i, t) for i, t in enumerate(value))
    seen: set[str] = set()
    for i, spec in enumerate(specs):
        if spec.name in seen:
            raise bad(f"Two tools are named {spec.name!r}.", f"tools[{i}].function.name")
        seen.add(spec.name)
    return specs


def _tool(i: int, value: object) -> ToolSpec:
    where = f"tools[{i}]"
    if not isinstance(value, dict):
        raise bad(f'{where} must be {{"type": "function", "function": {{...}}}}.', where)
    kind = value.get("type", "function")
    if kind != "function":
        raise unsupported(f"{where}.type", f"A {short_repr(kind)} tool (only functions)")
    fn = value.get("function")
    if not isinstance(fn, dict):
        raise bad(f"{where}.function must be an object with a `name`.", f"{where}.function")
    name = fn.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise bad(
            f"{where}.function.name must be 1 to 64 letters, digits, _ or - "
            f"(got {short_repr(name)}).",
            f"{where}.function.name",
        )
    description = fn.get("description")
    if description is None:
        description = ""
    if not isinstance(description, str):
        raise bad(f"{where}.function.description must be a string.", f"{where}.function")
    parameters = fn.get("parameters")
    if parameters is None:
        parameters = _NO_PARAMETERS
    at = f"{where}.function.parameters"
    if not isinstance(parameters, dict):
        raise bad(f"{at} must be a JSON Schema object.", at)
    if parameters.get("type", "object") != "object":
        raise bad(
            f"{at} must describe an object (the arguments), not "
            f"{short_repr(parameters.get('type'))}.",
            at,
        )
    strict = fn.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise bad(f"{where}.function.strict must be true or false.", f"{where}.function")
    return ToolSpec(name, description, parameters)


def _choice(value: object, names: set[str]) -> str:
    """``tool_choice`` as ``ToolRequest.choice``."""
    if value is None:
        return AUTO
    choice: object = value
    if isinstance(value, dict):
        fn = value.get("function")
        choice = (
            fn.get("name") if value.get("type") == "function" and isinstance(fn, dict) else None
        )
        if not isinstance(choice, str) or choice in CHOICES:
            raise bad(
                '`tool_choice` must be "auto", "none", "required" or '
                '{"type": "function", "function": {"name": ...}} (got '
                f"{short_repr(value)}).",
                "tool_choice",
            )
    elif not isinstance(value, str) or value not in CHOICES:
        raise bad(
            '`tool_choice` must be "auto", "none", "required" or a named function '
            f"(got {short_repr(value)}).",
            "tool_choice",
        )
    assert isinstance(choice, str)
    if not names and choice != NONE:
        raise bad(
            "`tool_choice` needs `tools`: this request offers none. Leave `tool_choice` "
            "out when there are no tools, as OpenAI does (the openai SDK: do not pass it, "
            "or pass `NOT_GIVEN`; LangChain: set it with `bind_tools(tools, "
            "tool_choice=...)`, not in `model_kwargs`).",
            "tool_choice",
        )
    if choice not in CHOICES and choice not in names:
        raise bad(
            f"`tool_choice` names {short_repr(choice)}, which is not among `tools`.",
            "tool_choice",
        )
    return choice


def tool_calls(where: str, message: dict[str, Any]) -> tuple[ToolCall, ...]:
    """An assistant message's ``tool_calls`` (sent back in the history).

    Raises:
        ApiError: 400 naming the field.
    """
    if message.get("function_call") is not None:
        raise unsupported(f"{where}.function_call", "The legacy `function_call` (use `tool_calls`)")
    value = message.get("tool_calls")
    if value is None or value == []:
        return ()
    at = f"{where}.tool_calls"
    if not isinstance(value, list):
        raise bad(f"{at} must be a list of calls.", at)
    if len(value) > MAX_CALLS:
        raise bad(f"{at} holds {len(value)} calls; at most {MAX_CALLS} are accepted.", at)
    return tuple(_call(f"{at}[{j}]", c) for j, c in enumerate(value))


def _call(at: str, value: object) -> ToolCall:
    shape = '{"id": ..., "type": "function", "function": {"name": ..., "arguments": "..."}}'
    if not isinstance(value, dict) or value.get("type", "function") != "function":
        raise bad(f"{at} must be {shape}.", at)
    call_id, fn = value.get("id"), value.get("function")
    if not isinstance(call_id, str) or not 0 < len(call_id) <= MAX_ID_CHARS:
        raise bad(f"{at}.id must be a string of 1 to {MAX_ID_CHARS} characters.", f"{at}.id")
    if not isinstance(fn, dict):
        raise bad(f"{at} must be {shape}.", f"{at}.function")
    name, arguments = fn.get("name"), fn.get("arguments")
    if not isinstance(name, str) or not 0 < len(name) <= MAX_CALL_NAME_CHARS:
        raise bad(
            f"{at}.function.name must be a string of 1 to {MAX_CALL_NAME_CHARS} characters.",
            f"{at}.function.name",
        )
    if isinstance(arguments, dict):  # some clients send the object itself
        arguments = json.dumps(arguments, ensure_ascii=False)
    elif arguments is None or arguments == "":
        arguments = "{}"
    if not isinstance(arguments, str):
        raise bad(f"{at}.function.arguments must be a JSON object as a string.", f"{at}.function")
    return ToolCall(call_id, name, arguments)


def tool_result(where: str, message: dict[str, Any], content: str) -> ChatMessage:
    """A ``tool`` message (its ``content`` already read): the result of one call.

    Raises:
        ApiError: 400 naming the field.
    """
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str) or not 0 < len(call_id) <= MAX_ID_CHARS:
        raise bad(
            f"{where}.tool_call_id must name the call this is the result of "
            f"(a string of 1 to {MAX_ID_CHARS} characters).",
            f"{where}.tool_call_id",
            "missing_required_parameter" if call_id is None else "invalid_value",
        )
    name = message.get("name")
    if name is not None and (not isinstance(name, str) or len(name) > MAX_CALL_NAME_CHARS):
        raise bad(f"{where}.name must be the tool's name.", f"{where}.name")
    return ChatMessage("tool", content, tool_call_id=call_id, name=name or "")


def link_results(messages: list[ChatMessage]) -> list[ChatMessage]:
    """``messages`` with each tool result's ``name`` filled from its call, when missing.

    Raises:
        ApiError: 400 for a result whose ``tool_call_id`` matches no earlier call.
    """
    called: dict[str, str] = {}  # call id -> tool name (a reused id: its latest call)
    out: list[ChatMessage] = []
    for i, m in enumerate(messages):
        called.update((c.id, c.name) for c in m.tool_calls)
        if m.role == "tool":
            name = called.get(m.tool_call_id)
            if name is None:
                raise bad(
                    f"messages[{i}] is the result of call {m.tool_call_id!r}, but no earlier "
                    "assistant message made a call with that id.",
                    f"messages[{i}].tool_call_id",
                )
            if not m.name:
                m = ChatMessage("tool", m.content, tool_call_id=m.tool_call_id, name=name)
        out.append(m)
    return out
