"""Response bodies: ``chat.completion`` / ``text_completion`` and their SSE chunks.

Hand-written ``data: <json>\\n\\n`` events (no sse-starlette, no pydantic): a token
chunk is string concatenation around ``json.dumps(text)``, so a token costs one
small dumps and no dict. ``usage`` carries OpenAI's
``prompt_tokens_details.cached_tokens`` and every final chunk / response carries
llama-server's ``timings`` (``prompt_n`` = tokens evaluated, ``cache_n`` = reused,
``predicted_per_second`` = the engine's decode rate), which Lamplight's own
``openai_compat`` backend reads.

A reasoning model's thinking goes apart from the answer, as llama-server and vLLM
send it: ``message.reasoning_content`` (absent when there was none), streamed as
``delta.reasoning_content`` chunks, counted in
``usage.completion_tokens_details.reasoning_tokens``. A text completion has no turns,
so its thinking (if any) is just text.

A reply that ends asking for tool calls (``Finished.tool_calls``) has
``message.tool_calls``, ``content`` null when it said nothing else, and
``finish_reason: "tool_calls"``. The engine parses the calls at the end of the reply,
so a stream sends each call whole in one ``delta.tool_calls`` chunk (``index``, ``id``,
``name`` and all of ``arguments``: valid, as a client accumulates the pieces).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from app.api.gateway import ApiFailure, ApiKind
from app.engine.backend import Finished
from app.engine.metrics import MessageMetrics
from app.engine.tool_spec import TOOL_CALLS

DONE = b"data: [DONE]\n\n"

# The engine's stop_reason for a reply that ended as it should -> OpenAI's
# finish_reason. Any other reason ("cancelled", "connection_lost", one added later)
# means the reply was cut short: the server answers that as an error
# (``errors.cut_short``), never as an ordinary "stop" a client would take as whole.
FINISH = {
    "eos": "stop",
    "stop_string": "stop",
    "max_tokens": "length",
    "context_full": "length",
    TOOL_CALLS: "tool_calls",
}


def finish_reason(stop_reason: str, calls: bool = False) -> str:
    """OpenAI's ``finish_reason``; ``calls``: the reply asked for tool calls."""
    return "tool_calls" if calls else FINISH.get(stop_reason, "stop")


def usage(metrics: MessageMetrics) -> dict[str, Any]:
    return {
        "prompt_tokens": metrics.prompt_tokens,
        "completion_tokens": metrics.generated_tokens,
        "total_tokens": metrics.prompt_tokens + metrics.generated_tokens,
        "prompt_tokens_details": {"cached_tokens": metrics.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": metrics.reasoning_tokens},
    }


def timings(metrics: MessageMetrics) -> dict[str, Any]:
    """llama-server's ``timings`` object from the engine's own figures."""
    decode = metrics.decode_tok_s
    prefill = metrics.prefill_tok_s
    return {
        "prompt_n": metrics.evaluated_tokens,
        "cache_n": metrics.cached_tokens,
        "prompt_ms": round(metrics.prefill_ms, 3),
        "prompt_per_token_ms": round(1000.0 / prefill, 3) if prefill else 0.0,
        "prompt_per_second": round(prefill, 3),
        "predicted_n": metrics.generated_tokens,
        "predicted_ms": round(metrics.decode_ms, 3),
        "predicted_per_token_ms": round(1000.0 / decode, 3) if decode else 0.0,
        "predicted_per_second": round(decode, 3),
    }


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True)
class Reply:
    """What every body of one response shares."""

    kind: ApiKind
    id: str
    model: str
    created: int
    # The request's compaction (``app.api.compact_field.report``): in the whole response,
    # or in a stream's first chunk.
    compaction: dict[str, Any] | None = None

    @property
    def object(self) -> str:
        return "chat.completion" if self.kind == "chat" else "text_completion"

    def body(self, done: Finished) -> dict[str, Any]:
        """The whole non-streaming response."""
        m = done.metrics
        choice: dict[str, Any] = {"index": 0, "logprobs": None}
        if self.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": done.text, "refusal": None}
            if done.reasoning:
                message["reasoning_content"] = done.reasoning
            if done.tool_calls:
                message["content"] = done.text or None
                message["tool_calls"] = [c.openai() for c in done.tool_calls]
            choice["message"] = message
        else:
            choice["text"] = done.reasoning + done.text
        choice["finish_reason"] = finish_reason(m.stop_reason, bool(done.tool_calls))
        return {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": [choice],
            "usage": usage(m),
            "timings": timings(m),
        } | ({"compaction": self.compaction} if self.compaction is not None else {})


class ChunkWriter:
    """The SSE events of one streamed response."""

    def __init__(self, reply: Reply, include_usage: bool) -> None:
        self.reply = reply
        self.include_usage = include_usage
        chat = reply.kind == "chat"
        obj = "chat.completion.chunk" if chat else "text_completion"
        head = (
            f'data: {{"id":{_dumps(reply.id)},"object":"{obj}","created":{reply.created},'
            f'"model":{_dumps(reply.model)},"system_fingerprint":null,'
        )
        tail = ',"usage":null}\n\n' if include_usage else "}\n\n"
        # A token chunk: head + choices around the text + tail.
        if chat:
            self._open = head + '"choices":[{"index":0,"delta":{"content":'
            self._open_thought = head + '"choices":[{"index":0,"delta":{"reasoning_content":'
            self._close = '},"logprobs":null,"finish_reason":null}]' + tail
        else:
            self._open = self._open_thought = head + '"choices":[{"index":0,"text":'
            self._close = ',"logprobs":null,"finish_reason":null}]' + tail
        self._head = head
        self._tail = tail

    def start(self) -> bytes:
        """The role chunk a chat stream opens with (nothing for a completion)."""
        if self.reply.kind != "chat":
            return b""
        found = self.reply.compaction
        tail = self._tail if found is None else f',"compaction":{_dumps(found)}{self._tail}'
        return (
            self._head
            + '"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
            + '"logprobs":null,"finish_reason":null}]'
            + tail
        ).encode()

    def token(self, text: str, reasoning: bool = False) -> bytes:
        """A chunk of answer text, or of thinking (``reasoning``)."""
        head = self._open_thought if reasoning else self._open
        return (head + _dumps(text) + self._close).encode()

    def call_chunk(self, index: int, call: dict[str, Any]) -> dict[str, Any]:
        """One whole tool call as a ``delta.tool_calls`` chunk."""
        delta = {"tool_calls": [{"index": index, **call}]}
        return self.chunk([{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}])

    def chunk(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.reply.id,
            "object": "chat.completion.chunk" if self.reply.kind == "chat" else "text_completion",
            "created": self.reply.created,
            "model": self.reply.model,
            "system_fingerprint": None,
            "choices": choices,
        }
        if self.include_usage:
            data["usage"] = None
        data.update(extra)
        return data

    def failure(self, failure: ApiFailure) -> bytes:
        """A failure after the 200: one ``data:`` event, and no ``[DONE]``."""
        return failure_event(failure)

    def finish(self, done: Finished) -> bytes:
        """The tool calls' chunks, the finish_reason chunk, the usage chunk when asked
        for, then ``[DONE]``."""
        m = done.metrics
        calls = bool(done.tool_calls) and self.reply.kind == "chat"
        events = [self.call_chunk(i, c.openai()) for i, c in enumerate(done.tool_calls) if calls]
        choice: dict[str, Any] = {"index": 0}
        if self.reply.kind == "chat":
            choice["delta"] = {}
        else:
            choice["text"] = ""
        choice["logprobs"] = None
        choice["finish_reason"] = finish_reason(m.stop_reason, calls)
        events.append(self.chunk([choice], timings=timings(m)))
        if self.include_usage:
            events.append(self.chunk([], usage=usage(m), timings=timings(m)))
        return b"".join(b"data: " + _dumps(e).encode() + b"\n\n" for e in events) + DONE


def error_body(message: str, type: str, code: str | None, param: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def failure_event(failure: ApiFailure) -> bytes:
    """A failure after the 200 of a stream: one ``data:`` event, and no ``[DONE]``."""
    body = error_body(failure.message, failure.type, failure.code, failure.param)
    return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"
