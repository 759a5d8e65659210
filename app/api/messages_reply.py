"""Anthropic's Messages API, the answer (issue 46): the whole message, the stream's
events and the error shape, from the same engine events a chat completion gets.

A stream is ``message_start``, a ``ping``, then content blocks in order, each
``content_block_start``, its deltas and ``content_block_stop``: thinking
(``thinking_delta``) and text (``text_delta``) as they come, the tool calls last (one
``input_json_delta`` each: a call is known whole only when the model has written it),
then ``message_delta`` (``stop_reason``, ``stop_sequence``, the usage) and
``message_stop``. A failure after the stream began is one ``error`` event. Usage counts
as Anthropic does: ``cache_read_input_tokens`` came from the cache,
``cache_creation_input_tokens`` were read and saved for later requests (an agent's
opening: ``app.host.prompt_cache``), ``input_tokens`` the rest read (the three sum to
the prompt).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from app.api.gateway import ApiFailure
from app.engine.backend import Finished
from app.engine.chat_message import ToolCall
from app.engine.metrics import MessageMetrics

# engine stop reason -> Anthropic's (a stop string is "stop_sequence" only when it was
# one of the request's: ``MessagesReply.stop_reason``).
_STOP = {
    "eos": "end_turn",
    "stop_string": "end_turn",
    "max_tokens": "max_tokens",
    "context_full": "model_context_window_exceeded",
    "tool_calls": "tool_use",
}
# status -> Anthropic's error type
_ERRORS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def error_type(status: int) -> str:
    return _ERRORS.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_body(status: int, message: str) -> dict[str, Any]:
    """An error in Anthropic's shape."""
    return {"type": "error", "error": {"type": error_type(status), "message": message}}


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {_dumps(data)}\n\n".encode()


def usage(m: MessageMetrics, output: bool = True) -> dict[str, Any]:
    return {
        "input_tokens": max(0, m.prompt_tokens - m.cached_tokens - m.cache_written),
        "cache_creation_input_tokens": m.cache_written,
        "cache_read_input_tokens": m.cached_tokens,
        "output_tokens": m.generated_tokens if output else 0,
        "output_tokens_details": {"thinking_tokens": m.reasoning_tokens if output else 0},
    }


def tool_block(call: ToolCall, whole: bool = True) -> dict[str, Any]:
    """A call as a ``tool_use`` block (its ``input`` empty when it comes in deltas)."""
    try:
        arguments = json.loads(call.arguments) if whole else {}
    except ValueError:
        arguments = {}
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": arguments}


@dataclass(frozen=True)
class MessagesReply:
    """What every body of one answer shares."""

    id: str  # "msg_<24 hex>"
    model: str
    stops: tuple[str, ...]  # the request's stop_sequences

    def stop_reason(self, m: MessageMetrics) -> tuple[str, str | None]:
        """Anthropic's ``stop_reason`` and ``stop_sequence``."""
        if m.stop_reason == "stop_string" and m.stop_match in self.stops:
            return "stop_sequence", m.stop_match
        return _STOP.get(m.stop_reason, "end_turn"), None

    def body(self, done: Finished) -> dict[str, Any]:
        """The whole message."""
        content: list[dict[str, Any]] = []
        if done.reasoning:
            content.append({"type": "thinking", "thinking": done.reasoning, "signature": ""})
        # Blank text before a call stays: sent back, it keeps the cached prefix.
        if done.text or not (done.reasoning or done.tool_calls):
            content.append({"type": "text", "text": done.text})
        content += [tool_block(c) for c in done.tool_calls]
        reason, sequence = self.stop_reason(done.metrics)
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": usage(done.metrics),
        }


class MessageEvents:
    """The SSE events of one streamed answer (a ``StreamWriter``)."""

    def __init__(self, reply: MessagesReply) -> None:
        self.reply = reply
        self.index = -1  # the open block's
        self.open = ""  # its type: "thinking", "text", "" (none open)

    def start(self) -> bytes:
        message: dict[str, Any] = {
            "id": self.reply.id,
            "type": "message",
            "role": "assistant",
            "model": self.reply.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage(MessageMetrics(), output=False),
        }
        return _event("message_start", {"type": "message_start", "message": message}) + _event(
            "ping", {"type": "ping"}
        )

    def token(self, text: str, reasoning: bool = False) -> bytes:
        kind = "thinking" if reasoning else "text"
        out = b"" if self.open == kind else self._close() + self._begin({"type": kind, kind: ""})
        if kind == "thinking":
            delta = {"type": "thinking_delta", "thinking": text}
        else:
            delta = {"type": "text_delta", "text": text}
        data = {"type": "content_block_delta", "index": self.index, "delta": delta}
        return out + _event("content_block_delta", data)

    def finish(self, done: Finished) -> bytes:
        out = self._close()
        if self.index < 0 and not done.tool_calls:  # nothing was said: one empty text block
            out += self._begin({"type": "text", "text": ""}) + self._close()
        for call in done.tool_calls:
            out += self._begin(tool_block(call, whole=False))
            delta = {"type": "input_json_delta", "partial_json": call.arguments}
            out += _event(
                "content_block_delta",
                {"type": "content_block_delta", "index": self.index, "delta": delta},
            )
            out += self._close()
        reason, sequence = self.reply.stop_reason(done.metrics)
        ended: dict[str, Any] = {"stop_reason": reason, "stop_sequence": sequence}
        out += _event(
            "message_delta",
            {"type": "message_delta", "delta": ended, "usage": usage(done.metrics)},
        )
        return out + _event("message_stop", {"type": "message_stop"})

    def failure(self, failure: ApiFailure) -> bytes:
        return _event("error", error_body(failure.status, failure.message))

    def _begin(self, block: dict[str, Any]) -> bytes:
        self.index += 1
        self.open = block["type"] if block["type"] in ("thinking", "text") else "tool_use"
        if block["type"] == "thinking":
            block = {**block, "signature": ""}
        data = {"type": "content_block_start", "index": self.index, "content_block": block}
        return _event("content_block_start", data)

    def _close(self) -> bytes:
        if not self.open:
            return b""
        self.open = ""
        data = {"type": "content_block_stop", "index": self.index}
        return _event("content_block_stop", data)
