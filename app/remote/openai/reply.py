"""How one reply of an OpenAI-compatible server ends: its request's state, its tokens
as events, its stop reason, its counts, and its tool calls."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass

from app.config.setting_records import SamplingParams
from app.engine.backend import Token
from app.engine.chat_message import ChatMessage, ToolCall, is_prefix
from app.engine.metrics import MessageMetrics
from app.engine.tool_spec import TOOL_CALLS, ToolRequest
from app.remote.http import sentence, too_large
from app.remote.openai.tool_wire import calls_note
from app.remote.openai.wire import ReplyStream, first_float, first_int


@dataclass
class Request:
    """One reply's requests: what is sent, and what was dropped to make it fit."""

    messages: list[ChatMessage]
    max_tokens: int
    dropped_from: int = 0
    dropped_count: int = 0
    dropped_tokens: int = 0


@dataclass
class OwnPrefix:
    """This client's last request since ``forget``: its messages, reply and counts.

    The server's prefix cache is shared by all its clients, and ``KvPool`` resets the
    backend when another party (the window, an API key) asks next; so the server's
    cached count is reported only up to the tokens this client itself sent or was sent
    in that request (``cached``), never what another conversation left there.
    """

    request: tuple[ChatMessage, ...] = ()
    reply: ChatMessage | None = None
    prompt_tokens: int = 0
    generated: int = 0

    def cached(self, messages: Sequence[ChatMessage], count: int) -> int:
        """``count`` (the server's) capped at what ``messages`` repeat of the last request:
        its prompt and reply, its prompt alone (the same request again), or nothing."""
        if self.reply is None:
            return 0
        if is_prefix((*self.request, self.reply), messages):
            return min(count, self.prompt_tokens + self.generated)
        return min(count, self.prompt_tokens) if is_prefix(self.request, messages) else 0


def finish_metrics(
    metrics: MessageMetrics, reply: ReplyStream, req: Request, estimate: int, own: OwnPrefix
) -> None:
    """Token counts and rates: the server's where it gives them, else this client's
    (``estimate``: of the prompt); the cached count within ``own``, which then records
    this request."""
    usage, timings = reply.usage, reply.timings
    metrics.generated_tokens = first_int(usage.get("completion_tokens")) or (
        reply.deltas + reply.tools.deltas
    )
    details = usage.get("completion_tokens_details")
    thought = details.get("reasoning_tokens") if isinstance(details, dict) else None
    metrics.reasoning_tokens = first_int(thought) or reply.reasoning_deltas
    metrics.prompt_tokens = first_int(usage.get("prompt_tokens")) or estimate
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    server = first_int(timings.get("cache_n"), cached)
    metrics.cached_tokens = own.cached(req.messages, server)
    evaluated = first_int(timings.get("prompt_n"))
    metrics.evaluated_tokens = (
        evaluated + server - metrics.cached_tokens
        if evaluated
        else max(0, metrics.prompt_tokens - metrics.cached_tokens)
    )
    if first_float(timings.get("prompt_ms")) > 0:
        metrics.prefill_ms = first_float(timings.get("prompt_ms"))
    metrics.native_prefill_tok_s = first_float(timings.get("prompt_per_second"))
    metrics.native_decode_tok_s = first_float(timings.get("predicted_per_second"))
    reply_message = ChatMessage("assistant", reply.text)
    own.request, own.reply = tuple(req.messages), reply_message
    own.prompt_tokens, own.generated = metrics.prompt_tokens, metrics.generated_tokens


def tokens(
    parts: Sequence[tuple[bool, str]], metrics: MessageMetrics, now_ms: float
) -> Generator[Token, None, None]:
    """``parts`` as tokens; the first answer text's time goes into ``metrics``."""
    for thought, text in parts:
        if not thought and not metrics.first_answer_ms:
            metrics.first_answer_ms = now_ms
        yield Token(text, thought)


def stop_reason(reply: ReplyStream, metrics: MessageMetrics, req: Request) -> str:
    if reply.finish_reason != "length":
        return "eos"  # "stop" (end of turn or a stop string), "content_filter"
    completion = first_int(reply.usage.get("completion_tokens"))
    if 0 < completion < req.max_tokens:
        return "context_full"  # the server ended it before the length asked for
    if metrics.n_ctx > 0 and metrics.prompt_tokens + metrics.generated_tokens >= metrics.n_ctx:
        return "context_full"
    return "max_tokens"


def tool_calls_of(
    reply: ReplyStream, metrics: MessageMetrics, tools: ToolRequest | None
) -> tuple[ToolCall, ...]:
    """The calls a reply asked for, ``metrics`` updated: a reply that ended cleanly with
    calls stops for them (``tool_calls``, whatever the server's finish reason); one that
    ended otherwise makes none (a call cut short is not the call the model meant), and
    a note says so. A stream past the bounds (``tools.over``) makes none either."""
    calls = _calls_of(reply, metrics)
    check_choice(tools, calls, metrics)
    return calls


def _calls_of(reply: ReplyStream, metrics: MessageMetrics) -> tuple[ToolCall, ...]:
    calls = reply.tools.calls()
    if reply.tools.over or not (calls or reply.tools.nameless):
        return ()
    if metrics.stop_reason != "eos":
        if calls:
            metrics.notes.append(
                "the reply ended before its tool calls were complete; none was made"
            )
        return ()
    metrics.notes.extend(calls_note(calls, reply.tools.nameless))
    if calls:
        metrics.stop_reason = TOOL_CALLS
    return calls


def check_choice(
    tools: ToolRequest | None, calls: Sequence[ToolCall], metrics: MessageMetrics
) -> None:
    """A note when the tool the request named was not called: llama-server (for one)
    takes no named ``tool_choice`` and lets the model choose."""
    named = tools.named() if tools is not None else None
    if named is None or metrics.stop_reason == "cancelled":
        return
    if not any(c.name == named.name for c in calls):
        metrics.notes.append(
            f"the server did not make the call to {named.name} that was asked for; it may "
            "not support choosing the tool"
        )


def size_note(reply: ReplyStream, max_bytes: int) -> str:
    """Why a reply that grew too large ended: its text, or its tool calls."""
    if reply.full:
        return too_large(max_bytes)
    return f"{sentence(reply.tools.problem)} No call was made."


def drop_note(req: Request) -> str:
    n = req.dropped_count
    return (
        f"the context was full: {n} older message{'s' if n != 1 else ''} (about "
        f"{req.dropped_tokens} tokens) left the model's memory; the server reads the "
        "kept text again. They stay in the transcript"
    )


def new_metrics(req: Request, params: SamplingParams, n_ctx: int) -> MessageMetrics:
    """A reply's metrics before any text: the context, the seed, what was dropped."""
    metrics = MessageMetrics(
        n_ctx=n_ctx,
        seed=params.seed if params.seed >= 0 else None,
        dropped_from=req.dropped_from,
        dropped_count=req.dropped_count,
        dropped_tokens=req.dropped_tokens,
    )
    if req.dropped_count:
        metrics.notes.append(drop_note(req))
    return metrics
