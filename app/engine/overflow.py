"""Which whole messages leave the model's memory when a conversation outgrows the context.

Pure bookkeeping: the engine measures the messages in tokens and applies the
plan to its KV cache (a shift) or re-reads what stays.
"""

from __future__ import annotations

from collections.abc import Sequence

POLICIES = ("stop", "truncate_middle", "rolling")
POLICY_LABELS = {
    "stop": "Stop at the limit",
    "truncate_middle": "Drop the middle (keep the start)",
    "rolling": "Rolling window",
}


def protected_head(roles: Sequence[str], policy: str) -> int:
    """How many leading messages a policy never drops.

    Both keep the system prompt; ``truncate_middle`` also keeps the first
    exchange (the first user message and the replies to it), where the task
    is usually set.
    """
    head = 0
    while head < len(roles) and roles[head] == "system":
        head += 1
    if policy == "truncate_middle":
        if head < len(roles) and roles[head] == "user":
            head += 1
        while head < len(roles) and roles[head] == "assistant":
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
