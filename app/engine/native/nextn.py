"""A model's own next-token layers (MTP, "NextN") in a context of their own.

Models such as Qwen3.5 ship one extra block trained to predict the token after next
from the trunk's last hidden state. llama.cpp runs it as a second context on the same
model (``ctx_type`` MTP, a KV cache of that block only), fed token by token with the
target's hidden row of the position before (``llama_batch_ext`` entries that carry a
token and a row), as ``common/speculative.cpp`` (``draft-mtp``) does.

The hidden rows come from llama.cpp's staging API (``src/llama-ext.h``:
``llama_set_embeddings_nextn``, ``llama_get_embeddings_nextn[_ith]``), which libllama
exports with C++ names only, so they are bound here by their mangled names; a build
without them has no MTP drafting (``staging`` is None, ``why_not`` says so).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from typing import Any

from app.engine.native.handles import Native

_ROW_P = ctypes.POINTER(ctypes.c_float)
# Itanium-mangled names (the only ones libllama exports for the staging API), and the
# C signature each stands for.
_STAGING = {
    # void llama_set_embeddings_nextn(llama_context *, bool value, bool masked)
    "set_rows": (
        "_Z26llama_set_embeddings_nextnP13llama_contextbb",
        [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool],
        None,
    ),
    # float * llama_get_embeddings_nextn(llama_context *)
    "rows": ("_Z26llama_get_embeddings_nextnP13llama_context", [ctypes.c_void_p], _ROW_P),
    # float * llama_get_embeddings_nextn_ith(llama_context *, int32_t)
    "row": (
        "_Z30llama_get_embeddings_nextn_ithP13llama_contexti",
        [ctypes.c_void_p, ctypes.c_int32],
        _ROW_P,
    ),
}
MTP_CONTEXT = 1  # LLAMA_CONTEXT_TYPE_MTP


@functools.cache
def staging() -> dict[str, Any] | None:
    """The staging functions, bound; None when this libllama lacks one of them."""
    import llama_cpp

    lib = llama_cpp.llama_cpp._lib
    bound = {}
    for key, (name, argtypes, restype) in _STAGING.items():
        fn = getattr(lib, name, None)
        if fn is None:
            return None
        fn.argtypes, fn.restype = argtypes, restype
        bound[key] = fn
    return bound


def why_not(native: Native, mtp_layers: int) -> str:
    """Why the loaded model cannot draft with its next-token layers ("" when it can);
    ``mtp_layers``: the blocks its file carries (``GgufInfo.mtp_layers``)."""
    import llama_cpp

    if mtp_layers <= 0:
        return "the model has no next-token (MTP) layers"
    n = int(llama_cpp.llama_model_n_layer_nextn(native.model))
    if n != 1:
        return (
            f"the model chains {n} next-token layers, which Lamplight does not drive yet "
            "(one is the common case: Qwen3.5, GLM, DeepSeek)"
        )
    if staging() is None:
        return "this llama.cpp build does not give out the hidden rows next-token layers read"
    return ""


class NextnContext:
    """The MTP context beside ``target``: it reads the target's tokens with their
    hidden rows, and guesses one token at a time.

    Creating it turns on the target's hidden rows (one per token of every batch);
    ``close`` turns them off. Raises ``RuntimeError`` when llama.cpp refuses the
    context (the model has no usable next-token block).
    """

    def __init__(self, target: Native, n_threads: int) -> None:
        import llama_cpp

        fns = staging()
        if fns is None:
            raise RuntimeError("no staging API")
        self._fns = fns
        self._target = target
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = target.n_ctx()
        params.n_batch = params.n_ubatch = target.n_batch
        params.n_seq_max = 1
        params.n_threads = params.n_threads_batch = n_threads
        params.ctx_type = MTP_CONTEXT
        params.ctx_other = target.ctx  # read by models whose next-token block shares the KV
        self.ctx = llama_cpp.llama_init_from_model(target.model, params)
        if not self.ctx:
            raise RuntimeError("llama.cpp refused the next-token context")
        self._mem = llama_cpp.llama_get_memory(self.ctx)
        self._batch = llama_cpp.llama_batch_ext_init(self.ctx)
        self._pos = llama_cpp.llama_pos(0)
        self.n_embd = int(llama_cpp.llama_model_n_embd_out(target.model))
        self.n_vocab = target.n_vocab()
        fns["set_rows"](target.ctx, True, False)  # a row for every token the target reads
        fns["set_rows"](self.ctx, True, True)  # here, rows for the outputs only

    def close(self) -> None:
        import llama_cpp

        if self.ctx:
            self._fns["set_rows"](self._target.ctx, False, False)
            llama_cpp.llama_batch_ext_free(self._batch)
            llama_cpp.llama_free(self.ctx)
            self.ctx = None

    def target_rows(self, n: int) -> Any:
        """A copy of the target's hidden rows for the ``n`` tokens of its last batch
        (None when it has none: llama.cpp returned no rows)."""
        import numpy as np

        ptr = self._fns["rows"](self._target.ctx)
        if not ptr:
            return None
        return np.ctypeslib.as_array(ptr, shape=(n, self.n_embd)).copy()

    def seq_rm(self, pos: int) -> None:
        """Forget positions ``pos`` on (an attention cache: never refused)."""
        import llama_cpp

        llama_cpp.llama_memory_seq_rm(self._mem, 0, pos, -1)

    def read(self, tokens: Sequence[int], pos0: int, rows: Sequence[Any]) -> int:
        """Read ``tokens`` at ``pos0`` on, each with ``rows[i]`` (the target's hidden
        row of the position before it); llama.cpp's return code."""
        self._fill(tokens, pos0, rows, output=False)
        return self._process()

    def guess(self, token: int, pos: int, row: Any) -> tuple[int, float, Any] | None:
        """Read ``token`` at ``pos`` with ``row``: the likeliest next token, its
        probability, and the hidden row that goes with it (None when llama.cpp failed)."""
        import llama_cpp
        import numpy as np

        self._fill((token,), pos, (row,), output=True)
        if self._process() != 0:
            return None
        logits = np.ctypeslib.as_array(
            llama_cpp.llama_get_logits_ith(self.ctx, 0), shape=(self.n_vocab,)
        )
        best = int(logits.argmax())
        p = 1.0 / float(np.exp(logits - logits[best]).sum())
        out = self._fns["row"](self.ctx, 0)
        nxt = np.ctypeslib.as_array(out, shape=(self.n_embd,)).copy() if out else None
        return best, p, nxt

    def _fill(self, tokens: Sequence[int], pos0: int, rows: Sequence[Any], output: bool) -> None:
        import llama_cpp

        batch = self._batch
        llama_cpp.llama_batch_ext_clear(batch)
        for i, (tok, row) in enumerate(zip(tokens, rows, strict=True)):
            idx = llama_cpp.llama_batch_ext_add_token(batch, 0, int(tok))
            self._pos.value = pos0 + i
            llama_cpp.llama_batch_ext_set_pos(batch, idx, ctypes.byref(self._pos))
            embd = llama_cpp.llama_embd(row.ctypes.data_as(_ROW_P), 1, self.n_embd)
            llama_cpp.llama_batch_ext_set_embd_token(batch, idx, embd)  # copied here
            llama_cpp.llama_batch_ext_set_output_logits(batch, idx, output)

    def _process(self) -> int:
        import llama_cpp

        return int(
            llama_cpp.llama_process(self.ctx, llama_cpp.LLAMA_PROCESS_TYPE_DECODE, self._batch)
        )
