"""OpenAI's Responses API, the answer (issue 46): the response object and the stream's
events, from the same engine events a chat completion gets.

The output is a ``reasoning`` item (the thinking, as ``reasoning_text``), a ``message``
item (the answer, one ``output_text`` part) and a ``function_call`` item per call, in
that order. A stream is ``response.created``, ``response.in_progress``, then each item:
``response.output_item.added``, its part and deltas (``response.reasoning_text.delta``,
``response.output_text.delta``; a call's ``response.function_call_arguments.delta``,
whole, at the end: a call is known only once written) and their ``done`` events,
``response.output_item.done``; then ``response.completed`` (or ``response.incomplete``
when the reply ran out of tokens) with the whole response. Every event carries its
``sequence_number``. A failure after the stream began is one ``error`` event (which
the ``openai`` SDK raises as ``APIError``).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.api.gateway import ApiFailure
from app.engine.backend import Finished
from app.engine.chat_message import ToolCall
from app.engine.metrics import MessageMetrics

_INCOMPLETE = {"max_tokens": "max_output_tokens", "context_full": "max_output_tokens"}


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def usage(m: MessageMetrics) -> dict[str, Any]:
    return {
        "input_tokens": m.prompt_tokens,
        "input_tokens_details": {"cached_tokens": m.cached_tokens},
        "output_tokens": m.generated_tokens,
        "output_tokens_details": {"reasoning_tokens": m.reasoning_tokens},
        "total_tokens": m.prompt_tokens + m.generated_tokens,
    }


def reasoning_item(rid: str, text: str, done: bool = True) -> dict[str, Any]:
    content = [{"type": "reasoning_text", "text": text}] if done else []
    return {"type": "reasoning", "id": rid, "summary": [], "content": content}


def message_item(mid: str, text: str, done: bool = True) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": []}] if done else []
    status = "completed" if done else "in_progress"
    return {"type": "message", "id": mid, "status": status, "role": "assistant", "content": content}


def call_item(fid: str, call: ToolCall, done: bool = True) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": fid,
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments if done else "",
        "status": "completed" if done else "in_progress",
    }


@dataclass
class ResponsesReply:
    """What every body of one response shares; ``output`` once it ended."""

    id: str  # "resp_<24 hex>"
    model: str
    created: int
    echo: dict[str, Any]  # the request's fields a response repeats
    previous: str = ""
    store: bool = True
    output: list[dict[str, Any]] = field(default_factory=list)
    # Hears the ended response once (to store it).
    ended: Callable[[dict[str, Any]], None] | None = None

    def body(self, done: Finished | None) -> dict[str, Any]:
        """The response: in progress (``done`` None), or ended."""
        status, incomplete = "in_progress", None
        if done is not None:
            reason = _INCOMPLETE.get(done.metrics.stop_reason)
            status = "incomplete" if reason else "completed"
            incomplete = {"reason": reason} if reason else None
            if not self.output:
                self.output = outputs(done)
        echo = self.echo
        body = {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": None,
            "incomplete_details": incomplete,
            "instructions": echo.get("instructions"),
            "max_output_tokens": echo.get("max_output_tokens"),
            "model": self.model,
            "output": self.output if done is not None else [],
            "parallel_tool_calls": echo.get("parallel_tool_calls", True),
            "previous_response_id": self.previous or None,
            "reasoning": {"effort": None, "summary": None},
            "store": self.store,
            "temperature": echo.get("temperature"),
            "text": {"format": {"type": "text"}},
            "tool_choice": echo.get("tool_choice", "auto"),
            "tools": echo.get("tools", []),
            "top_p": echo.get("top_p"),
            "truncation": echo.get("truncation", "disabled"),
            "usage": usage(done.metrics) if done is not None else None,
            "metadata": echo.get("metadata", {}),
        }
        if done is not None and self.ended is not None:
            ended, self.ended = self.ended, None
            ended(body)
        return body


def outputs(done: Finished) -> list[dict[str, Any]]:
    """A reply's output items."""
    out = [reasoning_item(item_id("rs"), done.reasoning)] if done.reasoning else []
    if done.text or not done.tool_calls:
        out.append(message_item(item_id("msg"), done.text))
    return out + [call_item(item_id("fc"), c) for c in done.tool_calls]


class ResponseEvents:
    """The SSE events of one streamed response (a ``StreamWriter``)."""

    def __init__(self, reply: ResponsesReply) -> None:
        self.reply = reply
        self.seq = 0
        self.open = ""  # "reasoning" or "message": the item being written
        self.texts: list[str] = []  # the open item's text so far
        self.items: list[dict[str, Any]] = []  # the finished items

    def _event(self, kind: str, **data: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.seq, **data}
        self.seq += 1
        return f"event: {kind}\ndata: {_dumps(payload)}\n\n".encode()

    def start(self) -> bytes:
        body = self.reply.body(None)
        return self._event("response.created", response=body) + self._event(
            "response.in_progress", response=body
        )

    def token(self, text: str, reasoning: bool = False) -> bytes:
        kind = "reasoning" if reasoning else "message"
        out = b"" if self.open == kind else self._close() + self._begin(kind)
        self.texts.append(text)
        where = {"item_id": self._id, "output_index": len(self.items), "content_index": 0}
        if reasoning:
            return out + self._event("response.reasoning_text.delta", **where, delta=text)
        return out + self._event("response.output_text.delta", **where, delta=text, logprobs=[])

    def finish(self, done: Finished) -> bytes:
        out = self._close()
        if not self.items and not done.tool_calls:  # nothing was said: one empty message
            out += self._begin("message") + self._close()
        for call in done.tool_calls:
            fid, index = item_id("fc"), len(self.items)
            out += self._event(
                "response.output_item.added", output_index=index, item=call_item(fid, call, False)
            )
            where = {"item_id": fid, "output_index": index}
            out += self._event(
                "response.function_call_arguments.delta", **where, delta=call.arguments
            )
            out += self._event(
                "response.function_call_arguments.done",
                **where,
                name=call.name,
                arguments=call.arguments,
            )
            item = call_item(fid, call)
            self.items.append(item)
            out += self._event("response.output_item.done", output_index=index, item=item)
        self.reply.output = self.items
        body = self.reply.body(done)
        kind = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
        return out + self._event(kind, response=body)

    def failure(self, failure: ApiFailure) -> bytes:
        """The ``error`` event, with the ``error`` object too: the ``openai`` SDK raises
        ``APIError`` on it (a reply cut short is never taken for a whole one)."""
        detail: dict[str, Any] = {"message": failure.message, "type": failure.type}
        detail |= {"code": failure.code, "param": failure.param}
        return self._event(
            "error", code=failure.code, message=failure.message, param=failure.param, error=detail
        )

    def _begin(self, kind: str) -> bytes:
        self.open, self.texts = kind, []
        self._id = item_id("rs" if kind == "reasoning" else "msg")
        index = len(self.items)
        if kind == "reasoning":
            item = reasoning_item(self._id, "", done=False)
            return self._event("response.output_item.added", output_index=index, item=item)
        part = {"type": "output_text", "text": "", "annotations": []}
        where = {"item_id": self._id, "output_index": index, "content_index": 0}
        return self._event(
            "response.output_item.added", output_index=index, item=message_item(self._id, "", False)
        ) + self._event("response.content_part.added", **where, part=part)

    def _close(self) -> bytes:
        if not self.open:
            return b""
        kind, text, index = self.open, "".join(self.texts), len(self.items)
        self.open = ""
        where = {"item_id": self._id, "output_index": index, "content_index": 0}
        if kind == "reasoning":
            item = reasoning_item(self._id, text)
            out = self._event("response.reasoning_text.done", **where, text=text)
        else:
            item = message_item(self._id, text)
            part = item["content"][0]
            out = self._event("response.output_text.done", **where, text=text, logprobs=[])
            out += self._event("response.content_part.done", **where, part=part)
        self.items.append(item)
        return out + self._event("response.output_item.done", output_index=index, item=item)
