"""An embedding model in llama.cpp: texts in, L2-normalised vectors out.

Not the chat engine's load path (``docs/notes/documents_plan.md`` §2.2): no templates,
no KV snapshots, no offload planning; a small non-causal model on the CPU. Batching
follows ``Llama.embed`` (several texts per ``llama_decode``, one sequence id each, never
more tokens than ``n_ubatch``: a non-causal decode past it aborts the process), but
reads the pooled vectors with numpy instead of Python loops, truncates each text
itself keeping the closing [SEP], and checks ``stop`` between decodes.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from app.gguf.embedder import read_embedder_info
from app.util.errors import DocumentCancelled, EmbedderError

N_CTX = 512  # BERT's learned positions; sequences in one decode share it
MAX_TOKENS = 256  # per text, as sentence-transformers (max_seq_length) truncates
MAX_TEXT_CHARS = 200_000  # tokenized at most; far past MAX_TOKENS tokens of real text


def stored_extra_bufts() -> bool:
    """Whether llama.cpp's extra buffer types (AMX, repacked weights) are on here, by the
    native guard's stored verdict for this machine (no probe is run: the chat model's
    first load does that); True when no verdict is stored."""
    from app.engine.native.guard import default_guard
    from app.engine.native.paths import RiskyPath

    guard = default_guard()
    if guard is None:
        return True
    try:
        return RiskyPath.EXTRA_BUFTS not in guard.off()
    except (OSError, ValueError):
        return True


class Embedder:
    """One embedding model, owned by ONE thread (llama.cpp contexts are not shared)."""

    def __init__(self, llm: Any, path: Path, name: str, dim: int, max_tokens: int) -> None:
        self._llm = llm
        self.path = path
        self.name = name
        self.dim = dim
        self.max_tokens = max_tokens
        self._n_batch = int(llm.n_batch)
        self._n_seq = max(1, int(llm.context_params.n_seq_max))

    @classmethod
    def load(cls, path: Path, n_threads: int = 1, *, extra_bufts: bool | None = None) -> Embedder:
        """Check ``path`` as an embedding model, then open it.

        ``extra_bufts`` None follows the native guard's stored verdict (see
        :func:`stored_extra_bufts`); the guard of the app's data folder can pass its own.

        Raises:
            EmbedderError: not an embedding model, or llama.cpp could not load it.
            ModelFileError: missing, unreadable or damaged.
        """
        info = read_embedder_info(path)
        from app.engine.local.loader import load_progress
        from app.engine.native.libs import load_backends

        load_backends()
        import llama_cpp

        n_ctx = min(N_CTX, info.context_length)
        threads = max(1, int(n_threads))
        bufts = stored_extra_bufts() if extra_bufts is None else extra_bufts
        try:
            with load_progress(None, bufts):
                llm = llama_cpp.Llama(
                    model_path=str(path),
                    embedding=True,
                    n_ctx=n_ctx,
                    n_batch=n_ctx,
                    n_ubatch=n_ctx,
                    n_threads=threads,
                    n_threads_batch=threads,
                    n_gpu_layers=0,
                    verbose=False,
                )
        except MemoryError as exc:
            raise EmbedderError(f"There is not enough memory to load {path.name}.") from exc
        except Exception as exc:  # whatever llama-cpp-python raises on a file it refuses
            raise EmbedderError(
                f"llama.cpp could not load the embedding model {path.name}: {exc}. The file "
                "may be damaged; choose another embedding model."
            ) from exc
        name = info.name or path.stem
        return cls(llm, path, name, int(llm.n_embd()), min(MAX_TOKENS, n_ctx))

    def _tokens(self, text: str) -> list[int]:
        raw = text[:MAX_TEXT_CHARS].encode("utf-8", errors="replace")
        tokens: list[int] = self._llm.tokenize(raw, add_bos=True, special=False)
        return tokens

    def count_tokens(self, text: str) -> int:
        """Tokens ``text`` is, [CLS] and [SEP] included (before truncation)."""
        return len(self._tokens(text))

    def _truncated(self, text: str) -> list[int]:
        tokens = self._tokens(text)
        if len(tokens) > self.max_tokens:
            # Keep the closing special token ([SEP]): the model was trained with it.
            tokens = tokens[: self.max_tokens - 1] + tokens[-1:]
        return tokens

    def embed(self, texts: Sequence[str], stop: threading.Event | None = None) -> np.ndarray:
        """``(len(texts), dim)`` float32 rows, each L2-normalised.

        Raises:
            DocumentCancelled: ``stop`` was set (checked between decodes).
            EmbedderError: llama.cpp failed to decode.
        """
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        group: list[list[int]] = []
        start = used = 0
        for i, text in enumerate(texts):
            tokens = self._truncated(text)
            if group and (used + len(tokens) > self._n_batch or len(group) >= self._n_seq):
                self._decode(group, out[start : start + len(group)], stop)
                start, group, used = i, [], 0
            group.append(tokens)
            used += len(tokens)
        if group:
            self._decode(group, out[start : start + len(group)], stop)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        np.divide(out, norms, out=out, where=norms > 0)
        return out

    def _decode(
        self, group: list[list[int]], rows: np.ndarray, stop: threading.Event | None
    ) -> None:
        if stop is not None and stop.is_set():
            raise DocumentCancelled("Indexing was cancelled.")
        import llama_cpp

        llm = self._llm
        batch = llm._batch
        batch.reset()
        for seq, tokens in enumerate(group):
            batch.add_sequence(tokens, seq, True)
        llm._ctx.kv_cache_clear()
        try:
            llm._ctx.decode(batch)
        except RuntimeError as exc:
            raise EmbedderError(f"The embedding model {self.name} failed: {exc}.") from exc
        finally:
            batch.reset()
        ctx = llm._ctx.ctx
        for seq in range(len(group)):
            ptr = llama_cpp.llama_get_embeddings_seq(ctx, seq)
            if not ptr:
                raise EmbedderError(f"The embedding model {self.name} returned no vector.")
            rows[seq] = np.ctypeslib.as_array(ptr, shape=(self.dim,))

    def close(self) -> None:
        """Free the model; idempotent."""
        llm, self._llm = self._llm, None
        if llm is not None:
            llm.close()
