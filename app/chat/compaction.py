"""Compaction you can undo (issue 45): the older turns summarised, the chat going on
from the system prompt, the summary and the recent turns.

A compaction is a version of the conversation, as a regenerate is. From the first
message the model still reads (``plan.start``: the previous summary, if any) the tail is
kept as an alternative, word for word; the new tail is copies of the summarised
messages, marked ``summarised`` (shown, never sent), then the summary (an assistant
message with ``summary_of``: the id of the first message of the tail it replaced),
then copies of the kept turns. The model reads the summary after the system prompt
(``Conversation.system_text``); a later compaction summarises it again with the turns
after it. Undo (``undo``) shows the replaced tail again: the window restores the cache
saved before the compaction, so nothing is read again.

The summary is asked for over the whole conversation as the model reads it (its
cache holds it: only the request is read), with the instruction to leave out the turns
that stay; the engine writes it on a copy of the cache and puts the cache back after
(``ReplyJob.compaction``), so a stopped or failed summary changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from app.chat.conversation import Conversation, Message, is_turn, new_id
from app.engine.chat_message import ChatMessage

# Shown and editable in the settings (Sampling → When the context is full → compact).
DEFAULT_PROMPT = (
    "Write a summary of our conversation above for your own later use, leaving out the "
    "last {kept} messages, which stay as they are. Keep every fact, decision, name, "
    "number and open question; say which tools were called and what they gave, and "
    "name the pictures and documents that were shared. Leave out any thinking. Write "
    "short plain sentences, and add nothing new."
)
KEEP_TURNS = 2  # the user turns (with their replies) that stay word for word
SUMMARY_TOKENS = 512  # the most a summary may take


@dataclass(frozen=True)
class Plan:
    """What a compaction summarises: messages ``start``..``end`` (indexes into
    ``conversation.messages``), then the turns from ``end`` on stay.

    ``summarised``: how many of them the model reads now (the earlier summary counts as
    one); ``freed``/``kept_tokens``: tokens they and the kept turns take in the context,
    as the last replies measured (0 where not known)."""

    start: int
    end: int
    summarised: int
    freed: int
    kept_tokens: int


def plan(conv: Conversation, keep_turns: int = KEEP_TURNS) -> Plan | None:
    """What compacting ``conv`` would summarise; None when there is too little: fewer
    than two turns before the last ``keep_turns`` user turns."""
    msgs = conv.messages
    summary = conv.active_summary()
    first = msgs.index(summary) if summary is not None else 0
    read = [i for i in range(first, len(msgs)) if is_turn(msgs[i]) or msgs[i] is summary]
    users = [i for i in read if msgs[i].role == "user" and not msgs[i].summary_of]
    if len(users) <= keep_turns:
        return None
    end = users[-keep_turns] if keep_turns > 0 else len(msgs)
    summarised = [i for i in read if i < end]
    if len(summarised) < 2 or msgs[end - 1].role == "user":
        return None
    freed, kept = _tokens(conv, first, end), _tokens(conv, end, len(msgs))
    return Plan(summarised[0], end, len(summarised), freed, kept)


def _tokens(conv: Conversation, a: int, b: int) -> int:
    """Tokens messages ``a``..``b`` take in the context: from the turn offsets the
    replies recorded (0 when they are not known)."""
    msgs = conv.messages
    starts = [m.token_offset for m in msgs[a:b] if m.token_offset is not None and is_turn(m)]
    if not starts:
        return 0
    after = next(
        (m.token_offset for m in msgs[b:] if m.token_offset is not None and is_turn(m)),
        conv.n_tokens,
    )
    return max(0, after - min(starts))


def request(
    chat: Sequence[ChatMessage], conv: Conversation, found: Plan, prompt: str = DEFAULT_PROMPT
) -> list[ChatMessage]:
    """The summary's request: the chat as the model reads it (``conv.chat()``), then the
    instruction as a user turn (naming how many messages stay)."""
    kept = sum(1 for m in conv.messages[found.end :] if is_turn(m))
    return [*chat, ChatMessage("user", prompt.replace("{kept}", str(kept)))]


def apply(
    conv: Conversation, found: Plan, summary: str, metrics: dict[str, Any] | None = None
) -> Message:
    """Make the compacted tail the shown version (the replaced one kept); the summary."""
    msgs = conv.messages
    start, end = found.start, found.end
    tail = msgs[start:]
    conv.keep_replaced(start, tail)
    copies = [replace(m, id=new_id(), summarised=True) for m in msgs[start:end]]
    made = Message("assistant", summary.strip(), summary_of=tail[0].id, metrics=metrics)
    kept = [replace(m, id=new_id()) for m in msgs[end:]]
    conv.messages = [*msgs[:start], *copies, made, *kept]
    return made


def compacted(conv: Conversation) -> int | None:
    """Where the active summary's compaction starts (the index of its version's first
    message), or None when the chat shows no compaction."""
    summary = conv.active_summary()
    if summary is None:
        return None
    i = _tail_start(conv.messages, conv.messages.index(summary))
    # The tail from ``i`` is the compaction's version only if it replaced something.
    return i if conv.version_of(i)[1] > 1 else None


def _tail_start(msgs: Sequence[Message], at: int) -> int:
    """The first of the summarised copies before the summary at ``at``: back over them,
    to the previous summary's copy at most (where a second compaction started)."""
    i = at
    while i > 0 and msgs[i - 1].summarised:
        i -= 1
        if msgs[i].summary_of:
            break
    return i


def undo(conv: Conversation) -> str | None:
    """Show the tail the active summary replaced; the summary's id (its compaction's
    saved cache is named by it), or None when there is nothing to undo."""
    summary = conv.active_summary()
    if summary is None or compacted(conv) is None:
        return None
    if conv.reveal(summary.summary_of) is None:
        return None
    conv.n_tokens = context_used(conv)
    return summary.id


def context_used(conv: Conversation) -> int:
    """The context the shown version's last reply left in use (0 when not known)."""
    for m in reversed(conv.messages):
        metrics = m.message_metrics() if m.role == "assistant" else None
        if metrics is not None and metrics.context_used:
            return metrics.context_used
    return 0


def summarised_before(msgs: Sequence[Message], at: int) -> int:
    """How many messages the summary at ``at`` holds ("Summary of N earlier messages")."""
    return at - _tail_start(msgs, at)
