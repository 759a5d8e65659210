"""Anthropic's Messages API (``POST /v1/messages``, issue 46): a body checked and read
into the same ``ApiRequest`` a chat completion becomes, so both take one path through
the host (its template, tool calling, thinking split, cache).

What is read: ``system`` (a string or text blocks), ``messages`` of ``user`` and
``assistant`` turns whose content is a string or blocks (``text``; ``image`` with a
base64 source; ``tool_result`` in a user turn, its content text; ``tool_use`` and
``thinking`` in an assistant turn; ``redacted_thinking`` is dropped), ``tools``
(custom tools: ``name``, ``description``, ``input_schema``), ``tool_choice``
(``auto``, ``any``, ``tool``, ``none``; ``disable_parallel_tool_use``),
``stop_sequences``, ``max_tokens`` (required, as Anthropic has it), ``temperature``,
``top_p``, ``top_k`` (older clients send them), ``thinking`` (``enabled`` with
``budget_tokens``, ``disabled``, ``adaptive``, ``between_tools``; ``display`` is
ignored), ``output_config`` (``effort``; ``format``: a JSON schema the answer keeps
to, by grammar), ``metadata.user_id`` and ``stream``. ``cache_control`` marks, and the
fields that choose Anthropic's service (``speed``, ``service_tier``,
``inference_geo``...), are accepted and ignored (the cache is automatic here). Server
tools (web search, code execution...), documents, URL images and MCP servers are
refused with a 400 that says so. Every refusal names the field in Anthropic's terms.

The body's size and depth are bounded before this (``schema.load_body``); tools go
through the chat completions' own bounds (``tool_schema.parse_tools``).
"""

from __future__ import annotations

import json
from typing import Any

from app.api.errors import ApiError, bad, unsupported
from app.api.image_parts import ImageBudget, image_part
from app.api.schema import BASE, MAX_MESSAGES, MAX_USER_CHARS, ApiRequest, stop_strings
from app.api.tool_schema import MAX_CALLS, MAX_ID_CHARS, foreign_tools, link_results
from app.config.field_spec import SettingError, short_repr
from app.config.params import validate_sampling
from app.engine.chat_message import ChatMessage, ImagePart, ToolCall
from app.engine.tool_spec import ToolRequest

MAX_BLOCKS = 1024  # content blocks in one message
_NUMBERS = ("temperature", "top_p", "top_k")
_CHOICE = {"auto": "auto", "any": "required", "none": "none"}
_EFFORT = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}
_DROPPED = ("redacted_thinking",)


def parse_messages(body: object, counting: bool = False) -> ApiRequest:
    """A ``/v1/messages`` body (a decoded JSON value), checked; ``counting``: a
    ``/v1/messages/count_tokens`` body (``max_tokens`` and ``stream`` not needed).

    Raises:
        ApiError: 400 naming the field.
    """
    if not isinstance(body, dict):
        raise bad("The request body must be a JSON object.", None, "invalid_json")
    data: dict[str, Any] = body
    for name in ("mcp_servers", "container"):
        if data.get(name) not in (None, [], ""):
            raise unsupported(name, f"`{name}`")
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise bad("`model` must be a string.", "model")
    messages = [*_system(data.get("system")), *_turns(data.get("messages"))]
    values = _sampling(data, counting)
    try:
        params = validate_sampling(values, BASE)
    except SettingError as exc:
        field = {"stop": "stop_sequences", "thinking_budget": "thinking"}.get(exc.field, exc.field)
        if exc.field in ("output_format", "json_schema", "reasoning_effort"):
            field = "output_config"
        raise bad(str(exc), field) from exc
    return ApiRequest(
        kind="chat",
        model=model or "",
        messages=link_results(messages),
        params=params,
        max_tokens=params.max_tokens,
        stream=False if counting else _stream(data),
        user=_user(data.get("metadata")),
        tools=_tools(data),
        dialect="anthropic",
    )


def _sampling(data: dict[str, Any], counting: bool) -> dict[str, Any]:
    values: dict[str, Any] = {k: data[k] for k in _NUMBERS if data.get(k) is not None}
    length = data.get("max_tokens")
    if length is None and not counting:
        raise bad("`max_tokens` is required.", "max_tokens", "missing_required_parameter")
    if length is not None:
        if not isinstance(length, int) or isinstance(length, bool) or length < 1:
            raise bad(
                f"`max_tokens` must be a whole number of at least 1 (got {short_repr(length)}).",
                "max_tokens",
            )
        values["max_tokens"] = length
    stops = data.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list):
            raise bad("`stop_sequences` must be a list of strings.", "stop_sequences")
        values["stop"] = stop_strings(stops, "stop_sequences")
    values.update(_thinking(data.get("thinking")))
    values.update(_output(data.get("output_config")))
    return values


def _output(value: object) -> dict[str, Any]:
    """``output_config``: ``effort`` and a JSON-schema ``format``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad("`output_config` must be an object.", "output_config")
    out: dict[str, Any] = {}
    effort = value.get("effort")
    if effort is not None:
        if not isinstance(effort, str) or effort not in _EFFORT:
            raise bad(
                "`output_config.effort` must be low, medium, high, xhigh or max "
                f"(got {short_repr(effort)}).",
                "output_config.effort",
            )
        out["reasoning_effort"] = _EFFORT[effort]
    fmt = value.get("format")
    if fmt is not None:
        schema = fmt.get("schema") if isinstance(fmt, dict) else None
        if (
            not isinstance(fmt, dict)
            or fmt.get("type") != "json_schema"
            or not isinstance(schema, dict)
        ):
            raise bad(
                '`output_config.format` must be {"type": "json_schema", "schema": {...}}.',
                "output_config.format",
            )
        out |= {"output_format": "json_schema", "json_schema": json.dumps(schema)}
    return out


def _thinking(value: object) -> dict[str, Any]:
    """``thinking`` as SamplingParams fields; absent: the model's own default."""
    if value is None:
        return {}
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "disabled":
        return {"thinking": "off"}
    if kind in ("adaptive", "between_tools"):
        return {"thinking": "auto"}
    if kind == "enabled" and isinstance(value, dict):
        budget = value.get("budget_tokens")
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
            raise bad(
                "`thinking.budget_tokens` must be a whole number of tokens, at least 1.",
                "thinking.budget_tokens",
            )
        return {"thinking": "on", "thinking_budget": budget}
    raise bad(
        '`thinking` must be {"type": "enabled", "budget_tokens": N}, {"type": "disabled"} '
        f'or {{"type": "adaptive"}} (got {short_repr(value)}).',
        "thinking",
    )


def _stream(data: dict[str, Any]) -> bool:
    value = data.get("stream", False)
    if not isinstance(value, bool):
        raise bad(f"`stream` must be true or false (got {short_repr(value)}).", "stream")
    return value


def _user(metadata: object) -> str:
    if metadata is None:
        return ""
    if not isinstance(metadata, dict):
        raise bad("`metadata` must be an object.", "metadata")
    user = metadata.get("user_id")
    if user is None:
        return ""
    if not isinstance(user, str):
        raise bad("`metadata.user_id` must be a string.", "metadata.user_id")
    return user[:MAX_USER_CHARS]


def _system(value: object) -> list[ChatMessage]:
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return [ChatMessage("system", value)]
    if not isinstance(value, list) or len(value) > MAX_BLOCKS:
        raise bad("`system` must be a string or a list of text blocks.", "system")
    texts = []
    for i, block in enumerate(value):
        text = block.get("text") if isinstance(block, dict) else None
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(text, str):
            raise bad(f'system[{i}] must be {{"type": "text", "text": "..."}}.', f"system[{i}]")
        texts.append(text)
    joined = "\n\n".join(t for t in texts if t)
    return [ChatMessage("system", joined)] if joined else []


def _turns(value: object) -> list[ChatMessage]:
    if value is None:
        raise bad("`messages` is required.", "messages", "missing_required_parameter")
    if not isinstance(value, list) or not value:
        raise bad("`messages` must be a non-empty list of messages.", "messages")
    if len(value) > MAX_MESSAGES:
        raise bad(f"At most {MAX_MESSAGES} messages per request.", "messages")
    budget = ImageBudget()
    out: list[ChatMessage] = []
    for i, turn in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(turn, dict) or turn.get("role") not in ("user", "assistant"):
            raise bad(f"{where} must be an object whose `role` is user or assistant.", where)
        blocks = _blocks(where, turn.get("content"))
        if turn["role"] == "user":
            out += _user_turn(where, blocks, budget)
        else:
            out.append(_assistant_turn(where, blocks))
    return out


def _blocks(where: str, content: object) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or len(content) > MAX_BLOCKS:
        raise bad(
            f"{where}.content must be a string or a list of at most {MAX_BLOCKS} blocks.",
            f"{where}.content",
        )
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise bad(f"{where}.content[{j}] must be a block with a `type`.", f"{where}.content")
    return content


def _user_turn(where: str, blocks: list[dict[str, Any]], budget: ImageBudget) -> list[ChatMessage]:
    """A user turn: its tool results (each a ``tool`` message, in order), then its
    text and images as one user message (when it has any)."""
    results: list[ChatMessage] = []
    texts: list[str] = []
    images: list[ImagePart] = []
    for j, block in enumerate(blocks):
        at, kind = f"{where}.content[{j}]", block["type"]
        if kind == "text":
            texts.append(_text(at, block))
        elif kind == "image":
            images.append(_image(at, block, budget))
        elif kind == "tool_result":
            results.append(_result(at, block))
        else:
            raise _refused(at, kind, "a user turn takes text, image and tool_result blocks")
    turn = [ChatMessage("user", "".join(texts), images=tuple(images))] if texts or images else []
    return [*results, *turn]


def _assistant_turn(where: str, blocks: list[dict[str, Any]]) -> ChatMessage:
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[ToolCall] = []
    for j, block in enumerate(blocks):
        at, kind = f"{where}.content[{j}]", block["type"]
        if kind == "text":
            texts.append(_text(at, block))
        elif kind == "thinking":
            thought = block.get("thinking")
            if not isinstance(thought, str):
                raise bad(f"{at}.thinking must be a string.", f"{at}.thinking")
            thoughts.append(thought)
        elif kind == "tool_use":
            calls.append(_call(at, block))
        elif kind not in _DROPPED:
            raise _refused(at, kind, "an assistant turn takes text, thinking and tool_use blocks")
    if len(calls) > MAX_CALLS:
        raise bad(f"{where} makes {len(calls)} calls; at most {MAX_CALLS}.", f"{where}.content")
    return ChatMessage("assistant", "".join(texts), "".join(thoughts), tuple(calls))


def _text(at: str, block: dict[str, Any]) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise bad(f"{at}.text must be a string.", f"{at}.text")
    return text


def _image(at: str, block: dict[str, Any], budget: ImageBudget) -> ImagePart:
    source = block.get("source")
    if not isinstance(source, dict) or source.get("type") != "base64":
        raise bad(
            f"{at}: only base64 image sources are taken (this server fetches no URLs).",
            f"{at}.source",
        )
    media, data = source.get("media_type"), source.get("data")
    if not isinstance(media, str) or not isinstance(data, str):
        raise bad(f"{at}.source needs `media_type` and `data` strings.", f"{at}.source")
    url = {"image_url": {"url": f"data:{media};base64,{data}"}}
    return image_part(at, url, budget)


def _result(at: str, block: dict[str, Any]) -> ChatMessage:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not 0 < len(call_id) <= MAX_ID_CHARS:
        raise bad(
            f"{at}.tool_use_id must name the tool_use this is the result of.", f"{at}.tool_use_id"
        )
    content = block.get("content", "")
    if isinstance(content, list):
        parts = []
        for k, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text" or not isinstance(part, dict):
                raise _refused(f"{at}.content[{k}]", kind, "a tool result here holds text")
            parts.append(_text(f"{at}.content[{k}]", part))
        content = "".join(parts)
    if not isinstance(content, str):
        raise bad(f"{at}.content must be a string or text blocks.", f"{at}.content")
    if block.get("is_error") is True:
        content = f"Error: {content}"
    return ChatMessage("tool", content, tool_call_id=call_id)


def _call(at: str, block: dict[str, Any]) -> ToolCall:
    call_id, name, arguments = block.get("id"), block.get("name"), block.get("input", {})
    if not isinstance(call_id, str) or not 0 < len(call_id) <= MAX_ID_CHARS:
        raise bad(f"{at}.id must be a string of 1 to {MAX_ID_CHARS} characters.", f"{at}.id")
    if not isinstance(name, str) or not name:
        raise bad(f"{at}.name must be the tool's name.", f"{at}.name")
    if not isinstance(arguments, dict):
        raise bad(f"{at}.input must be an object.", f"{at}.input")
    return ToolCall(call_id, name, json.dumps(arguments, ensure_ascii=False))


def _refused(at: str, kind: object, takes: str) -> ApiError:
    known = {"document", "search_result", "server_tool_use", "web_search_tool_result"}
    if isinstance(kind, str) and (kind in known or kind.endswith("_tool_result")):
        return unsupported(at, f"A `{kind}` block")
    return bad(f"{at} is a {short_repr(kind)} block; {takes}.", at)


def _tools(data: dict[str, Any]) -> ToolRequest | None:
    """``tools`` and ``tool_choice`` through the chat completions' checks."""
    choice = data.get("tool_choice")
    return foreign_tools(data, _tool, lambda _d: _choice(choice) if choice is not None else {})


def _tool(i: int, value: object) -> dict[str, Any]:
    where = f"tools[{i}]"
    if not isinstance(value, dict):
        raise bad(f"{where} must be a tool object.", where)
    kind = value.get("type", "custom")
    if kind != "custom":
        raise unsupported(f"{where}.type", f"The server tool {short_repr(kind)}")
    schema = value.get("input_schema")
    if not isinstance(schema, dict):
        raise bad(f"{where}.input_schema must be a JSON Schema object.", f"{where}.input_schema")
    fn = {"name": value.get("name"), "description": value.get("description"), "parameters": schema}
    return {"type": "function", "function": fn}


def _choice(value: object) -> dict[str, Any]:
    kind = value.get("type") if isinstance(value, dict) else None
    if not isinstance(value, dict) or not isinstance(kind, str):
        kind = None
    if not isinstance(value, dict) or (kind not in _CHOICE and kind != "tool"):
        raise bad(
            '`tool_choice` must be {"type": "auto"}, {"type": "any"}, {"type": "none"} or '
            f'{{"type": "tool", "name": ...}} (got {short_repr(value)}).',
            "tool_choice",
        )
    choice: Any = _CHOICE.get(kind)
    if kind == "tool":
        choice = {"type": "function", "function": {"name": value.get("name")}}
    out: dict[str, Any] = {"tool_choice": choice}
    if value.get("disable_parallel_tool_use") is True:
        out["parallel_tool_calls"] = False
    return out
