"""The KV cache side of the engine: reading tokens in, rewinding, saving and restoring
sequence 0, and the LoRA stack its tokens were evaluated under.

``Engine`` (``app.engine.llama``) derives from ``EngineCache``; both run on the one
thread that owns the model.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from app.config.params import LoadConfig
from app.engine.adapters import AdapterSet
from app.engine.backend import KvState, PrefillProgress
from app.engine.context_map import ContextMap
from app.engine.kv_state import read_sequence, write_sequence
from app.engine.native import Native
from app.gguf.lora import AdapterInfo, LoraStack, stack_key
from app.util.errors import DecodeError, LamplightError, NoModelLoaded

log = logging.getLogger(__name__)

LORA_CHANGED_NOTE = "the LoRA stack changed"
HEAD_LOST_NOTE = "the cached conversation did not start with the model's BOS token"


class EngineCache:
    """One loaded model's KV sequence 0 and what it holds (``ContextMap``)."""

    def __init__(self) -> None:
        self._llm: Any = None
        self._native: Native | None = None  # the loaded model's native handles
        self._config: LoadConfig | None = None
        # Tokens whose keys/values are in KV sequence 0, and the text they encode.
        self._map = ContextMap()
        self._n_swa = 0
        self._stop = threading.Event()
        self._abort_cb: Any = None
        # What the engine puts before the template's text (BOS, if the model wants it).
        self._head: tuple[int, ...] = ()
        # LoRA: the loaded adapters and the applied stack; the stack the KV cache was
        # computed under (it goes stale when the two differ).
        self._adapters = AdapterSet()
        self._kv_lora_sig: list[dict[str, Any]] = []

    @property
    def native(self) -> Native:
        """The loaded model's native handles (``app.engine.native``), on the owner thread.

        Raises:
            NoModelLoaded.
        """
        if self._native is None:
            raise NoModelLoaded("No model is loaded. Open a model first.")
        return self._native

    def _require(self) -> Any:
        if self._llm is None:
            raise NoModelLoaded("No model is loaded. Open a model first.")
        return self._llm

    @property
    def cached_tokens(self) -> list[int]:
        """A copy of the token ids currently held in the KV cache."""
        return list(self._map.tokens)

    @property
    def context_text(self) -> str:
        """The text the KV cache holds (the last prompt as rendered, and its reply)."""
        return self._map.text

    def reset(self) -> None:
        """Forget the conversation held in the KV cache (for a new chat)."""
        self._require()
        self.native.clear()
        self._map.clear()

    @property
    def lora_stack(self) -> LoraStack:
        """A copy of the adapter stack applied to the context (empty after every load)."""
        return self._adapters.stack.copy()

    def lora_signature(self) -> list[dict[str, Any]]:
        """The applied stack's ``LoraStack.signature()``."""
        return [dict(s) for s in self._adapters.signature]

    @property
    def lora_stale(self) -> bool:
        """The KV cache holds tokens evaluated under a stack that changes the output differently."""
        return bool(self._map.tokens) and stack_key(self._kv_lora_sig) != stack_key(
            self._adapters.signature
        )

    def set_lora_stack(self, stack: LoraStack) -> bool:
        """Apply ``stack`` from the next message on; the model stays loaded.

        Loaded adapters are reused, new ones checked first (``AdapterSet.apply``).
        On any error nothing changes.

        Returns True when the cached conversation is now stale: the next ``generate``
        evaluates it again and says so in ``metrics.cache_note``. Changes that leave the
        output alone (order, a disabled or scale-0 entry) keep the cache.

        Raises:
            NoModelLoaded, LoraError.
        """
        self._adapters.apply(self._require(), stack)
        stale = self.lora_stale
        log.info(
            "LoRA stack applied: %s%s",
            self._adapters.stack.summary() or "none",
            " (cache stale)" * stale,
        )
        return stale

    def adapter_info(self, path: str | Path) -> AdapterInfo:
        """Read ``path`` and check it against the loaded model, without loading it.

        Raises:
            NoModelLoaded, LoraError.
        """
        self._require()
        return self._adapters.check(path)

    @property
    def loaded_adapters(self) -> int:
        """How many adapters llama.cpp holds for this model (applied or idle)."""
        return len(self._adapters)

    def last_logits(self) -> Any:
        """A numpy copy of the logits of the last evaluated token (for tests and benches)."""
        llm = self._require()
        import numpy as np

        row = self.native.logits(-1)
        if not row:
            raise LamplightError("There are no logits yet: nothing has been evaluated.")
        return np.ctypeslib.as_array(row, shape=(llm.n_vocab(),)).copy()

    def _check_head(self) -> str:
        """Empty a cache that does not start with ``_head`` (BOS); returns the note to show.

        Older versions dropped BOS with the first message when the context was full, and
        saved such caches in snapshots: every later reply would be read without it.
        """
        head = list(self._head)
        if not head or not self._map.tokens or self._map.tokens[: len(head)] == head:
            return ""
        self.native.clear()
        self._map.clear()
        log.info("cache rebuilt: %s", HEAD_LOST_NOTE)
        return HEAD_LOST_NOTE

    def _sync_lora(self) -> str:
        """Empty a cache evaluated under another stack; returns the note to show, if any."""
        if not self.lora_stale:
            return ""
        self.native.clear()
        self._map.clear()
        self._kv_lora_sig = self._adapters.signature
        log.info("cache rebuilt: %s", LORA_CHANGED_NOTE)
        return LORA_CHANGED_NOTE

    def cache_config(self) -> dict[str, Any]:
        """Context settings a saved KV state depends on."""
        self._require()
        assert self._config is not None
        return {
            "n_ctx": self._llm.n_ctx(),
            "kv_type": self._config.kv_type,
            # Flash attention stores V untransposed: a state from one does not fit the other.
            "flash_attn": self._config.flash_attn or self._config.kv_type != "f16",
            "swa_full": True,
            "n_swa": self._n_swa,
            # The adapters the cached tokens were evaluated with (SessionCache moves this
            # to the snapshot header's own ``lora`` field).
            "lora": [
                dict(s)
                for s in (self._kv_lora_sig if self._map.tokens else self._adapters.signature)
            ],
        }

    def state_size(self) -> int:
        """Bytes llama.cpp needs to serialize KV sequence 0."""
        self._require()
        return self.native.state_size()

    def export_state(self, key: str = "") -> KvState:
        """Copy KV sequence 0 out of llama.cpp (no logits: it scales with the cache)."""
        self._require()
        return KvState(
            state=read_sequence(self.native.ctx),
            tokens=list(self._map.tokens),
            text=self._map.text,
            marks=list(self._map.marks),
        )

    def import_state(self, kv: KvState) -> None:
        """Replace the cache with ``kv``; on failure the cache is left empty.

        Raises:
            LamplightError: llama.cpp rejected the state, or it does not cover ``kv.tokens``.
        """
        self._require()
        self.native.clear()
        self._map.clear()
        if not kv.tokens:
            return
        write_sequence(self.native.ctx, kv.state, len(kv.tokens), self._n_swa)
        # Sorted, each once: files from versions whose drops doubled a mark hold repeats.
        self._map = ContextMap(list(kv.tokens), kv.text, sorted(set(kv.marks)) or [(0, 0)])
        # The caller (SessionCache) applied the stack the state was saved under.
        self._kv_lora_sig = self._adapters.signature

    def _tokenize(self, text: str, bos: bool) -> list[int]:
        if not text:
            return []
        data = text.encode("utf-8", "replace")
        return list(self._llm.tokenize(data, add_bos=bos, special=True))

    def _prefill(self, tokens: Sequence[int], stop: threading.Event) -> Iterator[PrefillProgress]:
        """Evaluate ``tokens`` in batches with the abort callback armed."""
        if not tokens:  # llama.cpp aborts the process on an empty batch
            return
        native = self.native
        n_batch = native.n_batch
        self._stop = stop
        if not self._map.tokens:
            # An empty cache fills under the applied stack.
            self._kv_lora_sig = self._adapters.signature
        native.arm_abort(self._abort_cb)
        try:
            for start in range(0, len(tokens), n_batch):
                if stop.is_set():
                    return
                chunk = tokens[start : start + n_batch]
                rc = native.decode(chunk)
                if rc == 2 or (rc != 0 and stop.is_set()):
                    # Aborted: some ubatches may be in memory; drop what we cannot vouch for.
                    self._rewind(len(self._map.tokens))
                    return
                if rc != 0:
                    self._rewind(len(self._map.tokens))
                    raise DecodeError(f"llama.cpp failed to evaluate the prompt (code {rc}).")
                self._map.tokens.extend(chunk)
                yield PrefillProgress(start + len(chunk), len(tokens))
        finally:
            # Off during decoding: llama.cpp calls it for every graph node, which
            # would cost a Python call per node per token.
            native.disarm_abort()

    def _should_abort(self, _data: Any) -> bool:
        return self._stop.is_set()

    def _rewind(self, n: int) -> str:
        """Keep only the first ``n`` tokens in the KV cache.

        Returns a note when the cache had to be emptied instead: llama.cpp
        refused the partial removal, or a sliding-window layer no longer holds
        the window that position ``n`` attends to (restored snapshots keep only
        the last window). Then the whole prompt is evaluated again.
        """
        native = self.native
        note = ""
        # Checked before the removal: afterwards the window's cells may all be gone.
        pos_min = native.seq_pos_min()
        if n > 0 and self._n_swa > 0 and pos_min > max(0, n - self._n_swa):
            note = (
                f"the sliding-window cache starts at token {pos_min}, "
                f"too late to continue from token {n}"
            )
        elif n < len(self._map.tokens) and not native.seq_rm(n):
            note = "llama.cpp could not rewind the cache"
        if note:
            log.info("cache rebuilt: %s", note)
            native.clear()
            self._map.clear()
        else:
            self._map.truncate(n)
        return note
