"""The KV cache side of the engine: reading tokens in, rewinding, saving and restoring
sequence 0, and the LoRA stack its tokens were evaluated under.

``Engine`` (``app.engine.local.engine``) derives from ``EngineCache``; both run on the one
thread that owns the model.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.config.params import LoadConfig
from app.engine.backend import KvState, PrefillProgress
from app.engine.chat_message import ChatMessage, ImagePart
from app.engine.context_map import ContextMap
from app.engine.image_part import has_markers, image_token_id, is_image_token, split_markers
from app.engine.local.adapters import AdapterSet
from app.engine.local.kv_state import read_sequence, write_sequence
from app.engine.local.vocab import Vocab
from app.engine.native.handles import Native
from app.engine.prompt.pipeline import least_tokens
from app.gguf.lora import AdapterInfo, LoraStack, stack_key
from app.util.errors import DecodeError, ImageError, LamplightError, NoModelLoaded

if TYPE_CHECKING:
    from app.engine.local.vision import ImageSeq, Projector

log = logging.getLogger(__name__)

LORA_CHANGED_NOTE = "the LoRA stack changed"
HEAD_LOST_NOTE = "the cached conversation did not start with the model's BOS token"


class EngineCache:
    """One loaded model's KV sequence 0 and what it holds (``ContextMap``)."""

    _vocab: Vocab | None  # the loaded model's (set by Engine)

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
        # A vision projector loaded with the model, and the images of the request being
        # rendered (by digest): what the image markers in its prompt text stand for.
        self._projector: Projector | None = None
        self._images: dict[str, ImagePart] = {}

    @property
    def native(self) -> Native:
        """The loaded model's native handles (``app.engine.native.handles``), on the owner thread.

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
            # The vision projector's file, which read any picture in the cache ("" for
            # none). SessionCache moves it to the snapshot header's own ``projector`` field,
            # fingerprinted; the KV pool compares it as it is.
            "projector": str(self._projector.path) if self._projector is not None else "",
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

    def tokenize(self, text: str) -> list[int]:
        """Token ids for prompt text: special tokens parsed, BOS added if the model wants it."""
        llm = self._require()
        return list(llm.tokenize(text.encode("utf-8", "replace"), add_bos=True, special=True))

    def _tokenize(self, text: str, bos: bool) -> list[int]:
        """Token ids for prompt text; each image marker becomes its image's tokens.

        Raises:
            ImageError: an image cannot be read, or is not among the request's images.
        """
        if not text:
            return []
        if self._projector is None or not has_markers(text):
            data = text.encode("utf-8", "replace")
            return list(self._llm.tokenize(data, add_bos=bos, special=True))
        out: list[int] = []
        for is_image, part in split_markers(text):
            if is_image:
                image = self._images.get(part)
                if image is None:
                    raise ImageError("An image in this conversation is no longer available.")
                out += ([*self._head] if bos and not out else []) + self.image_seq(image).tokens
            else:
                data = part.encode("utf-8", "replace")
                out += list(self._llm.tokenize(data, add_bos=bos and not out, special=True))
        return out

    def _least_tokens(self, text: str) -> int:
        """At least how many tokens ``_tokenize`` makes of ``text``, found without it
        (``Vocab.longest_token``; 0 when the vocabulary gives no bound)."""
        longest = self._vocab.longest_token() if self._vocab is not None else 0
        return least_tokens(text, longest)

    def use_images(self, messages: Sequence[ChatMessage]) -> None:
        """The images the next renders of ``messages`` may show (by digest).

        Raises:
            ImageError: there are images and this model sees none.
        """
        images = [i for m in messages for i in m.images]
        if images and self._projector is None:
            raise ImageError(
                "This model does not see images: load it with its vision projector "
                "(an mmproj file) to send pictures."
            )
        self._images = {i.digest: i for i in images}

    def image_seq(self, image: ImagePart) -> ImageSeq:
        """``image`` tokenized by the projector (cached).

        Raises:
            ImageError.
        """
        if self._projector is None:
            raise ImageError("This model does not see images (no vision projector is loaded).")
        return self._projector.sequence(image)

    def image_tokens(self, image: ImagePart) -> int:
        """Context tokens ``image`` takes (its embeddings and the tokens around them)."""
        self._require()
        return len(self.image_seq(image).tokens)

    def _kept_image(self, token_id: int) -> ImageSeq | None:
        """The tokenized image whose pseudo-token is ``token_id``: the projector's, or the
        request's image of that id tokenized again (the projector keeps only the last
        few). Valid until the next tokenization; None when no image of the request has
        that id.

        Raises:
            ImageError: the request's image can no longer be read.
        """
        if self._projector is None:
            return None
        seq = self._projector.known(token_id)
        if seq is not None:
            return seq
        for image in self._images.values():
            if image_token_id(image.digest) == token_id:
                return self._projector.sequence(image)
        return None

    def _image_shape(self, token_id: int) -> tuple[int, int] | None:
        """``(n_tokens, n_pos)`` of the image ``token_id`` (None: not one this engine knows)."""
        if self._projector is None:
            return None
        shape = self._projector.shape(token_id)
        if shape is None:
            seq = self._kept_image(token_id)
            shape = (seq.n_tokens, seq.n_pos) if seq is not None else None
        return shape

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
            shape = self._image_shape(token)
            if shape is None or tokens[at : at + shape[0]] != [token] * shape[0]:
                raise DecodeError("An image in the prompt could not be read again.")
            yield at, at + shape[0], token
            at += shape[0]

    def _pos(self, n: int) -> int:
        """The KV position after the first ``n`` cached tokens (fewer with M-RoPE images)."""
        if self._projector is None or not self._projector.mrope:
            return n
        tokens, pos, at = self._map.tokens, n, 0
        while at < min(n, len(tokens)):
            try:
                shape = self._image_shape(tokens[at]) if is_image_token(tokens[at]) else None
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
        tokens = self._map.tokens
        while 0 < n < len(tokens) and is_image_token(tokens[n]) and tokens[n - 1] == tokens[n]:
            n -= 1
        return n

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
            for start, end, image in self._segments(tokens, n_batch):
                if stop.is_set():
                    return
                chunk = tokens[start:end]
                if image is None:
                    rc = native.decode(chunk)
                else:
                    assert self._projector is not None
                    at = self._pos(len(self._map.tokens))
                    # Fetched last: nothing may tokenize (and let go of it) before it is read.
                    seq = self._kept_image(image)
                    if seq is None:
                        raise DecodeError("An image in the prompt could not be read again.")
                    rc = self._projector.evaluate(native.ctx, seq, at, n_batch)
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
        n = self._image_start(n)
        # Checked before the removal: afterwards the window's cells may all be gone.
        pos_min = native.seq_pos_min()
        if n > 0 and self._n_swa > 0 and pos_min > max(0, n - self._n_swa):
            note = (
                f"the sliding-window cache starts at token {pos_min}, "
                f"too late to continue from token {n}"
            )
        elif n < len(self._map.tokens) and not native.seq_rm(self._pos(n)):
            note = "llama.cpp could not rewind the cache"
        if note:
            log.info("cache rebuilt: %s", note)
            native.clear()
            self._map.clear()
        else:
            self._map.truncate(n)
        return note
