"""The one place that reaches into llama-cpp-python's private handles.

``llama_cpp.Llama`` keeps its native context and model behind private attributes
(``_ctx.ctx``, ``_model.model``, ``_model.vocab``). Every other module asks a
``Native`` for them, or for one of its named operations, so a change in the binding
is fixed here once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# How a model remembers the conversation (``Native.memory_kind``).
RECURRENT, HYBRID, SLIDING_WINDOW, ATTENTION = "recurrent", "hybrid", "sliding-window", "attention"


@dataclass(frozen=True)
class Perf:
    """llama.cpp's own counters since the last ``perf_reset``: tokens and milliseconds."""

    n_prompt: int
    prompt_ms: float
    n_decode: int
    decode_ms: float


class Native:
    """One loaded ``llama_cpp.Llama``'s native handles, and named operations on them.

    Call it from the thread that owns the model. ``ctx``, ``model`` and ``vocab``
    stay valid until the ``Llama`` is closed.
    """

    def __init__(self, llm: Any) -> None:
        import llama_cpp

        self.llm = llm
        self.ctx: Any = llm._ctx.ctx
        self.model: Any = llm._model.model
        self.vocab: Any = llm._model.vocab
        self.memory: Any = llama_cpp.llama_get_memory(self.ctx)
        self._one = (llama_cpp.llama_token * 1)()
        # Bound once: decode_one runs once per generated token.
        self._llama_decode: Any = llama_cpp.llama_decode
        self._batch_one: Any = llama_cpp.llama_batch_get_one(self._one, 1)
        # Told of every batch of tokens the context read (the next-token drafter, which
        # reads each with its hidden row); None when nothing listens.
        self.after_decode: Callable[[Sequence[int]], None] | None = None

    # -- sizes --------------------------------------------------------------------------

    def n_ctx(self) -> int:
        return int(self.llm.n_ctx())

    @property
    def n_batch(self) -> int:
        return int(self.llm.n_batch)

    def n_vocab(self) -> int:
        return int(self.llm.n_vocab())

    def n_ctx_train(self) -> int:
        return int(self.llm._model.n_ctx_train())

    def n_swa(self) -> int:
        """The sliding-window size of the model's SWA layers (0: none)."""
        import llama_cpp

        return int(llama_cpp.llama_model_n_swa(self.model))

    def memory_kind(self) -> str:
        """How the model remembers the conversation: "recurrent" (a state per sequence,
        Mamba), "hybrid" (recurrent layers with attention layers: Qwen3.5, LFM2,
        Granite-4-H), "sliding-window" (attention layers that see a window) or
        "attention" (a plain KV cache)."""
        import llama_cpp

        if llama_cpp.llama_model_is_recurrent(self.model):
            return RECURRENT
        if llama_cpp.llama_model_is_hybrid(self.model):
            return HYBRID
        return SLIDING_WINDOW if self.n_swa() > 0 else ATTENTION

    def can_shift(self) -> bool:
        """Whether cached positions can be shifted (``llama_memory_can_shift``)."""
        import llama_cpp

        return bool(llama_cpp.llama_memory_can_shift(self.memory))

    # -- tokens -------------------------------------------------------------------------

    def tokenize(self, text: str, bos: bool) -> list[int]:
        """Token ids for ``text``, special tokens parsed; BOS first if asked and wanted."""
        data = text.encode("utf-8", "replace")
        return list(self.llm.tokenize(data, add_bos=bos, special=True))

    # -- the KV cache (sequence 0) -----------------------------------------------------------

    def clear(self) -> None:
        """Empty the KV cache."""
        import llama_cpp

        llama_cpp.llama_memory_clear(self.memory, True)

    def seq_rm(self, start: int, end: int = -1) -> bool:
        """Remove positions ``[start, end)`` (to the end for -1); False when refused."""
        import llama_cpp

        return bool(llama_cpp.llama_memory_seq_rm(self.memory, 0, start, end))

    def partial_state(self) -> bytes:
        """A copy of sequence 0's recurrent part (``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY``):
        what a checkpoint of a recurrent or hybrid model keeps."""
        import ctypes

        import llama_cpp

        flags = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        size = int(llama_cpp.llama_state_seq_get_size_ext(self.ctx, 0, flags))
        buf = (ctypes.c_uint8 * size)()
        got = int(llama_cpp.llama_state_seq_get_data_ext(self.ctx, buf, size, 0, flags))
        return ctypes.string_at(buf, got)

    def set_partial_state(self, data: bytes) -> bool:
        """Put back a ``partial_state``; False when llama.cpp refused it."""
        import ctypes

        import llama_cpp

        flags = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        return int(llama_cpp.llama_state_seq_set_data_ext(self.ctx, buf, len(data), 0, flags)) > 0

    def seq_pos_min(self) -> int:
        """The smallest position the cache still holds (-1 when empty)."""
        import llama_cpp

        return int(llama_cpp.llama_memory_seq_pos_min(self.memory, 0))

    def seq_pos_max(self) -> int:
        """The largest position the cache holds (-1 when empty)."""
        import llama_cpp

        return int(llama_cpp.llama_memory_seq_pos_max(self.memory, 0))

    def state_size(self) -> int:
        """Bytes llama.cpp needs to serialize sequence 0."""
        import llama_cpp

        return int(llama_cpp.llama_state_seq_get_size(self.ctx, 0))

    # -- evaluation ---------------------------------------------------------------------

    def decode(self, tokens: Sequence[int]) -> int:
        """Evaluate ``tokens`` after the cache (one batch); llama.cpp's return code."""
        import llama_cpp

        arr = (llama_cpp.llama_token * len(tokens))(*tokens)
        batch = llama_cpp.llama_batch_get_one(arr, len(tokens))
        rc = int(llama_cpp.llama_decode(self.ctx, batch))
        if rc == 0 and self.after_decode is not None:
            self.after_decode(tokens)
        return rc

    def decode_one(self, token: int) -> int:
        """Evaluate one token (a reused buffer and batch: the per-token path); the
        return code."""
        self._one[0] = token
        rc = int(self._llama_decode(self.ctx, self._batch_one))
        if rc == 0 and self.after_decode is not None:
            self.after_decode((token,))
        return rc

    def logits(self, i: int = -1) -> Any:
        """The native pointer to the logits row of batch position ``i`` (NULL if none)."""
        import llama_cpp

        return llama_cpp.llama_get_logits_ith(self.ctx, i)

    def arm_abort(self, callback: Any) -> None:
        """Have llama.cpp ask ``callback`` (a ``ggml_abort_callback``) during evaluation."""
        import llama_cpp

        llama_cpp.llama_set_abort_callback(self.ctx, callback, None)

    def disarm_abort(self) -> None:
        """No abort callback: llama.cpp would call it for every graph node."""
        import llama_cpp

        llama_cpp.llama_set_abort_callback(self.ctx, llama_cpp.ggml_abort_callback(), None)

    # -- counters -----------------------------------------------------------------------

    def perf_reset(self) -> None:
        import llama_cpp

        # A decode whose result was never read (the reply ended at its last token) is
        # still queued: unsynchronized, llama.cpp books it, with the idle time since,
        # as the next reply's prompt (seen on a GPU; docs/notes/gpu.md).
        llama_cpp.llama_synchronize(self.ctx)
        llama_cpp.llama_perf_context_reset(self.ctx)

    def perf(self) -> Perf:
        import llama_cpp

        llama_cpp.llama_synchronize(self.ctx)  # count the work still queued, as above
        p = llama_cpp.llama_perf_context(self.ctx)
        return Perf(int(p.n_p_eval), float(p.t_p_eval_ms), int(p.n_eval), float(p.t_eval_ms))
