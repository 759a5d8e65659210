"""KV sequence 0 serialized by llama.cpp, and loaded back, checked as far as it can be.

A serialized sequence is llama.cpp's ``io_magic`` and the sequence id, then one
section per KV cache (two for a model with sliding-window layers: the full-attention
cache, then the window's), each::

    u32 n_stream (1) | u32 cell_count | cell_count x (i32 pos, u32 n_seq_id, i32 seq_id)
    | u32 v_trans | u32 n_layer | per layer: i32 type, u64 row size, rows (K)
    | per layer: the same for V (transposed: i32 type, u32 element size, u32 width)

``write_sequence`` reads the cells' positions from this layout before llama.cpp sees
the state: for the ``n`` saved tokens each cache must hold positions ``n - k`` to
``n - 1``, once each (in any order: a context shift reorders cells), where ``k`` is
``n`` (the first cache, the full-attention one, when there are several), or for a
sliding-window cache at least the window (llama.cpp saves only the last ``n_swa``
cells of one). llama.cpp itself accepts any positions, so a state
whose cells were lost, doubled or moved would restore and the next reply would
silently differ. Where this llama.cpp serializes another layout (a recurrent
model's state; a new version), as its own empty cache shows, only the highest
position is checked after the load.
"""

from __future__ import annotations

import ctypes
import struct
from typing import Any

from app.util.errors import LamplightError

IO_MAGIC = 0xAF143CD8  # llama.cpp's llama_io magic before every serialized sequence
MAX_LAYERS = 4096
_U32_PAIR = struct.Struct("<II")
_ROWS = struct.Struct("<iQ")  # type, row size
_TRANSPOSED = struct.Struct("<iII")  # type, element size, row width


def read_sequence(ctx: Any) -> bytes:
    """Copy KV sequence 0 of ``ctx`` out of llama.cpp (no logits: it scales with the cache).

    Raises:
        LamplightError: llama.cpp wrote less than it said it needs.
    """
    import llama_cpp

    size = llama_cpp.llama_state_seq_get_size(ctx, 0)
    buf = (ctypes.c_uint8 * size)()
    written = llama_cpp.llama_state_seq_get_data(ctx, buf, size, 0)
    if written != size:
        raise LamplightError(f"llama.cpp wrote {written} of {size} bytes of state.")
    return bytes(buf)


def write_sequence(
    ctx: Any, state: bytes | bytearray | memoryview, n_tokens: int, window: int = 0
) -> None:
    """Load ``state`` into KV sequence 0 of ``ctx``, which must be empty.

    The state's cells are checked against ``n_tokens`` first (see the module's
    docstring; ``window`` is the model's sliding window, 0 for none). On failure the
    cache is left empty.

    Raises:
        LamplightError: the cells do not hold ``n_tokens`` tokens, llama.cpp rejected
            the state, or it does not cover them.
    """
    import llama_cpp

    mem = llama_cpp.llama_get_memory(ctx)
    layout = cell_positions(read_sequence(ctx))  # the empty cache: a few bytes
    if layout is not None:
        problem = cells_problem(cell_positions(state), len(layout), n_tokens, window)
        if problem:
            raise LamplightError(f"the saved cache is damaged: {problem}")
    if isinstance(state, bytes):
        buf: Any = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
    else:  # a writable buffer: llama.cpp reads it in place, no copy
        buf = (ctypes.c_uint8 * len(state)).from_buffer(state)
    read = llama_cpp.llama_state_seq_set_data(ctx, buf, len(state), 0)
    del buf
    pos_max = llama_cpp.llama_memory_seq_pos_max(mem, 0)
    if read == 0 or pos_max != n_tokens - 1:
        llama_cpp.llama_memory_clear(mem, True)
        raise LamplightError(
            "llama.cpp did not accept the saved state"
            if read == 0
            else f"the saved state covers {pos_max + 1} tokens, not {n_tokens}"
        )


def cells_problem(sections: list[Any] | None, n_caches: int, n_tokens: int, window: int = 0) -> str:
    """Why cell positions ``sections`` (from ``cell_positions``) cannot be ``n_tokens``
    tokens in ``n_caches`` caches with a sliding window of ``window`` ("" if they can)."""
    import numpy as np

    if sections is None:
        return "its layout is not llama.cpp's"
    if len(sections) != n_caches:
        return f"it holds {len(sections)} caches, not {n_caches}"
    for i, positions in enumerate(sections):
        # The first of several is the full-attention cache; the others may keep a window.
        least = min(n_tokens, window) if window > 0 and (i or n_caches == 1) else n_tokens
        k = len(positions)
        if not least <= k <= n_tokens:
            return f"a cache holds {k} cells for {n_tokens} tokens"
        if k and not np.array_equal(np.sort(positions), np.arange(n_tokens - k, n_tokens)):
            return f"its cells are not at positions {n_tokens - k} to {n_tokens - 1}, once each"
    return ""


def cell_positions(state: bytes | bytearray | memoryview) -> list[Any] | None:
    """The positions of the cells of each KV cache in a serialized sequence 0 (numpy
    arrays, in the order the cells are stored), or None when ``state`` is not laid out
    as the module's docstring says (another kind of memory, or damaged)."""
    import numpy as np

    buf = memoryview(state).cast("B")
    end = len(buf)
    if end < 8 or _U32_PAIR.unpack_from(buf, 0) != (IO_MAGIC, 0):
        return None
    off = 8
    out = []
    while off < end:
        if off + 8 > end:
            return None
        n_stream, count = _U32_PAIR.unpack_from(buf, off)
        off += 8
        if n_stream != 1 or count > (end - off) // 12:
            return None
        cells = np.frombuffer(buf, dtype="<i4", count=3 * count, offset=off).reshape(count, 3)
        off += 12 * count
        if count and (np.any(cells[:, 1] != 1) or np.any(cells[:, 2] != 0)):
            return None  # a cell in another sequence, or in several
        out.append(cells[:, 0].copy())
        if count:
            off = _after_rows(buf, off, count)
            if off < 0:
                return None
    return out


def _after_rows(buf: memoryview, off: int, count: int) -> int:
    """Where a cache's K and V rows for ``count`` cells end (-1: past the end, or not rows)."""
    end = len(buf)
    if off + 8 > end:
        return -1
    v_trans, n_layer = _U32_PAIR.unpack_from(buf, off)
    off += 8
    if v_trans > 1 or n_layer > MAX_LAYERS:
        return -1
    for transposed in (False, bool(v_trans)):  # K, then V
        for _ in range(n_layer):
            if off + 12 > end:
                return -1
            if transposed:
                _type, size, width = _TRANSPOSED.unpack_from(buf, off)
                off += 12 + size * width * count
            else:
                _type, row = _ROWS.unpack_from(buf, off)
                off += 12 + row * count
            if off > end:
                return -1
    return off
