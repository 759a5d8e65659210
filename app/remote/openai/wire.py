"""What OpenAI-compatible servers send and refuse, checked field by field: the model
list, the streamed reply's chunks, and the errors that say a request did not fit.

Pure functions and data: every field of an answer is type-checked before use, so any
JSON value is safe to feed them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from app.config.field_spec import SettingError
from app.config.params import template_variables
from app.config.setting_records import SamplingParams
from app.engine.backend import MAX_REPLY_BYTES, fit_bytes
from app.engine.reasoning.format import ReasoningFormat
from app.engine.reasoning.splitter import Part, ReasoningSplitter
from app.engine.templates.chat_template import clean_text
from app.remote.http import JSON_DEPTH, ServerError, sentence
from app.remote.image_wire import vision_of_model
from app.remote.openai.tool_wire import ToolCallStream
from app.util.datafiles import DataFileError, parse_json
from app.util.errors import ApiKeyRefused, DecodeError, LamplightError, ServerOverflowError

MAX_MODELS = 1000  # entries read from /v1/models
MAX_ID = 300  # characters of a model id


EXTRA_FIELDS = ("top_k", "min_p", "repeat_penalty", "repetition_penalty")
"""Sent besides the OpenAI fields: llama-server and LM Studio read ``repeat_penalty``,
vLLM ``repetition_penalty``; all three read ``top_k`` and ``min_p``."""
MAX_COUNT = (1 << 31) - 1  # a token count or context size above this is not believed


@dataclass(frozen=True)
class ServerModel:
    """One entry of ``/v1/models``; numbers the server did not give are 0."""

    id: str
    n_ctx: int = 0
    n_ctx_train: int = 0
    n_params: int = 0
    size: int = 0
    owned_by: str = ""
    vision: bool | None = None  # takes images (None: the server does not say)


def parse_models(data: Any) -> list[ServerModel]:
    """The entries of a ``/v1/models`` answer, in the server's order.

    The context size is llama-server's ``meta.n_ctx``, vLLM's ``max_model_len``,
    or ``context_length`` / ``max_context_length`` (OpenRouter, LM Studio).
    """
    items = data.get("data") if isinstance(data, dict) else None
    out: list[ServerModel] = []
    for item in items if isinstance(items, list) else []:
        if len(out) >= MAX_MODELS:
            break
        if not isinstance(item, dict):
            continue
        ident = item.get("id")
        if not isinstance(ident, str) or not ident.strip() or len(ident) > MAX_ID:
            continue
        meta = item.get("meta")
        meta = meta if isinstance(meta, dict) else {}
        n_ctx = first_int(
            meta.get("n_ctx"),
            item.get("max_model_len"),
            item.get("context_length"),
            item.get("max_context_length"),
        )
        out.append(
            ServerModel(
                id=ident,
                n_ctx=n_ctx,
                n_ctx_train=first_int(meta.get("n_ctx_train")),
                n_params=first_int(meta.get("n_params")),
                size=first_int(meta.get("size")),
                owned_by=str(item.get("owned_by") or "")[:100],
                vision=vision_of_model(item, data),
            )
        )
    return out


INLINE_THINK = ReasoningFormat("<think>", "</think>", source="known")
"""The block a server that does not split reasoning leaves in the content."""
_REASONING_KEYS = ("reasoning_content", "reasoning")  # llama-server / vLLM, OpenRouter / Ollama


@dataclass
class ReplyStream:
    """The content of a ``chat.completion.chunk`` stream, fed event by event.

    Pure: every field of an event is checked before use, so any JSON value is
    safe to feed. The text is kept as parts (joined once, not copied per delta) and
    stops at ``max_bytes`` (``full``): a delta that would pass it is cut.

    Thinking comes apart as ``delta.reasoning_content`` (or ``delta.reasoning``); a
    server that does not split it leaves ``<think>...</think>`` at the start of the
    content, which is split here (``INLINE_THINK``). ``deltas`` counts the deltas that
    brought text of either kind, ``reasoning_deltas`` those that brought thinking.
    ``tools`` puts together the calls of ``delta.tool_calls`` (``message.tool_calls``).
    """

    max_bytes: int = MAX_REPLY_BYTES
    deltas: int = 0
    reasoning_deltas: int = 0
    size: int = 0  # UTF-8 bytes of the text (thinking included)
    full: bool = False
    finish_reason: str = ""
    usage: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, Any] = field(default_factory=dict)
    error: dict[str, Any] | None = None
    tools: ToolCallStream = field(default_factory=ToolCallStream)
    parts: list[str] = field(default_factory=list, repr=False)
    thoughts: list[str] = field(default_factory=list, repr=False)
    _pending: str = field(default="", repr=False)  # content before it is known to think
    _splitter: ReasoningSplitter | None = field(default=None, repr=False)
    _plain: bool = field(default=False, repr=False)  # the content holds no thinking block

    @property
    def text(self) -> str:
        return "".join(self.parts)

    @property
    def reasoning(self) -> str:
        return "".join(self.thoughts)

    def feed(self, event: Any) -> str:
        """Take one event; returns its new answer text ("" when none)."""
        return "".join(t for r, t in self.feed_parts(event) if not r)

    def feed_parts(self, event: Any) -> list[Part]:
        """Take one event; returns its new (thinking?, text) parts."""
        if not isinstance(event, dict):
            return []
        if event.get("error"):
            err = event["error"]
            self.error = err if isinstance(err, dict) else {"message": str(err)[:300]}
            return []
        usage = event.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        timings = event.get("timings")  # llama-server's own rates
        if isinstance(timings, dict):
            self.timings = timings
        choices = event.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return []
        choice = choices[0]
        reason = choice.get("finish_reason")
        if isinstance(reason, str) and reason:
            self.finish_reason = reason[:40]
        delta = choice.get("delta")
        if not isinstance(delta, dict):  # a whole answer where a chunk was expected
            delta = choice.get("message")
        if not isinstance(delta, dict) or self.full:
            return []
        self.tools.feed(delta.get("tool_calls"))
        out: list[Part] = []
        took = False
        thought = next((delta[k] for k in _REASONING_KEYS if isinstance(delta.get(k), str)), "")
        if thought:
            self._plain = self._plain or self._splitter is None  # the server splits
            took, parts = self._take(thought, True)
            out += parts
        piece = delta.get("content")
        if isinstance(piece, str) and piece and not self.full:
            took_content, parts = self._take(piece, False)
            took, out = took or took_content, out + parts
        if took:
            self.deltas += 1
            inside = self._splitter is not None and self._splitter.inside
            self.reasoning_deltas += inside or any(r for r, _ in out)
        return out

    def finish(self) -> list[Part]:
        """What was held back (a possible marker) once the stream has ended."""
        pending, self._pending = self._pending, ""
        parts = self._splitter.flush() if self._splitter is not None else []
        return self._keep([(False, pending)] if pending else parts)

    def _take(self, piece: str, thinking: bool) -> tuple[bool, list[Part]]:
        """``piece`` within the byte cap: whether any of it was taken, and its parts."""
        cut, n, over = fit_bytes(clean_text(piece), self.size, self.max_bytes)
        self.full = self.full or over
        self.size += n
        if not cut:
            return False, []
        return True, self._keep([(True, cut)] if thinking else self._content(cut))

    def _content(self, piece: str) -> list[Part]:
        if self._splitter is not None:
            return self._splitter.feed(piece)
        if self._plain:
            return [(False, piece)]
        text = self._pending + piece
        head = text.lstrip()
        if INLINE_THINK.open.startswith(head) and head != INLINE_THINK.open:
            self._pending = text  # blank, or it might still be "<think>"
            return []
        self._pending = ""
        if head.startswith(INLINE_THINK.open):
            self._splitter = ReasoningSplitter(INLINE_THINK)
            return self._splitter.feed(head)
        self._plain = True
        return [(False, text)]

    def _keep(self, parts: list[Part]) -> list[Part]:
        parts = [(r, t) for r, t in parts if t]
        for r, t in parts:
            (self.thoughts if r else self.parts).append(t)
        return parts


def reasoning_fields(params: SamplingParams, refused: set[str]) -> dict[str, Any]:
    """``reasoning_effort`` and ``chat_template_kwargs`` for the thinking settings, less
    the fields the server ``refused``.

    Raises:
        SettingError: ``params.template_kwargs`` is not a JSON object.
    """
    out: dict[str, Any] = {}
    if params.reasoning_effort != "auto":
        out["reasoning_effort"] = params.reasoning_effort
    kwargs = template_variables(params)
    if params.thinking in ("on", "off"):
        kwargs["enable_thinking"] = params.thinking == "on"
    if kwargs:
        out["chat_template_kwargs"] = kwargs
    return {k: v for k, v in out.items() if k not in refused}


def refused_field(exc: ServerError, fields: Any) -> str:
    """The one of ``fields`` a 400 (or 422) answer names ("" for none)."""
    if exc.status not in (400, 422):
        return ""
    text = str(exc)
    return next((f for f in fields if f in text), "")


def response_format_for(params: SamplingParams) -> dict[str, Any] | None:
    """The ``response_format`` for the output format.

    Raises:
        SettingError: a GBNF grammar, or a JSON schema that is not a JSON object.
    """
    fmt = params.output_format
    if fmt == "gbnf":
        raise SettingError(
            "grammar",
            "An OpenAI-compatible server cannot take a GBNF grammar. Use JSON mode or a JSON "
            "schema, or add the server as a llama.cpp server if it is llama-server.",
        )
    if fmt == "json":
        return {"type": "json_object"}
    if fmt == "json_schema":
        try:
            schema = parse_json(params.json_schema, JSON_DEPTH * 4)
        except DataFileError as exc:
            raise SettingError("json_schema", f"The JSON schema {exc}.") from None
        if not isinstance(schema, dict):
            raise SettingError("json_schema", "The JSON schema must be a JSON object.")
        return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
    return None


def unsent_notes(params: SamplingParams) -> list[str]:
    unsent = []
    if params.mirostat != "off":
        unsent.append("mirostat")
    if params.typical_p != 1.0:
        unsent.append("typical-p")
    if not unsent:
        return []
    return [f"an OpenAI-compatible server takes no {' or '.join(unsent)} setting; not sent"]


_CTX_PATTERNS = (
    re.compile(r"maximum context length is (\d+)"),
    re.compile(r"context (?:size|length|window) (?:is |of )?\(?(\d+)"),
    re.compile(r"available context size \((\d+)"),
)
_PROMPT_PATTERNS = (
    re.compile(r"(\d+) in the messages"),
    re.compile(r"(\d+) input tokens"),
    re.compile(r"messages resulted in (\d+) tokens"),
    re.compile(r"request \((\d+) tokens\)"),
    re.compile(r"requested (\d+) tokens"),
)
_OVERFLOW_KINDS = ("exceed_context_size_error", "context_length_exceeded")
_OVERFLOW_WORDS = re.compile(r"context (?:length|size|window)|too many tokens", re.IGNORECASE)


def overflow_numbers(exc: ServerError) -> tuple[int, int] | None:
    """``(prompt tokens, context size)`` when ``exc`` says the request does not fit the
    context (0 for a number it does not give); None for another error.

    Knows llama-server's error body and the messages of vLLM and OpenAI.
    """
    message = str(exc)[:2000]
    if exc.kind not in _OVERFLOW_KINDS and not (
        exc.status in (0, 400, 413, 422) and _OVERFLOW_WORDS.search(message)
    ):
        return None
    n_prompt = first_int(exc.body.get("n_prompt_tokens"))
    n_ctx = first_int(exc.body.get("n_ctx"))
    if not n_ctx:
        n_ctx = next((int(m[1]) for p in _CTX_PATTERNS if (m := p.search(message))), 0)
    if not n_prompt:
        n_prompt = next((int(m[1]) for p in _PROMPT_PATTERNS if (m := p.search(message))), 0)
    return n_prompt, n_ctx


def refuses_extras(exc: ServerError) -> bool:
    """A 400 that names one of ``EXTRA_FIELDS`` as unknown (OpenAI's own API)."""
    text = str(exc).lower()
    return (
        exc.status in (400, 422)
        and any(f in text for f in EXTRA_FIELDS)
        and any(w in text for w in ("unrecognized", "unknown", "not permitted", "extra"))
    )


def event_error(err: dict[str, Any]) -> ServerError:
    code = err.get("code")
    status = code if isinstance(code, int) and not isinstance(code, bool) else 0
    message = str(err.get("message") or "")[:500]
    kind = str(err.get("type") or err.get("code") or "")[:100]
    return ServerError(status, f"The server stopped the reply: {message}", kind, err)


def key_message(exc: ServerError) -> str:
    return f"{sentence(str(exc))} Check the API key in the connection's settings."


def first_int(*values: Any) -> int:
    """The first value that is an int (not a bool) in 0..MAX_COUNT; 0 if none is."""
    for v in values:
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_COUNT:
            return v
    return 0


def first_float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    if isinstance(value, int) and value > MAX_COUNT:  # float() of a huge int raises
        return 0.0
    return max(0.0, float(value)) if math.isfinite(value) else 0.0


def generation_error(exc: ServerError, n_ctx: int) -> LamplightError:
    """The error a failed request becomes, once nothing more can be tried."""
    if exc.status in (401, 403):
        return ApiKeyRefused(key_message(exc))
    over = overflow_numbers(exc)
    if over is not None:
        n_prompt, server_ctx = over
        return ServerOverflowError(n_prompt, server_ctx or n_ctx)
    if "response_format" in str(exc) or "json_schema" in str(exc):
        return SettingError("output_format", f"The server refused the output format: {exc}")
    return DecodeError(str(exc))
