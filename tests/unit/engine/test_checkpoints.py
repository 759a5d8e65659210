"""Checkpoints of a recurrent state: bounded, the nearest one at or before a rewind's
token put back, later ones forgotten (``app/engine/local/checkpoints.py``)."""

from __future__ import annotations

from typing import Any, cast

from hypothesis import given
from hypothesis import strategies as st

from app.engine.local import checkpoints
from app.engine.local.checkpoints import Checkpoints


class FakeNative:
    """A state that is the number of tokens read; copied out as that many bytes."""

    def __init__(self) -> None:
        self.n = 0
        self.refuse = False

    def partial_state(self) -> bytes:
        return b"x" * self.n

    def set_partial_state(self, data: bytes) -> bool:
        if self.refuse:
            return False
        self.n = len(data)
        return True


def made(native: FakeNative) -> Checkpoints:
    return Checkpoints(cast(Any, native))


def test_a_rewind_goes_back_to_the_nearest_checkpoint_at_or_before_it() -> None:
    native = FakeNative()
    cps = made(native)
    for n in (10, 20, 30):
        native.n = n
        cps.take(n)
    native.n = 35
    assert cps.restore(25) == 20 and native.n == 20
    assert cps.positions == [10, 20]  # the later one described a state that is gone
    assert cps.restore(5) == 0 and native.n == 20  # none early enough: nothing changed
    native.refuse = True
    assert cps.restore(15) == 0  # llama.cpp refused it: the caller reads from scratch


def test_a_long_read_takes_one_every_so_many_tokens() -> None:
    cps = made(FakeNative())
    assert not cps.due(checkpoints.EVERY - 1) and cps.due(checkpoints.EVERY)


@given(st.lists(st.integers(1, 100_000), max_size=40))
def test_checkpoints_stay_within_their_bounds(positions: list[int]) -> None:
    native = FakeNative()
    cps = made(native)
    for n in positions:
        native.n = n
        cps.take(n)
        kept = cps.positions
        assert len(kept) <= checkpoints.MAX_KEPT
        assert sum(kept) <= checkpoints.MAX_BYTES  # the fake's state is n bytes
        gone = set(positions[: positions.index(n) + 1]) - set(kept)
        assert not gone or max(gone) <= min(kept)  # the earliest go first
