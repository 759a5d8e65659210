"""Request bodies of ``/v1/chat/completions`` and ``/v1/completions``, checked.

The body is parsed with the bounded ``parse_json`` and every sampling field goes
through ``app.config.params.validate_sampling``, so a value the app's own panel
would refuse is refused here too, as a 400 naming the API field (``param``).
Fields Lamplight cannot honour (``n > 1``, logprobs, audio...) are refused,
never silently ignored; fields it does not know are ignored, as OpenAI's SDKs add
new ones all the time. Omitted sampling fields take ``SamplingParams()`` defaults
(not the panel's), with ``overflow="stop"`` and no drafting; an omitted
``max_tokens`` means "up to the end of the context" (``ApiRequest.params_for``).

Reasoning, as llama-server takes it: ``reasoning_effort`` ("none" switches thinking
off, "minimal" is "low"), ``chat_template_kwargs`` (``enable_thinking`` and
``reasoning_effort`` become the thinking settings, the rest more template variables),
``thinking_budget_tokens`` / ``reasoning_budget`` (-1: no limit, 0: no thinking), and
an assistant message's ``reasoning_content`` (or ``reasoning``): its thinking.

Tools (``tools``, ``tool_choice``, ``tool_calls``, ``tool`` messages) are checked in
``tool_schema``; images (``image_url`` parts with ``data:`` URLs) in ``image_parts``.

``parse_request`` runs on a worker thread, not the server's event loop. Python's
``json`` holds the GIL for a whole parse, and its time grows with the number of values,
not bytes (an 8 MB ``[[],[],...]`` took seconds), so a body with more than
``MAX_JSON_ITEMS`` commas and brackets is refused before it is parsed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from app.api.compact_field import CompactAsk, read_compact
from app.api.errors import ApiError, bad, unsupported
from app.api.gateway import ApiKind
from app.api.image_parts import IMAGE_KINDS, ImageBudget, image_part
from app.api.project_field import read_project
from app.api.tool_schema import link_results, parse_tools, tool_calls, tool_result
from app.config.field_spec import SettingError, short_repr
from app.config.params import validate_sampling
from app.config.setting_records import SamplingParams
from app.engine.chat_message import ChatMessage, ImagePart, Role
from app.engine.tool_spec import ToolRequest
from app.util.datafiles import DataFileError, parse_json, reason

Dialect = Literal["openai", "anthropic", "responses"]
MAX_DEPTH = 64
# Commas and brackets (a bound on JSON values, strings' own included): 4,096 messages
# take about 16,000, and 200,000 parse in well under 0.2 s whatever their shape.
MAX_JSON_ITEMS = 200_000
MAX_MESSAGES = 4096
MAX_STOP = 16
MAX_STOP_CHARS = 256
MAX_USER_CHARS = 64  # the client label the UI shows
MAX_KWARGS_DEPTH = 8  # nesting of chat_template_kwargs (templates read flat flags)
MAX_KWARGS_CHARS = 10_000  # chat_template_kwargs as JSON (SamplingParams.template_kwargs)
BASE = SamplingParams(overflow="stop", speculative=False)

_ROLES: dict[str, Role] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
}
# API field -> SamplingParams field, for the plain numbers.
_NUMBERS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "typical_p": "typical_p",
    "repeat_penalty": "repeat_penalty",
    "repeat_last_n": "repeat_last_n",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "seed": "seed",
    "mirostat_tau": "mirostat_tau",
    "mirostat_eta": "mirostat_eta",
}
_MIROSTAT = {0: "off", 1: "v1", 2: "v2"}
# OpenAI's reasoning_effort -> (thinking, effort): "none" switches thinking off.
_EFFORT = {
    "none": ("off", "auto"),
    "minimal": ("auto", "low"),
    "low": ("auto", "low"),
    "medium": ("auto", "medium"),
    "high": ("auto", "high"),
    "xhigh": ("auto", "high"),
}


@dataclass(frozen=True)
class ResponsesAsk:
    """What a Responses request has beyond its messages."""

    store: bool = True
    previous: str = ""  # previous_response_id
    items: list[dict[str, Any]] = field(default_factory=list)  # its input, as items
    echo: dict[str, Any] = field(default_factory=dict)  # fields the response repeats


@dataclass(frozen=True)
class ApiRequest:
    """A checked request, ready to become an ``ApiJob``."""

    kind: ApiKind
    model: str  # "" when the request named none: the loaded model
    messages: list[ChatMessage]
    params: SamplingParams  # max_tokens is the default when ``max_tokens`` is None
    max_tokens: int | None  # None: up to the end of the context
    stream: bool = False
    include_usage: bool = False
    reuse: bool = True  # cache_prompt
    user: str = ""
    tools: ToolRequest | None = None  # None: the request offers no tools
    project: str = ""  # a chat request's ``project`` (``app/api/project_field.py``)
    compact: CompactAsk | None = None  # its ``compact`` (``app/api/compact_field.py``)
    dialect: Dialect = "openai"  # whose shape the answer takes ("anthropic": /v1/messages)
    responses: ResponsesAsk | None = None  # a /v1/responses request's own (``responses_schema``)

    def params_for(self, n_ctx: int) -> SamplingParams:
        """The sampling settings with the length limit for a context of ``n_ctx``."""
        if self.max_tokens is not None:
            return self.params
        return replace(self.params, max_tokens=max(1, n_ctx))


def load_body(raw: bytes) -> dict[str, Any]:
    """The JSON object of a request body (bounded depth and item count).

    Raises:
        ApiError: 400 (not a JSON object), 413 (more than ``MAX_JSON_ITEMS`` items).
    """
    if not raw.strip():
        raise bad("The request body is empty; send a JSON object.", None, "invalid_json")
    items = raw.count(b",") + raw.count(b"[") + raw.count(b"{")
    if items > MAX_JSON_ITEMS:
        raise ApiError(
            413,
            f"The request body holds {items:,} commas and brackets; at most "
            f"{MAX_JSON_ITEMS:,} are accepted, far more than a chat within a model's "
            "context needs.",
            code="request_too_large",
        )
    try:
        data = parse_json(raw, max_depth=MAX_DEPTH)
    except DataFileError as exc:
        raise bad(f"The request body {reason_text(exc)}.", None, "invalid_json") from exc
    if not isinstance(data, dict):
        raise bad("The request body must be a JSON object.", None, "invalid_json")
    return data


def parse_request(kind: ApiKind, raw: bytes) -> ApiRequest:
    """A raw ``/v1/chat/completions`` (``chat``) or ``/v1/completions`` body, checked.

    Raises:
        ApiError: 400 naming the field, or 413 (see ``load_body``).
    """
    body = load_body(raw)
    return parse_chat(body) if kind == "chat" else parse_completion(body)


def reason_text(exc: DataFileError) -> str:
    text = reason(exc)
    return "is " + text if not text.startswith(("is ", "could ")) else text


def parse_chat(body: object) -> ApiRequest:
    """A ``/v1/chat/completions`` body (a decoded JSON value), checked.

    Raises:
        ApiError: 400, naming the field (``param``).
    """
    data = _object(body)
    _refuse_common(data)
    if data.get("logprobs") not in (None, False):
        raise unsupported("logprobs", "Token log probabilities")
    if data.get("top_logprobs") not in (None, 0):
        raise unsupported("top_logprobs", "Token log probabilities")
    if _given(data.get("audio")):
        raise unsupported("audio", "Audio output")
    modalities = data.get("modalities")
    if _given(modalities) and modalities != ["text"]:
        raise unsupported("modalities", "Output other than text")
    if _given(data.get("prediction")):
        raise unsupported("prediction", "Predicted outputs")
    tools = parse_tools(data)
    messages = link_results(_messages(data.get("messages")))
    return replace(
        request_from("chat", data, messages),
        tools=tools,
        project=read_project(data),
        compact=read_compact(data),
    )


def parse_completion(body: object) -> ApiRequest:
    """A ``/v1/completions`` body, checked; the prompt becomes one user message.

    Raises:
        ApiError: 400, naming the field (``param``).
    """
    data = _object(body)
    _refuse_common(data)
    if data.get("compact") not in (None, False):
        raise bad("`compact` is for chat requests (/v1/chat/completions).", "compact")
    if data.get("echo") not in (None, False):
        raise unsupported("echo", "Echoing the prompt")
    suffix = data.get("suffix")
    if _given(suffix) and suffix != "":
        raise unsupported("suffix", "Insertion (suffix)")
    best_of = data.get("best_of")
    if _given(best_of) and best_of != 1:
        raise unsupported("best_of", "best_of other than 1")
    if data.get("logprobs") not in (None, False, 0):
        raise unsupported("logprobs", "Token log probabilities")
    prompt = data.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        if prompt is None:
            raise bad("`prompt` is required.", "prompt", "missing_required_parameter")
        tokens = isinstance(prompt, list) and all(
            isinstance(p, int | list) and not isinstance(p, bool) for p in prompt
        )
        if tokens and prompt:
            raise unsupported("prompt", "A prompt of token ids")
        if isinstance(prompt, list) and len(prompt) > 1:
            raise unsupported("prompt", "More than one prompt per request")
        raise bad("`prompt` must be a string.", "prompt")
    return request_from("completion", data, [ChatMessage("user", prompt)])


def _object(body: object) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad("The request body must be a JSON object.", None, "invalid_json")
    return body


def _given(value: object) -> bool:
    return value is not None


def _refuse_common(data: dict[str, Any]) -> None:
    n = data.get("n")
    if _given(n) and (isinstance(n, bool) or n != 1):
        raise unsupported("n", "More than one choice (n other than 1)")
    bias = data.get("logit_bias")
    if _given(bias) and bias != {}:
        raise unsupported("logit_bias", "logit_bias")


def _bool(data: dict[str, Any], name: str, default: bool) -> bool:
    value = data.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad(f"`{name}` must be true or false (got {short_repr(value)}).", name)
    return value


def _messages(value: object) -> list[ChatMessage]:
    if value is None:
        raise bad("`messages` is required.", "messages", "missing_required_parameter")
    if not isinstance(value, list):
        raise bad("`messages` must be a list of messages.", "messages")
    if not value:
        raise bad("`messages` must hold at least one message.", "messages")
    if len(value) > MAX_MESSAGES:
        raise bad(f"At most {MAX_MESSAGES} messages per request.", "messages")
    budget = ImageBudget()
    return [_message(i, m, budget) for i, m in enumerate(value)]


def _message(i: int, value: object, budget: ImageBudget) -> ChatMessage:
    where = f"messages[{i}]"
    if not isinstance(value, dict):
        raise bad(f"{where} must be an object with `role` and `content`.", where)
    role = value.get("role")
    if role == "function":
        raise unsupported(f"{where}.role", "A legacy `function` message (send `tool`)")
    if role == "tool":
        return tool_result(where, value, _content(where, role, value.get("content"), budget)[0])
    if not isinstance(role, str) or role not in _ROLES:
        raise bad(
            f"{where}.role must be system, developer, user, assistant or tool "
            f"(got {short_repr(role)}).",
            f"{where}.role",
        )
    calls = tool_calls(where, value) if role == "assistant" else ()
    if role != "assistant" and (value.get("tool_calls") or value.get("function_call")):
        raise bad(f"Only an assistant message makes tool calls ({where}).", f"{where}.tool_calls")
    content, images = _content(where, role, value.get("content"), budget)
    message = ChatMessage(_ROLES[role], content, _reasoning(where, role, value), calls)
    return replace(message, images=images) if images else message


def _reasoning(where: str, role: str, value: dict[str, Any]) -> str:
    """An assistant message's thinking, sent back by a client (``reasoning_content``)."""
    for name in ("reasoning_content", "reasoning"):
        text = value.get(name)
        if text is None or text == "":
            continue
        if not isinstance(text, str):
            raise bad(f"{where}.{name} must be a string.", f"{where}.{name}")
        # Only an assistant's turn has thinking; the template never shows another's.
        return text if role == "assistant" else ""
    return ""


def _content(
    where: str, role: str, content: object, budget: ImageBudget
) -> tuple[str, tuple[ImagePart, ...]]:
    """A message's text (its text parts joined) and its images, in the order given."""
    if isinstance(content, str):
        return content, ()
    if content is None and role in ("assistant", "tool"):
        return "", ()
    if not isinstance(content, list):
        raise bad(
            f"{where}.content must be a string or a list of content parts.", f"{where}.content"
        )
    texts: list[str] = []
    images: list[ImagePart] = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in IMAGE_KINDS and isinstance(part, dict):
            if role != "user":
                raise bad(f"Images are taken in user messages only ({at} is {role!r}).", at)
            images.append(image_part(at, part, budget))
            continue
        if kind in ("input_audio", "audio", "file"):
            raise unsupported(at, f"A `{kind}` part (this server reads text and images)")
        text = part.get("text") if isinstance(part, dict) else None
        if kind not in ("text", "input_text") or not isinstance(text, str):
            raise bad(f'{at} must be {{"type": "text", "text": "..."}} or an image_url part.', at)
        texts.append(text)
    return "".join(texts), tuple(images)


def request_from(kind: ApiKind, data: dict[str, Any], messages: list[ChatMessage]) -> ApiRequest:
    """A request of ``kind`` from ``data`` (chat completions' field names) and its
    checked ``messages``: the sampling fields, stream, user and cache_prompt.

    Raises:
        ApiError: 400 naming the field.
    """
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise bad("`model` must be a string.", "model")
    values: dict[str, Any] = {}
    api_name: dict[str, str] = {}  # SamplingParams field -> the API field it came from
    for name, target in _NUMBERS.items():
        if data.get(name) is not None:
            values[target] = data[name]
            api_name[target] = name
    if data.get("mirostat") is not None:
        mode = data["mirostat"]
        if not isinstance(mode, int) or isinstance(mode, bool) or mode not in _MIROSTAT:
            raise bad(f"`mirostat` must be 0, 1 or 2 (got {short_repr(mode)}).", "mirostat")
        values["mirostat"] = _MIROSTAT[mode]
    max_tokens: int | None = None
    for name in ("max_completion_tokens", "max_tokens"):
        if data.get(name) is not None:
            values["max_tokens"] = data[name]
            api_name["max_tokens"] = name
            break
    stop = data.get("stop")
    if stop is not None:
        values["stop"] = stop_strings(stop)
    values.update(_structured(data, api_name))
    values.update(_thinking(data, api_name))
    try:
        params = validate_sampling(values, BASE)
    except SettingError as exc:
        param = api_name.get(exc.field, exc.field)
        if exc.field in ("json_schema", "output_format"):
            param = api_name.get(exc.field, "response_format")
        raise bad(str(exc), param) from exc
    if "max_tokens" in values:
        max_tokens = params.max_tokens
    stream = _bool(data, "stream", False)
    options = data.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise bad("`stream_options` must be an object.", "stream_options")
        include_usage = _bool(options, "include_usage", False)
    user = data.get("user")
    if user is not None and not isinstance(user, str):
        raise bad("`user` must be a string.", "user")
    return ApiRequest(
        kind=kind,
        model=model or "",
        messages=messages,
        params=params,
        max_tokens=max_tokens,
        stream=stream,
        include_usage=include_usage,
        reuse=_bool(data, "cache_prompt", True),
        user=(user or "")[:MAX_USER_CHARS],
    )


def stop_strings(stop: object, name: str = "stop") -> tuple[str, ...]:
    """A request's stop strings (field ``name``): a string or a list, bounded.

    Raises:
        ApiError: 400 naming the field.
    """
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise bad(f"`{name}` must be a string or a list of strings.", name)
    if len(items) > MAX_STOP:
        raise bad(f"`{name}` takes at most {MAX_STOP} strings.", name)
    if any(not s or len(s) > MAX_STOP_CHARS for s in items):
        raise bad(f"Each `{name}` string must have 1 to {MAX_STOP_CHARS} characters.", name)
    return tuple(items)


def _structured(data: dict[str, Any], api_name: dict[str, str]) -> dict[str, Any]:
    """``response_format`` and ``grammar`` as SamplingParams fields."""
    out: dict[str, Any] = {}
    fmt = data.get("response_format")
    if fmt is not None:
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind == "json_object":
            out["output_format"] = "json"
        elif kind == "json_schema":
            spec = fmt.get("json_schema") if isinstance(fmt, dict) else None
            schema = spec.get("schema") if isinstance(spec, dict) else None
            if not isinstance(schema, dict):
                raise bad(
                    "`response_format.json_schema.schema` must be a JSON Schema object.",
                    "response_format",
                )
            out["output_format"] = "json_schema"
            out["json_schema"] = json.dumps(schema, ensure_ascii=False)
        elif kind != "text":
            raise bad(
                "`response_format.type` must be text, json_object or json_schema "
                f"(got {short_repr(kind)}).",
                "response_format",
            )
        api_name["output_format"] = api_name["json_schema"] = "response_format"
    grammar = data.get("grammar")
    if grammar is not None and grammar != "":
        if "output_format" in out:
            raise bad("Send either `grammar` or a JSON `response_format`, not both.", "grammar")
        if not isinstance(grammar, str):
            raise bad("`grammar` must be a GBNF grammar (a string).", "grammar")
        out["output_format"] = "gbnf"
        out["grammar"] = grammar
        api_name["output_format"] = api_name["grammar"] = "grammar"
    return out


def _effort(value: object, param: str) -> tuple[str, str]:
    if not isinstance(value, str) or value not in _EFFORT:
        raise bad(
            f"`{param}` must be one of {', '.join(_EFFORT)} (got {short_repr(value)}).", param
        )
    return _EFFORT[value]


def _depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


def _thinking(data: dict[str, Any], api_name: dict[str, str]) -> dict[str, Any]:
    """``reasoning_effort``, ``chat_template_kwargs`` and a thinking budget as
    SamplingParams fields (the top-level ``reasoning_effort`` wins over the kwargs')."""
    out: dict[str, Any] = {}
    kwargs = data.get("chat_template_kwargs")
    if kwargs is not None:
        out.update(_template_kwargs(kwargs, api_name))
    effort = data.get("reasoning_effort")
    if effort is not None:
        thinking, level = _effort(effort, "reasoning_effort")
        out["reasoning_effort"] = level
        if thinking != "auto":
            out["thinking"] = thinking
        api_name["reasoning_effort"] = api_name["thinking"] = "reasoning_effort"
    for name in ("thinking_budget_tokens", "reasoning_budget"):
        budget = data.get(name)
        if budget is None:
            continue
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < -1:
            raise bad(
                f"`{name}` must be a whole number of tokens, -1 for no limit or 0 for "
                f"no thinking (got {short_repr(budget)}).",
                name,
            )
        if budget == 0:
            out["thinking"] = "off"
        out["thinking_budget"] = max(0, budget)
        api_name["thinking_budget"] = name
        break
    return out


def _template_kwargs(kwargs: object, api_name: dict[str, str]) -> dict[str, Any]:
    param = "chat_template_kwargs"
    if not isinstance(kwargs, dict):
        raise bad(f"`{param}` must be an object of template variables.", param)
    if _depth(kwargs) > MAX_KWARGS_DEPTH:
        raise bad(f"`{param}` is nested more than {MAX_KWARGS_DEPTH} levels deep.", param)
    out: dict[str, Any] = {}
    rest = dict(kwargs)
    switch = rest.pop("enable_thinking", None)
    if switch is not None:
        if not isinstance(switch, bool):
            raise bad(
                f"`{param}.enable_thinking` must be true or false (got {short_repr(switch)}).",
                param,
            )
        out["thinking"] = "on" if switch else "off"
    effort = rest.pop("reasoning_effort", None)
    if effort is not None:
        thinking, out["reasoning_effort"] = _effort(effort, f"{param}.reasoning_effort")
        if thinking != "auto":
            out["thinking"] = thinking
    if rest:
        text = json.dumps(rest, ensure_ascii=False)
        if len(text) > MAX_KWARGS_CHARS:
            raise bad(
                f"`{param}` holds {len(text):,} characters of JSON; at most "
                f"{MAX_KWARGS_CHARS:,} are accepted.",
                param,
            )
        out["template_kwargs"] = text
    for name in ("thinking", "reasoning_effort", "template_kwargs"):
        api_name[name] = param
    return out
