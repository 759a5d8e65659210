"""OpenAI's Responses API (``POST /v1/responses``, issue 46): a body checked and read
into the ``ApiRequest`` a chat completion becomes (one path through the host), with
what only a response has (``ResponsesAsk``: ``store``, ``previous_response_id``, the
fields echoed back, and the request's own items, kept for a later request to go on
from).

``input`` is a string or items: messages (``user``, ``assistant``, ``system``,
``developer``; content a string or ``input_text`` / ``input_image`` (a data URL) /
``output_text`` parts), ``function_call`` and ``function_call_output`` items, and
``reasoning`` items (their text is the next assistant turn's thinking).
``instructions`` is the system turn (never carried to a later response, as OpenAI
has it). ``tools`` (function tools), ``tool_choice``, ``parallel_tool_calls``,
``max_output_tokens``, ``temperature``, ``top_p``, ``reasoning.effort``,
``text.format`` (text, json_object, json_schema), ``truncation`` ("auto": the oldest
turns are dropped to fit the context, as the chat's "rolling" policy does; "disabled",
the default: a 400 ``context_length_exceeded``), ``stream``, ``user`` /
``safety_identifier`` and ``metadata`` are read; the other tools (web search, file
search, computer use, MCP...), file inputs, item references, ``background`` and
``conversation`` are refused with a 400 naming the field; fields that only choose
OpenAI's service are ignored.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from app.api.errors import ApiError, bad, unsupported
from app.api.image_parts import ImageBudget, image_part
from app.api.schema import MAX_MESSAGES, ApiRequest, ResponsesAsk, request_from
from app.api.tool_schema import MAX_ID_CHARS, foreign_tools, link_results
from app.config.field_spec import short_repr
from app.engine.chat_message import ChatMessage, ImagePart, ToolCall
from app.engine.tool_spec import ToolRequest

MAX_METADATA = 16
MAX_METADATA_CHARS = 512
RESPONSE_ID = re.compile(r"resp_[A-Za-z0-9]{1,64}")
_KEPT = (
    "temperature",
    "top_p",
    "stream",
    "thinking_budget_tokens",
    "reasoning_budget",
    "chat_template_kwargs",
    "cache_prompt",
)
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
# chat completions' field -> the Responses field a refusal names
_PARAM = {
    "max_completion_tokens": "max_output_tokens",
    "response_format": "text.format",
    "reasoning_effort": "reasoning.effort",
}


def parse_responses(body: object) -> ApiRequest:
    """A ``/v1/responses`` body (a decoded JSON value), checked.

    Raises:
        ApiError: 400 naming the field.
    """
    if not isinstance(body, dict):
        raise bad("The request body must be a JSON object.", None, "invalid_json")
    data: dict[str, Any] = body
    for name in ("background", "conversation", "prompt"):
        if data.get(name) not in (None, False):
            raise unsupported(name, f"`{name}`")
    items = input_items(data.get("input"))
    previous = data.get("previous_response_id")
    # With a previous response, a result may answer one of its calls: linked later.
    messages = items_to_messages(items, link=previous is None)
    instructions = data.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad("`instructions` must be a string.", "instructions")
    if instructions:
        messages = [ChatMessage("system", instructions), *messages]
    if previous is not None and (
        not isinstance(previous, str) or not RESPONSE_ID.fullmatch(previous)
    ):
        raise bad(
            "`previous_response_id` must be a response's id (resp_...).", "previous_response_id"
        )
    store = data.get("store", True)
    if not isinstance(store, bool):
        raise bad("`store` must be true or false.", "store")
    try:
        req = request_from("chat", _as_chat(data), messages)
    except ApiError as exc:
        exc.param = _PARAM.get(exc.param or "", exc.param)
        raise
    truncation = data.get("truncation", "disabled")
    if truncation not in ("auto", "disabled"):
        raise bad('`truncation` must be "auto" or "disabled".', "truncation")
    params = replace(req.params, overflow="rolling") if truncation == "auto" else req.params
    ask = ResponsesAsk(store, previous or "", items, _echo(data))
    return replace(req, params=params, tools=_tools(data), responses=ask, dialect="responses")


def _as_chat(data: dict[str, Any]) -> dict[str, Any]:
    """The sampling fields under their chat completions names (the extensions the chat
    completions take, a thinking budget and ``cache_prompt``, as they are)."""
    out: dict[str, Any] = {k: data[k] for k in _KEPT if k in data}
    if data.get("max_output_tokens") is not None:
        out["max_completion_tokens"] = data["max_output_tokens"]
    user = data.get("user") or data.get("safety_identifier")
    if user is not None:
        out["user"] = user
    reasoning = data.get("reasoning")
    if reasoning is not None:
        if not isinstance(reasoning, dict):
            raise bad("`reasoning` must be an object.", "reasoning")
        if reasoning.get("effort") is not None:
            out["reasoning_effort"] = reasoning["effort"]
    text = data.get("text")
    if text is not None:
        fmt = text.get("format") if isinstance(text, dict) else None
        if not isinstance(text, dict) or (fmt is not None and not isinstance(fmt, dict)):
            raise bad('`text` must be {"format": {...}}.', "text")
        if fmt is not None and fmt.get("type") == "json_schema":
            spec = {"name": fmt.get("name", "answer"), "schema": fmt.get("schema")}
            out["response_format"] = {"type": "json_schema", "json_schema": spec}
        elif fmt is not None:
            out["response_format"] = {"type": fmt.get("type")}
    return out


def _echo(data: dict[str, Any]) -> dict[str, Any]:
    metadata = data.get("metadata") or {}
    if (
        not isinstance(metadata, dict)
        or len(metadata) > MAX_METADATA
        or not all(
            isinstance(k, str)
            and isinstance(v, str)
            and len(k) <= 64
            and len(v) <= MAX_METADATA_CHARS
            for k, v in metadata.items()
        )
    ):
        raise bad(
            f"`metadata` must map at most {MAX_METADATA} keys to strings of at most "
            f"{MAX_METADATA_CHARS} characters.",
            "metadata",
        )
    kept = (
        "instructions",
        "tools",
        "tool_choice",
        "temperature",
        "top_p",
        "max_output_tokens",
        "truncation",
    )
    echo = {k: data[k] for k in kept if data.get(k) is not None}
    echo["metadata"] = metadata
    echo["parallel_tool_calls"] = data.get("parallel_tool_calls", True) is not False
    return echo


def input_items(value: object) -> list[dict[str, Any]]:
    """``input`` as a list of items (a string is one user message).

    Raises:
        ApiError: 400 naming the field.
    """
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise bad("`input` must be a string or a non-empty list of items.", "input")
    if len(value) > MAX_MESSAGES:
        raise bad(f"At most {MAX_MESSAGES} input items per request.", "input")
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise bad(f"input[{i}] must be an item object.", f"input[{i}]")
    return value


def items_to_messages(items: list[dict[str, Any]], link: bool = True) -> list[ChatMessage]:
    """Items as the messages a template reads: an assistant message, the function calls
    after it and the reasoning before them are one assistant turn; ``link``: each
    function output checked against its call (and named by it).

    Raises:
        ApiError: 400 naming the item.
    """
    out: list[ChatMessage] = []
    thought = ""  # a reasoning item's text, for the next assistant turn
    budget = ImageBudget()
    for i, item in enumerate(items):
        at = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "reasoning":
            thought += _reasoning(at, item)
        elif kind == "function_call":
            call = _call(at, item)
            if out and out[-1].role == "assistant":  # the same turn's text, or calls
                last = out[-1]
                out[-1] = replace(last, tool_calls=(*last.tool_calls, call))
            else:
                out.append(ChatMessage("assistant", "", thought, (call,)))
            thought = ""
        elif kind == "function_call_output":
            out.append(_output(at, item))
        elif kind == "message":
            message = _message(at, item, budget)
            if message.role == "assistant":
                message = replace(message, reasoning=thought)
                thought = ""
            out.append(message)
        else:
            raise unsupported(f"{at}.type", f"An input item of type {short_repr(kind)}")
    return link_results(out) if link else out


def _reasoning(at: str, item: dict[str, Any]) -> str:
    texts: list[str] = []
    for name in ("content", "summary"):
        parts = item.get(name) or []
        if not isinstance(parts, list):
            raise bad(f"{at}.{name} must be a list of text parts.", f"{at}.{name}")
        for part in parts:
            text = part.get("text") if isinstance(part, dict) else None
            if not isinstance(text, str):
                raise bad(f"{at}.{name} must hold text parts.", f"{at}.{name}")
            texts.append(text)
        if texts:
            break  # the full thinking when it came back, else its summary
    return "".join(texts)


def _call(at: str, item: dict[str, Any]) -> ToolCall:
    call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments", "{}")
    if not isinstance(call_id, str) or not 0 < len(call_id) <= MAX_ID_CHARS:
        raise bad(f"{at}.call_id must be a string of 1 to {MAX_ID_CHARS} characters.", at)
    if not isinstance(name, str) or not name:
        raise bad(f"{at}.name must be the function's name.", f"{at}.name")
    if not isinstance(arguments, str):
        raise bad(f"{at}.arguments must be a JSON object as a string.", f"{at}.arguments")
    return ToolCall(call_id, name, arguments or "{}")


def _output(at: str, item: dict[str, Any]) -> ChatMessage:
    call_id, output = item.get("call_id"), item.get("output")
    if not isinstance(call_id, str) or not 0 < len(call_id) <= MAX_ID_CHARS:
        raise bad(f"{at}.call_id must name the function call this is the output of.", at)
    if isinstance(output, list):
        output = "".join(_text(f"{at}.output[{j}]", p) for j, p in enumerate(output))
    if not isinstance(output, str):
        raise bad(f"{at}.output must be a string.", f"{at}.output")
    return ChatMessage("tool", output, tool_call_id=call_id)


def _message(at: str, item: dict[str, Any], budget: ImageBudget) -> ChatMessage:
    role = item.get("role")
    if not isinstance(role, str) or role not in _ROLES:
        raise bad(
            f"{at}.role must be user, assistant, system or developer (got {short_repr(role)}).",
            f"{at}.role",
        )
    content = item.get("content")
    if isinstance(content, str):
        return ChatMessage(_ROLES[role], content)  # type: ignore[arg-type]
    if not isinstance(content, list):
        raise bad(f"{at}.content must be a string or a list of parts.", f"{at}.content")
    texts: list[str] = []
    images: list[ImagePart] = []
    for j, part in enumerate(content):
        where = f"{at}.content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "input_image" and isinstance(part, dict):
            if role != "user":
                raise bad(f"Images are taken in user messages only ({where}).", where)
            if not isinstance(part.get("image_url"), str):
                raise unsupported(where, "An image by file_id (send a data: URL)")
            images.append(image_part(where, part, budget))
        elif kind == "input_file":
            raise unsupported(where, "An `input_file` part")
        else:
            texts.append(_text(where, part))
    return ChatMessage(_ROLES[role], "".join(texts), images=tuple(images))  # type: ignore[arg-type]


def _text(at: str, part: object) -> str:
    kind = part.get("type") if isinstance(part, dict) else None
    text = part.get("text") if isinstance(part, dict) else None
    if kind == "refusal" and isinstance(part, dict):
        text = part.get("refusal")
    if kind not in ("input_text", "output_text", "text", "refusal") or not isinstance(text, str):
        raise bad(f'{at} must be {{"type": "input_text", "text": "..."}} or an image part.', at)
    return text


def _tools(data: dict[str, Any]) -> ToolRequest | None:
    """Function tools and ``tool_choice`` through the chat completions' checks."""
    return foreign_tools(data, _tool, _choice)


def _tool(i: int, tool: object) -> dict[str, Any]:
    kind = tool.get("type") if isinstance(tool, dict) else None
    if kind != "function" or not isinstance(tool, dict):
        raise unsupported(f"tools[{i}].type", f"A {short_repr(kind)} tool (only functions)")
    fn = {k: tool.get(k) for k in ("name", "description", "parameters", "strict")}
    return {"type": "function", "function": {k: v for k, v in fn.items() if v is not None}}


def _choice(data: dict[str, Any]) -> dict[str, Any]:
    """``tool_choice`` (a named function in the chat completions' shape) and
    ``parallel_tool_calls``."""
    choice, out = data.get("tool_choice"), {}
    if isinstance(choice, dict) and choice.get("type") == "function":
        out["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    elif choice is not None:
        out["tool_choice"] = choice
    if data.get("parallel_tool_calls") is not None:
        out["parallel_tool_calls"] = data["parallel_tool_calls"]
    return out
