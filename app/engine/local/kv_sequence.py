"""KV sequence 0 of one loaded model: the tokens it holds and the text they encode
(``ContextMap``), reading tokens in, rewinding, saving and restoring it, and the LoRA
stack its tokens were evaluated under. Runs on the thread that owns the model."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from app.engine.backend import KvState, PrefillProgress
from app.engine.context_map import ContextMap, common_prefix
from app.engine.image_part import is_image_token
from app.engine.local.checkpoints import Checkpoints
from app.engine.local.kv_state import read_sequence, write_sequence
from app.engine.local.loaded_model import LoadedModel
from app.engine.native.handles import HYBRID, RECURRENT
from app.engine.prompt.pipeline import Prompt
from app.gguf.lora import stack_key
from app.util.errors import DecodeError, ImageError

log = logging.getLogger(__name__)

LORA_CHANGED_NOTE = "the LoRA stack changed"
HEAD_LOST_NOTE = "the cached conversation did not start with the model's BOS token"


class KvSequence:
    """What ``model``'s KV sequence 0 holds (``map``), and how it changes."""

    def __init__(self, model: LoadedModel) -> None:
        import llama_cpp

        self._model = model
        self._native = model.native
        self._tokens = model.tokenizer
        # Tokens whose keys/values are in KV sequence 0, and the text they encode.
        self.map = ContextMap()
        # The stack the cached tokens were computed under (stale when the applied one differs).
        self.lora_sig: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._abort_cb = llama_cpp.ggml_abort_callback(self._should_abort)
        # A recurrent state rewinds only to where it was copied out (``checkpoints``).
        recurrent = model.memory in (RECURRENT, HYBRID)
        self.checkpoints = Checkpoints(model.native) if recurrent else None

    def clear(self) -> None:
        """Forget every cached token."""
        self._native.clear()
        self.map.clear()
        if self.checkpoints is not None:
            self.checkpoints.clear()

    def checkpoint(self) -> None:
        """Keep a checkpoint of a recurrent state here (the end of a reply)."""
        if self.checkpoints is not None:
            self.checkpoints.take(len(self.map.tokens))

    @property
    def lora_stale(self) -> bool:
        """The cache holds tokens evaluated under a stack that changes the output differently."""
        return bool(self.map.tokens) and stack_key(self.lora_sig) != stack_key(
            self._model.adapters.signature
        )

    def check_head(self) -> str:
        """Empty a cache that does not start with the model's head (BOS); returns the note
        to show.

        Older versions dropped BOS with the first message when the context was full, and
        saved such caches in snapshots: every later reply would be read without it.
        """
        head = list(self._model.head)
        if not head or not self.map.tokens or self.map.tokens[: len(head)] == head:
            return ""
        self.clear()
        log.info("cache rebuilt: %s", HEAD_LOST_NOTE)
        return HEAD_LOST_NOTE

    def sync_lora(self) -> str:
        """Empty a cache evaluated under another stack; returns the note to show, if any."""
        if not self.lora_stale:
            return ""
        self.clear()
        self.lora_sig = self._model.adapters.signature
        log.info("cache rebuilt: %s", LORA_CHANGED_NOTE)
        return LORA_CHANGED_NOTE

    def cache_config(self) -> dict[str, Any]:
        """Context settings a saved KV state depends on."""
        model = self._model
        return {
            "n_ctx": model.llm.n_ctx(),
            "kv_type": model.config.kv_type,
            # Flash attention stores V untransposed: a state from one does not fit the other.
            "flash_attn": model.flash,
            "swa_full": True,
            "n_swa": model.n_swa,
            # The vision projector's file, which read any picture in the cache ("" for
            # none). SessionCache moves it to the snapshot header's own ``projector`` field,
            # fingerprinted; the KV pool compares it as it is.
            "projector": str(model.projector.path) if model.projector is not None else "",
            # The adapters the cached tokens were evaluated with (SessionCache moves this
            # to the snapshot header's own ``lora`` field).
            "lora": [
                dict(s) for s in (self.lora_sig if self.map.tokens else model.adapters.signature)
            ],
        }

    def export_state(self) -> KvState:
        """Copy KV sequence 0 out of llama.cpp (no logits: it scales with the cache)."""
        return KvState(
            state=read_sequence(self._native.ctx),
            tokens=list(self.map.tokens),
            text=self.map.text,
            marks=list(self.map.marks),
            checkpoints=self.checkpoints.saved() if self.checkpoints is not None else (),
        )

    def import_state(self, kv: KvState) -> None:
        """Replace the cache with ``kv``; on failure the cache is left empty.

        Raises:
            LamplightError: llama.cpp rejected the state, or it does not cover ``kv.tokens``.
        """
        self.clear()
        if not kv.tokens:
            return
        write_sequence(self._native.ctx, kv.state, len(kv.tokens), self._model.n_swa)
        # Sorted, each once: files from versions whose drops doubled a mark hold repeats.
        self.map = ContextMap(list(kv.tokens), kv.text, sorted(set(kv.marks)) or [(0, 0)])
        if self.checkpoints is not None:  # a reopened chat rewinds as the open one did
            self.checkpoints.load(kv.checkpoints, len(kv.tokens))
        # The caller (SessionCache) applied the stack the state was saved under.
        self.lora_sig = self._model.adapters.signature

    def reuse(self, tokens: Sequence[int]) -> tuple[int, str]:
        """Rewind to the longest cached prefix of ``tokens``, short of the last (it must
        be evaluated to get its logits); how many tokens are kept, and ``rewind``'s note."""
        keep = common_prefix(self.map.tokens, tokens)
        if keep == len(tokens):
            keep -= 1
        note = self.rewind(keep)
        return len(self.map.tokens), note

    def mark_prompt(self, prompt: Prompt) -> None:
        """Mark where ``prompt``'s messages start and where it ends, once it is read in."""
        for n_tokens, n_chars in prompt.bounds:
            self.map.mark_at(n_tokens, n_chars)
        self.map.mark(prompt.text)

    def _segments(
        self, tokens: Sequence[int], n_batch: int
    ) -> Iterator[tuple[int, int, int | None]]:
        """``tokens`` cut into text batches and whole images: ``(start, end, image id)``.

        Raises:
            DecodeError: an image run that no image of the request makes.
            ImageError: the request's image can no longer be read.
        """
        at = 0
        while at < len(tokens):
            token = tokens[at]
            if not is_image_token(token):
                end = at
                while end < len(tokens) and end - at < n_batch and not is_image_token(tokens[end]):
                    end += 1
                yield at, end, None
                at = end
                continue
            shape = self._tokens.image_shape(token)
            if shape is None or tokens[at : at + shape[0]] != [token] * shape[0]:
                raise DecodeError("An image in the prompt could not be read again.")
            yield at, at + shape[0], token
            at += shape[0]

    def pos(self, n: int) -> int:
        """The KV position after the first ``n`` cached tokens (fewer with M-RoPE images)."""
        if not self._model.mrope:
            return n
        tokens, pos, at = self.map.tokens, n, 0
        while at < min(n, len(tokens)):
            try:
                shape = self._tokens.image_shape(tokens[at]) if is_image_token(tokens[at]) else None
            except ImageError:
                shape = None
            if shape is None:
                at += 1
                continue
            if at + shape[0] <= n:
                pos -= shape[0] - shape[1]
            at += shape[0]
        return pos

    def _image_start(self, n: int) -> int:
        """``n`` moved back to the start of the image it falls inside (an image is kept or
        read again whole)."""
        tokens = self.map.tokens
        while 0 < n < len(tokens) and is_image_token(tokens[n]) and tokens[n - 1] == tokens[n]:
            n -= 1
        return n

    def prefill(self, tokens: Sequence[int], stop: threading.Event) -> Iterator[PrefillProgress]:
        """Evaluate ``tokens`` in batches with the abort callback armed."""
        if not tokens:  # llama.cpp aborts the process on an empty batch
            return
        native = self._native
        n_batch = native.n_batch
        self._stop = stop
        if not self.map.tokens:
            # An empty cache fills under the applied stack.
            self.lora_sig = self._model.adapters.signature
        native.arm_abort(self._abort_cb)
        try:
            for start, end, image in self._segments(tokens, n_batch):
                if stop.is_set():
                    return
                chunk = tokens[start:end]
                last = end == len(tokens)
                rc = (
                    self._decode(chunk, last) if image is None else self._read_image(image, n_batch)
                )
                if rc == 2 or (rc != 0 and stop.is_set()):
                    # Aborted: some ubatches may be in memory; drop what we cannot vouch for.
                    self._unvouched()
                    return
                if rc != 0:
                    self._unvouched()
                    raise DecodeError(f"llama.cpp failed to evaluate the prompt (code {rc}).")
                self.map.tokens.extend(chunk)
                if self.checkpoints is not None and self.checkpoints.due(len(self.map.tokens)):
                    self.checkpoints.take(len(self.map.tokens))
                yield PrefillProgress(start + len(chunk), len(tokens))
        finally:
            # Off during decoding: llama.cpp calls it for every graph node, which
            # would cost a Python call per node per token.
            native.disarm_abort()

    def _decode(self, chunk: Sequence[int], last: bool) -> int:
        """Evaluate ``chunk`` after the cache. A recurrent state is copied out before a
        prompt's last token: a regenerate goes back there (the last token is read again
        for its logits)."""
        native = self._native
        if self.checkpoints is None or not last or len(chunk) < 2:
            return native.decode(chunk)
        rc = native.decode(chunk[:-1])
        if rc != 0:
            return rc
        self.checkpoints.take(len(self.map.tokens) + len(chunk) - 1)
        return native.decode(chunk[-1:])

    def _unvouched(self) -> None:
        """After a read that stopped midway: what llama.cpp may hold past the map goes
        (a recurrent state back to its last checkpoint), else the whole cache."""
        n = len(self.map.tokens)
        if self.checkpoints is not None:
            n = self.checkpoints.restore(n)
        if not n or not self._native.seq_rm(self.pos(n)):
            self.clear()
        else:
            self.map.truncate(n)

    def _read_image(self, image: int, n_batch: int) -> int:
        """Evaluate the image whose pseudo-token is ``image`` at the end of the cache."""
        projector = self._model.projector
        assert projector is not None
        at = self.pos(len(self.map.tokens))
        # Fetched last: nothing may tokenize (and let go of it) before it is read.
        seq = self._tokens.kept_image(image)
        if seq is None:
            raise DecodeError("An image in the prompt could not be read again.")
        return projector.evaluate(self._native.ctx, seq, at, n_batch)

    def _should_abort(self, _data: Any) -> bool:
        return self._stop.is_set()

    def rewind(self, n: int) -> str:
        """Keep only the first ``n`` tokens in the KV cache.

        Returns a note when the cache had to be emptied instead: llama.cpp
        refused the partial removal, or a sliding-window layer no longer holds
        the window that position ``n`` attends to (restored snapshots keep only
        the last window), or a recurrent state has no checkpoint early enough.
        Then the whole prompt is evaluated again. A recurrent state goes back to
        its nearest checkpoint at or before ``n``: the cache may keep fewer tokens.
        """
        native, n_swa = self._native, self._model.n_swa
        note = ""
        n = self._image_start(n)
        # Checked before the removal: afterwards the window's cells may all be gone.
        pos_min = native.seq_pos_min()
        if n > 0 and n_swa > 0 and pos_min > max(0, n - n_swa):
            note = (
                f"the sliding-window cache starts at token {pos_min}, "
                f"too late to continue from token {n}"
            )
        elif n < len(self.map.tokens) and self.checkpoints is not None:
            # A recurrent state is not cut: it goes back to a checkpoint at or before n.
            n = self.checkpoints.restore(n)
            if not n or not native.seq_rm(self.pos(n)):
                note = "no checkpoint of the model's recurrent state was that early"
        elif n < len(self.map.tokens) and not native.seq_rm(self.pos(n)):
            note = "llama.cpp could not rewind the cache"
        if note:
            log.info("cache rebuilt: %s", note)
            self.clear()
        else:
            self.map.truncate(n)
        return note
