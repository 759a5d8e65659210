"""A context overflow drops a tool call together with its result (issue 29)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.engine.prompt.overflow import plan_drop, protected_head

# A turn: the user's message, then rounds of (call, results...), then the answer.
TURN = st.tuples(st.integers(0, 3), st.integers(1, 3))


@given(
    st.lists(TURN, min_size=1, max_size=8),
    st.booleans(),
    st.sampled_from(["truncate_middle", "rolling"]),
    st.integers(1, 400),
)
def test_a_drop_never_separates_a_call_from_its_result(
    turns: list[tuple[int, int]], system: bool, policy: str, need: int
) -> None:
    roles = ["system"] if system else []
    for rounds, results in turns:
        roles.append("user")
        for _ in range(rounds):
            roles += ["assistant", *["tool"] * results]
        roles.append("assistant")
    sizes = [7] * len(roles)
    plan = plan_drop(sizes, roles, policy, need, keep_last=1)
    head = protected_head(roles, policy)
    assert head == len(roles) or roles[head] != "tool"  # the head keeps whole rounds
    if plan is None:
        return
    a, b = plan
    assert roles[b] == "user"
    # Everything between a and b is whole turns: no result is left without its call.
    kept = roles[:a] + roles[b:]
    for i, role in enumerate(kept):
        if role == "tool":
            assert kept[i - 1] in ("assistant", "tool")
