"""KV sequence 0 serialized by llama.cpp, and loaded back."""

from __future__ import annotations

import ctypes
from typing import Any

from app.util.errors import LamplightError


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


def write_sequence(ctx: Any, state: bytes | bytearray | memoryview, n_tokens: int) -> None:
    """Load ``state`` into KV sequence 0 of ``ctx``, which must be empty.

    On failure the cache is left empty.

    Raises:
        LamplightError: llama.cpp rejected the state, or it does not cover ``n_tokens``.
    """
    import llama_cpp

    mem = llama_cpp.llama_get_memory(ctx)
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
