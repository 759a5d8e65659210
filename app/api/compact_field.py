"""The API's ``compact`` extension field (issue 45): a chat request may ask for its
older turns to be summarised before the answer, as the window's Compact chat does
(``app.chat.compaction``).

``"compact": true`` (or ``{"keep": 2, "prompt": "...", "max_tokens": 512}``) summarises the messages
before the last ``keep`` exchanges that precede the request's last user message; the
answer is then written from the system message with the summary after it, the kept
exchanges and the new message. The summary is asked for over the history as the
client sent it before (the server's cache holds it: only the instruction is read),
written on a copy of the cache, and never streamed.

The response reports it (``compaction``: ``report``): the summary, which messages
it replaced (``replaced``: ``[start, end]``, indexes into the request's messages) and
the ``system`` message to send from now on in place of the request's own (a request
naming a project sends it as its one system message: ``project_field.with_project``
puts the project's instructions before it). The client keeps its own history, so
going back is sending the old messages again (read again once: nothing is kept
for it here). A compaction that cannot be made (too little to summarise, no room in
the context, an empty summary) is reported with ``skipped`` and the answer is
written from the messages as sent.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from app.api.errors import bad
from app.chat.compact_run import FULL, TOO_LITTLE
from app.chat.compaction import DEFAULT_PROMPT, KEEP_TURNS, SUMMARY_TOKENS
from app.chat.conversation import SUMMARY_HEADING
from app.config.field_spec import short_repr
from app.config.setting_records import SamplingParams
from app.engine.backend import Finished
from app.engine.chat_message import ChatMessage

MAX_KEEP = 64
MAX_PROMPT_CHARS = 4_000
SUMMARY_LIMITS = (16, 4096)  # what ``max_tokens`` may be
FIELDS = ("keep", "prompt", "max_tokens")
EMPTY = "The summary came back empty: nothing was compacted."


@dataclass(frozen=True)
class CompactAsk:
    """What a request's ``compact`` asks for."""

    keep: int = KEEP_TURNS  # exchanges before the last user message that stay word for word
    prompt: str = DEFAULT_PROMPT  # the instruction ({kept}: how many messages stay)
    max_tokens: int = SUMMARY_TOKENS  # the summary's length limit (not the answer's)


@dataclass(frozen=True)
class ApiPlan:
    """``messages[start:end]`` are summarised; the summary's request is ``messages[:ask]``
    and the instruction (``ask``: the last user message, where the new part begins)."""

    start: int
    end: int
    ask: int


def read_compact(data: dict[str, Any]) -> CompactAsk | None:
    """The request's ``compact`` (None when it asks for none).

    Raises:
        ApiError: 400 naming ``compact`` when it is not true, false or an object with
            ``keep`` (0 to 64), ``prompt`` (a string of at most 4,000 characters) and
            ``max_tokens`` (16 to 4,096), each optional.
    """
    value = data.get("compact")
    if value is None or value is False:
        return None
    if value is True:
        return CompactAsk()
    if not isinstance(value, dict) or set(value) - set(FIELDS):
        raise bad(
            '`compact` must be true, false or an object with "keep", "prompt" and '
            f'"max_tokens" (got {short_repr(value)}).',
            "compact",
        )
    keep = _whole(value, "keep", KEEP_TURNS, (0, MAX_KEEP))
    length = _whole(value, "max_tokens", SUMMARY_TOKENS, SUMMARY_LIMITS)
    prompt = value.get("prompt", DEFAULT_PROMPT)
    if not isinstance(prompt, str) or not prompt.strip() or len(prompt) > MAX_PROMPT_CHARS:
        raise bad(
            f"`compact.prompt` must be a non-empty string of at most {MAX_PROMPT_CHARS:,} "
            "characters.",
            "compact",
        )
    return CompactAsk(keep, prompt, length)


def _whole(value: dict[str, Any], name: str, default: int, bounds: tuple[int, int]) -> int:
    got = value.get(name, default)
    low, high = bounds
    if not isinstance(got, int) or isinstance(got, bool) or not low <= got <= high:
        raise bad(f"`compact.{name}` must be a whole number from {low} to {high:,}.", "compact")
    return got


def plan(messages: list[ChatMessage], keep: int) -> ApiPlan | None:
    """What compacting ``messages`` summarises; None when there is too little: fewer
    than two messages before the last ``keep`` exchanges, or no user message to answer."""
    start = next((i for i, m in enumerate(messages) if m.role not in ("system", "developer")), 0)
    users = [i for i in range(start, len(messages)) if messages[i].role == "user"]
    if not users:
        return None
    ask, earlier = users[-1], users[:-1]
    if len(earlier) <= keep:
        return None
    end = earlier[-keep] if keep > 0 else ask
    if end - start < 2 or messages[end - 1].role == "user":
        return None
    return ApiPlan(start, end, ask)


def summary_request(
    messages: list[ChatMessage], found: ApiPlan, ask: CompactAsk
) -> list[ChatMessage]:
    """The history before the new part, then the instruction naming how many messages stay."""
    kept = found.ask - found.end
    return [*messages[: found.ask], ChatMessage("user", ask.prompt.replace("{kept}", str(kept)))]


def summary_params(params: SamplingParams, ask: CompactAsk) -> SamplingParams:
    """The request's sampling, for the summary: plain text, at most ``ask.max_tokens``."""
    return replace(
        params,
        max_tokens=ask.max_tokens,
        output_format="text",
        json_schema="",
        grammar="",
        stop=(),
        overflow="stop",  # the summary must not drop what it summarises
    )


def summary_block(summary: str) -> str:
    """The summary as the system message carries it (as the window's chats do)."""
    return f"{SUMMARY_HEADING}\n{summary.strip()}"


def with_summary(system: str, summary: str) -> str:
    """``system`` (the request's system text, "" for none) with the summary after it."""
    head = f"{system.rstrip()}\n\n" if system.strip() else ""
    return head + summary_block(summary)


def compacted(messages: list[ChatMessage], found: ApiPlan, summary: str) -> list[ChatMessage]:
    """The messages the answer is written from: one system message (the request's
    system text, then the summary), the kept exchanges and the new part."""
    system = "\n\n".join(m.content for m in messages[: found.start] if m.content.strip())
    return [ChatMessage("system", with_summary(system, summary)), *messages[found.end :]]


def skipped(why: str) -> dict[str, Any]:
    return {"skipped": why}


def too_little(ask: CompactAsk) -> dict[str, Any]:
    return skipped(TOO_LITTLE.format(keep=ask.keep))


def no_room(n_ctx: int) -> dict[str, Any]:
    return skipped(FULL.format(n_ctx=n_ctx))


def report(found: ApiPlan, done: Finished, system: str, offset: int = 0) -> dict[str, Any]:
    """The response's ``compaction``: what was summarised and what to send from now on
    (``system``: the system message to send in place of the request's own; ``offset``:
    the messages the server put before the request's, a project's system message)."""
    m = done.metrics
    return {
        "summary": done.text.strip(),
        "replaced": [max(0, found.start - offset), max(0, found.end - offset)],
        "summarised": found.end - found.start,
        "system": system,
        "summary_tokens": m.generated_tokens,
        "history_tokens": m.prompt_tokens,
        "read_tokens": max(0, m.prompt_tokens - m.cached_tokens),
    }
