"""A snapshot whose KV cells were altered, with its checksum made to match, is refused.

The checksum only says the file is as it was written; a file rewritten with a matching
checksum (by hand, by a tool, by a bug) can hold a llama.cpp state that llama.cpp
accepts although its cells no longer fit the saved tokens: a cell lost, doubled, or
moved to another position. The next reply would silently differ. Restoring checks the
cells' positions against the tokens, and refuses with a note: the transcript is read
again. A state whose cells are merely stored in another order (as after a context
shift) is the same cache, and is restored.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest

from app.chat.session_cache import SessionCache
from app.chat.snapshot import write_snapshot
from app.chat.store import ConversationStore
from app.config.setting_records import LoadConfig, SamplingParams
from app.engine.backend import Finished, KvState
from app.engine.chat_message import ChatMessage
from app.engine.local.engine import Engine
from app.engine.local.kv_state import cells_problem
from app.util.hashing import FingerprintCache
from tests.near_tie import same_up_to_near_tie

GREEDY = SamplingParams.greedy(8)
IO_MAGIC = 0xAF143CD8  # llama.cpp writes it before a serialized sequence
CHAT = [ChatMessage("user", "Tell me about the sea, the tides and the moon.")]


@dataclass
class Cache:
    """One KV cache's part of a serialized sequence: cells, and per layer K and V."""

    cells: list[tuple[int, int, int]]  # pos, n_seq_id, seq_id
    v_trans: int
    k: list[tuple[bytes, list[bytes]]]  # per layer: header, one row per cell
    v: list[tuple[bytes, list[bytes]]]  # transposed: per layer, per column, one per cell


def split(state: bytes) -> list[Cache]:
    """The caches of a serialized sequence (the layout ``app.engine.local.kv_state`` reads)."""
    assert struct.unpack_from("<II", state) == (IO_MAGIC, 0)
    off, out = 8, []
    while off < len(state):
        n_stream, count = struct.unpack_from("<II", state, off)
        off += 8
        assert n_stream == 1 and count > 0
        cells = [struct.unpack_from("<iIi", state, off + 12 * i) for i in range(count)]
        off += 12 * count
        v_trans, n_layer = struct.unpack_from("<II", state, off)
        off += 8
        parts: list[list[tuple[bytes, list[bytes]]]] = []
        for transposed in (False, bool(v_trans)):
            layers = []
            for _ in range(n_layer):
                head = state[off : off + 12]
                if transposed:
                    _t, size, width = struct.unpack("<iII", head)
                    pieces, piece = width * count, size
                else:
                    _t, row = struct.unpack("<iQ", head)
                    pieces, piece = count, row
                off += 12
                layers.append(
                    (head, [state[off + i * piece : off + (i + 1) * piece] for i in range(pieces)])
                )
                off += pieces * piece
            parts.append(layers)
        out.append(Cache(cells, v_trans, parts[0], parts[1]))
    assert off == len(state)
    return out


def join(caches: list[Cache]) -> bytes:
    out = [struct.pack("<II", IO_MAGIC, 0)]
    for c in caches:
        count = len(c.cells)
        out.append(struct.pack("<II", 1, count))
        out += [struct.pack("<iIi", *cell) for cell in c.cells]
        out.append(struct.pack("<II", c.v_trans, len(c.k)))
        for head, rows in (*c.k, *c.v):
            out.append(head)
            out += rows
    return b"".join(out)


def keep_cells(c: Cache, order: list[int]) -> Cache:
    """``c`` with only the cells ``order`` (in that order), their K and V with them."""
    count = len(c.cells)

    def pick(rows: list[bytes]) -> list[bytes]:
        # Transposed V holds one run of ``count`` elements per column.
        return [
            run[i]
            for start in range(0, len(rows), count)
            for run in [rows[start : start + count]]
            for i in order
        ]

    return replace(
        c,
        cells=[c.cells[i] for i in order],
        k=[(head, pick(rows)) for head, rows in c.k],
        v=[(head, pick(rows)) for head, rows in c.v],
    )


def doubled(caches: list[Cache]) -> list[Cache]:
    """The full cache's cell 3 moved onto position 2 (the highest position stays)."""
    c = caches[0]
    cells = list(c.cells)
    cells[3] = (cells[2][0], *cells[3][1:])
    return [replace(c, cells=cells), *caches[1:]]


def lost(caches: list[Cache]) -> list[Cache]:
    """One cell taken out of the last cache, with its keys and values."""
    c = caches[-1]
    return [*caches[:-1], keep_cells(c, [i for i in range(len(c.cells)) if i != 3])]


def past_the_end(caches: list[Cache]) -> list[Cache]:
    """A cell of the last cache moved past the saved tokens."""
    c = caches[-1]
    cells = list(c.cells)
    cells[3] = (len(cells) + 5, *cells[3][1:])
    return [*caches[:-1], replace(c, cells=cells)]


def reordered(caches: list[Cache]) -> list[Cache]:
    """Every cache's cells stored in reverse order: the same cache (a shift does this)."""
    return [keep_cells(c, list(range(len(c.cells)))[::-1]) for c in caches]


@pytest.fixture(scope="module")
def small(model_path: Path) -> Iterator[Engine]:
    engine = Engine()
    engine.load(model_path, LoadConfig(n_ctx=256, n_threads=1))
    yield engine
    engine.unload()


def reply(engine: Engine, messages: list[ChatMessage]) -> Finished:
    *_, end = engine.generate(messages, GREEDY)
    assert isinstance(end, Finished)
    return end


@pytest.mark.parametrize(
    ("mutate", "accepted"),
    [(doubled, False), (lost, False), (past_the_end, False), (reordered, True)],
    ids=lambda v: getattr(v, "__name__", str(v)),
)
def test_altered_cells_with_a_matching_checksum_are_refused(
    small: Engine, tmp_path: Path, mutate: Callable[[list[Cache]], list[Cache]], accepted: bool
) -> None:
    small.reset()
    first = reply(small, CHAT)
    history = [*CHAT, ChatMessage("assistant", first.text), ChatMessage("user", "And the sky?")]
    cache = SessionCache(small, ConversationStore(tmp_path), FingerprintCache(tmp_path / "f.json"))
    cache.save("c1")
    kv = small.export_state()
    caches = split(bytes(kv.state))
    assert join(caches) == bytes(kv.state)  # the test's reading of the layout is exact
    assert len(caches) == 2  # gemma 3: full-attention and sliding-window layers
    altered = KvState(join(mutate(caches)), kv.tokens, kv.text, kv.marks)
    write_snapshot(cache.store.snapshot_path("c1"), cache.header(), altered)  # checksum made

    result = cache.restore("c1")
    then = reply(small, history)
    if accepted:
        assert result.restored, result.note
        assert then.metrics.cached_tokens >= len(kv.tokens) - 1
        # The same cells in another order: the unaltered snapshot's reply, but for the
        # order of the sums over the cells (a near-tie may flip).
        got = small.cached_tokens
        small.import_state(kv)
        unaltered = reply(small, history)
        assert unaltered.metrics.prompt_tokens == then.metrics.prompt_tokens
        same_up_to_near_tie(small, got, small.cached_tokens, then.metrics.prompt_tokens, GREEDY)
        return
    assert not result.restored and result.note.startswith("the saved cache is damaged"), result
    assert "\n" not in result.note
    # The transcript is read again from an empty cache: exactly a fresh read's reply.
    assert then.metrics.cached_tokens == 0
    small.reset()
    assert reply(small, history).text == then.text


def test_cell_positions_may_keep_a_window_in_any_order() -> None:
    """The rule on its own: a sliding-window cache keeps at least the last window."""
    full, window = np.arange(1000)[::-1], np.arange(488, 1000)
    assert cells_problem([full, window], 2, 1000, 512) == ""
    assert cells_problem([full, np.arange(400, 1000)], 2, 1000, 512) == ""
    assert cells_problem([full, window[1:]], 2, 1000, 512)  # a cell short of the window
    assert cells_problem([full[:-1], window], 2, 1000, 512)  # the full cache lost one
    assert cells_problem([np.arange(100, 1000), window], 2, 1000, 512)  # lost its start
    assert cells_problem([full, window], 2, 1000, 0)  # no window: every cache is full
    assert cells_problem([full], 2, 1000, 512)  # a cache missing
    assert cells_problem(None, 2, 1000, 512)
    assert cells_problem([np.arange(5), np.arange(5)], 2, 5, 512) == ""
