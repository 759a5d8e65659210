"""Which whole messages leave the model's memory when a conversation outgrows the context.

Pure bookkeeping: the engine measures the messages in tokens and applies the
plan to its KV cache (a shift) or re-reads what stays.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from app.engine.chat_message import ChatMessage
from app.engine.context_map import ContextMap
from app.engine.template_errors import ChatTemplateError


def engine_policy(policy: str) -> str:
    """What the engine does for ``policy``: "compact" (the chat compacts itself before it
    fills, ``app.chat.compaction``) drops as "truncate_middle" when a request overflows
    anyway (one long message, a compaction not yet done)."""
    return "truncate_middle" if policy == "compact" else policy


def protected_head(roles: Sequence[str], policy: str) -> int:
    """How many leading messages a policy never drops.

    Both keep the system prompt; ``truncate_middle`` also keeps the first
    exchange (the first user message and the replies to it, with their tool calls
    and results), where the task is usually set. A drop ends before a user message,
    so a call and its result always stay or go together.
    """
    policy = engine_policy(policy)
    head = 0
    while head < len(roles) and roles[head] == "system":
        head += 1
    if policy == "truncate_middle":
        if head < len(roles) and roles[head] == "user":
            head += 1
        while head < len(roles) and roles[head] in ("assistant", "tool"):
            head += 1
    return head


def plan_drop(
    sizes: Sequence[int], roles: Sequence[str], policy: str, need: int, keep_last: int
) -> tuple[int, int] | None:
    """The range ``[a, b)`` of messages to drop, oldest first, that frees ``need`` tokens.

    ``sizes`` are the messages' lengths in tokens. The kept tail starts with a
    user message (so roles still alternate) and holds at least the last
    ``keep_last`` messages. None when the policy cannot free enough.
    """
    policy = engine_policy(policy)
    if policy not in ("truncate_middle", "rolling") or need <= 0:
        return None
    a = protected_head(roles, policy)
    limit = len(sizes) - keep_last
    freed = 0
    b = a
    while b < limit:
        freed += sizes[b]
        b += 1
        if freed >= need and (b == len(roles) or roles[b] == "user"):
            return a, b
    return None


def fewest_kept(messages: Sequence[ChatMessage], policy: str) -> list[ChatMessage]:
    """The fewest of ``messages`` a request can be left with after its drops (``plan_drop``
    with ``keep_last=1``): the protected head, and the tail from the last user message a
    kept tail can start at; all of them when the policy cannot drop."""
    policy = engine_policy(policy)
    if policy not in ("truncate_middle", "rolling"):
        return list(messages)
    roles = [m.role for m in messages]
    a = protected_head(roles, policy)
    b = max((i for i in range(a + 1, len(roles)) if roles[i] == "user"), default=0)
    return [*messages[:a], *messages[b:]] if b else list(messages)


def reply_budget(max_tokens: int, n_ctx: int) -> int:
    """Room a drop leaves for the reply: its length limit, at most a quarter of the context."""
    return max(1, min(max_tokens, n_ctx // 4))


def message_starts(
    render: Callable[[Sequence[ChatMessage], bool], str],
    messages: Sequence[ChatMessage],
    text: str,
    after: int = -1,
) -> dict[int, int]:
    """Where message ``i`` starts in ``text`` (and ``len(messages)``: where the last ends).

    Found by rendering the first ``i`` messages: a template that renders them
    as a prefix of ``text`` has a boundary there; one that does not (a system
    prompt folded into the first user turn), or refuses to render them, has
    none. Only boundaries past ``after`` characters are looked for, newest first.
    """
    out: dict[int, int] = {}
    for i in range(len(messages), -1, -1):
        try:
            head = render(messages[:i], False)
        except ChatTemplateError:
            continue  # a template may refuse a part of a chat (no messages, no user turn)
        if text.startswith(head):
            if len(head) <= after:
                break
            out[i] = len(head)
    return out


@dataclass
class Overflow:
    """One request's context overflow: the messages the model still sees, and the KV surgery.

    Dropping ``[a, b)`` removes their tokens from KV sequence 0 and shifts the
    positions of what follows (``llama_memory_seq_rm`` + ``llama_memory_seq_add``),
    so nothing that stays is evaluated again. A cache that cannot shift drops
    the tail and evaluates it again (``refill``). Both need the cache to hold
    marks at the two message boundaries; without them, the caller re-reads the
    kept text from the last good mark.

    ``head`` are the tokens the engine puts before the template's text (BOS): they
    encode no text, belong to no message, and no drop takes them out of the cache,
    under any policy, so a shifted cache starts as a fresh read of the kept text does.
    """

    render: Callable[[Sequence[ChatMessage], bool], str]
    tokenize: Callable[[str], list[int]]
    cmap: ContextMap
    mem: Any
    can_shift: bool
    refill: Callable[[list[int]], bool]
    policy: str
    messages: list[ChatMessage]
    head: Sequence[int] = ()
    dropped_from: int = 0
    dropped_count: int = 0
    dropped_tokens: int = 0
    reread_tokens: int = 0
    reread_reported: int = 0  # of those, already counted in the request's metrics
    noted: str = ""  # the note last put in the request's metrics

    def drop(self, need: int, keep_last: int) -> bool:
        """Drop the oldest whole turns the policy allows, freeing about ``need`` tokens."""
        msgs = self.messages
        text = self.render(msgs, True)
        starts = message_starts(self.render, msgs, text)
        sizes, last = [0] * len(msgs), None
        for i in sorted(starts):
            if last is not None:
                sizes[last] = len(self.tokenize(text[starts[last] : starts[i]]))
            last = i if i < len(msgs) else None
        plan = plan_drop(sizes, [m.role for m in msgs], self.policy, need, keep_last)
        if plan is None:
            return False
        a, b = plan
        ca, cb = starts.get(a), starts.get(b)
        # Without boundaries in the cached text, the cache is left as it is: the caller
        # re-reads the kept text from the last mark that still matches.
        if (
            ca is not None
            and cb is not None
            and self.cmap.text[:cb] == text[:cb]
            and not self._cut(ca, cb)
        ):
            return False
        if not self.dropped_count:
            self.dropped_from = a
        self.dropped_count += b - a
        self.dropped_tokens += sum(sizes[a:b])
        self.messages = [*msgs[:a], *msgs[b:]]
        return True

    def _cut(self, ca: int, cb: int) -> bool:
        """Take the tokens encoding ``text[ca:cb]`` out of the cache; False if a re-read stopped.

        Does nothing (the caller re-reads instead) without marks at both ends.
        """
        import llama_cpp

        cmap = self.cmap
        n_a, n_b = cmap.char_mark(ca), cmap.char_mark(cb)
        if n_a is None or n_b is None:
            return True
        # A drop from the first message starts at mark (0, 0), before BOS: BOS stays.
        n_a = max(n_a, self._head_len())
        if n_a >= n_b:
            return True
        if self.can_shift and llama_cpp.llama_memory_seq_rm(self.mem, 0, n_a, n_b):
            llama_cpp.llama_memory_seq_add(self.mem, 0, n_b, -1, n_a - n_b)
            cmap.drop(n_a, n_b, ca, cb)
            return True
        tail = cmap.tokens[n_b:]
        cut = llama_cpp.llama_memory_seq_rm(self.mem, 0, n_a, -1)
        cmap.drop(n_a, n_b, ca, cb)
        del cmap.tokens[n_a:]
        if not cut:
            # A recurrent state cannot be cut back: what stays is read again from the
            # start (its marks stay valid: the same tokens go back in the same places).
            tail = [*cmap.tokens, *tail]
            llama_cpp.llama_memory_clear(self.mem, True)
            del cmap.tokens[:]
        if not self.refill(tail):
            return False
        self.reread_tokens += len(tail)
        return True

    def _head_len(self) -> int:
        """How many of the cache's first tokens are ``head`` (0 if it does not start so)."""
        n = len(self.head)
        return n if n and self.cmap.tokens[:n] == list(self.head) else 0

    def note(self) -> str:
        """What the user should know about this request's drops ("" when none)."""
        if not self.dropped_count:
            return ""
        n = self.dropped_count
        what = f"{n} older message{'s' if n != 1 else ''} ({self.dropped_tokens} tokens)"
        how = ""
        if not self.can_shift:
            how = "; this model's cache cannot shift, so the kept text was read again"
        elif self.reread_tokens:
            how = "; the kept text was read again"
        return (
            f"the context was full: {what} left the model's memory{how}. "
            "They stay in the transcript"
        )
