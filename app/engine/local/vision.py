"""A vision projector (``mmproj``) beside the loaded model, driven through libmtmd.

The engine, not libmtmd's chat handler, owns the prompt: :meth:`Projector.sequence`
turns one image into what it adds to the engine's token list (the projector's
begin/end tokens, and a run of the image's pseudo-token id as long as its embeddings,
see ``image_part``), and :meth:`Projector.evaluate` encodes the image and decodes its
embeddings into KV sequence 0 at a position. So an image is cached prefix like any
text: later turns, regenerate and snapshots reuse it, and it is encoded again only
when the cache no longer holds it.

Everything here runs on the engine's thread.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.config.setting_records import LoadConfig
from app.engine.chat_message import ImagePart
from app.engine.image_part import image_token_id
from app.gguf.info import GgufInfo
from app.gguf.projector import ProjectorInfo, check_fits, read_projector
from app.util import crash_record
from app.util.errors import ImageError, ProjectorError
from app.util.images import decode_rgb

log = logging.getLogger(__name__)

_CHUNK_TEXT = 0
PROJECTOR_KEY = "projector"  # in the crash record's load table: the projector being loaded
_KEEP = 32  # tokenized images kept (their chunks hold the preprocessed pixels)
_SHAPES = 4096  # sizes of images let go of, remembered (two ints each) for positions


@dataclass
class ImageSeq:
    """One image, tokenized: its place in the token list, and libmtmd's chunk."""

    digest: str
    tokens: list[int]  # begin tokens, the pseudo-token run, end tokens
    token_id: int
    n_tokens: int  # positions in the KV cache the image's embeddings fill
    n_pos: int  # positions it advances (fewer than n_tokens with M-RoPE)
    chunks: Any  # mtmd_input_chunks*, freed when evicted
    chunk: Any  # its image chunk (owned by ``chunks``)


class Projector:
    """A loaded projector for the model ``llm`` (a ``llama_cpp.Llama``)."""

    def __init__(self, path: Path, llm: Any, n_threads: int, use_gpu: bool = False) -> None:
        from llama_cpp import mtmd_cpp as m

        self._m = m
        self.path = path
        params = m.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.n_threads = max(1, n_threads)
        params.print_timings = False
        params.warmup = True
        ctx = m.mtmd_init_from_file(str(path).encode("utf-8"), llm.model, params)
        if not ctx:
            raise ProjectorError(f"llama.cpp could not load the projector {path.name}.")
        if not m.mtmd_support_vision(ctx):
            m.mtmd_free(ctx)
            raise ProjectorError(f"{path.name} reads no images (an audio projector?).")
        self._ctx = ctx
        self.mrope = bool(m.mtmd_decode_use_mrope(ctx))
        # At most _KEEP tokenized images, the next to let go of first; an image let go of
        # is tokenized again from its ImagePart when it must be read (see ``sequence``).
        self._seqs: collections.OrderedDict[str, ImageSeq] = collections.OrderedDict()
        self._shapes: collections.OrderedDict[int, tuple[int, int]] = collections.OrderedDict()
        self.tokenized = 0  # images tokenized since the load, for tests and figures
        self.encode_ms = 0.0  # the last image's encode and decode, for figures

    def close(self) -> None:
        for seq in self._seqs.values():
            self._m.mtmd_input_chunks_free(seq.chunks)
        self._seqs.clear()
        if self._ctx:
            self._m.mtmd_free(self._ctx)
            self._ctx = None

    def sequence(self, image: ImagePart) -> ImageSeq:
        """``image`` tokenized (cached by digest).

        Only the last ``_KEEP`` images are kept (each chunk holds the preprocessed
        pixels), so a chat may hold any number of pictures in bounded memory: the one
        let go of is the least recently used or one already read into the KV cache, and
        a seq is valid only until the next call (its chunk may be freed then).

        Raises:
            ImageError: the image cannot be read, or libmtmd refused it.
        """
        seq = self._seqs.get(image.digest)
        if seq is not None:
            self._seqs.move_to_end(image.digest)
            return seq
        seq = self._tokenize(image)
        self.tokenized += 1
        self._seqs[image.digest] = seq
        self._shapes[seq.token_id] = (seq.n_tokens, seq.n_pos)
        self._shapes.move_to_end(seq.token_id)
        while len(self._seqs) > _KEEP:
            _digest, old = self._seqs.popitem(last=False)
            self._m.mtmd_input_chunks_free(old.chunks)
        while len(self._shapes) > _SHAPES:
            self._shapes.popitem(last=False)
        return seq

    def known(self, token_id: int) -> ImageSeq | None:
        """The tokenized image whose pseudo-token id is ``token_id``, if still kept."""
        for seq in self._seqs.values():
            if seq.token_id == token_id:
                return seq
        return None

    def shape(self, token_id: int) -> tuple[int, int] | None:
        """``(n_tokens, n_pos)`` of the image with pseudo-token id ``token_id``, if it was
        tokenized lately (remembered after its chunk is let go of)."""
        return self._shapes.get(token_id)

    def _tokenize(self, image: ImagePart) -> ImageSeq:
        m = self._m
        width, height, pixels = decode_rgb(image.data)
        buf = (ctypes.c_ubyte * len(pixels)).from_buffer_copy(pixels)
        bitmap = m.mtmd_bitmap_init(width, height, buf)
        if not bitmap:
            raise ImageError("llama.cpp could not take this image's pixels.")
        chunks = m.mtmd_input_chunks_init()
        try:
            m.mtmd_bitmap_set_id(bitmap, image.digest.encode("ascii"))
            part = m.mtmd_input_part()
            part.bitmap = bitmap
            parts = (ctypes.POINTER(m.mtmd_input_part) * 1)(ctypes.pointer(part))
            rc = m.mtmd_tokenize_from_parts(self._ctx, chunks, parts, 1, False)
        finally:
            m.mtmd_bitmap_free(bitmap)
        if rc != 0:
            m.mtmd_input_chunks_free(chunks)
            raise ImageError(f"The projector could not prepare this image (code {rc}).")
        token_id = image_token_id(image.digest)
        tokens: list[int] = []
        found: tuple[Any, int, int] | None = None
        for i in range(m.mtmd_input_chunks_size(chunks)):
            chunk = m.mtmd_input_chunks_get(chunks, i)
            if m.mtmd_input_chunk_get_type(chunk) == _CHUNK_TEXT:
                n = ctypes.c_size_t()
                ids = m.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                tokens.extend(int(ids[j]) for j in range(n.value))
            elif found is None:
                n_tokens = int(m.mtmd_input_chunk_get_n_tokens(chunk))
                found = (chunk, n_tokens, int(m.mtmd_input_chunk_get_n_pos(chunk)))
                tokens.extend([token_id] * n_tokens)
        if found is None or found[1] <= 0:
            m.mtmd_input_chunks_free(chunks)
            raise ImageError("The projector made no image tokens for this image.")
        return ImageSeq(image.digest, tokens, token_id, found[1], found[2], chunks, found[0])

    def evaluate(self, lctx: Any, seq: ImageSeq, n_past: int, n_batch: int) -> int:
        """Encode ``seq``'s image and decode its embeddings at position ``n_past`` of
        sequence 0; llama.cpp's return code (0: done; non-zero: failed or aborted, and
        the caller removes what it cannot vouch for)."""
        import llama_cpp

        t0 = time.perf_counter()
        new_past = llama_cpp.llama_pos(n_past)
        rc = int(
            self._m.mtmd_helper_eval_chunk_single(
                self._ctx, lctx, seq.chunk, n_past, 0, n_batch, False, ctypes.byref(new_past)
            )
        )
        self.encode_ms = (time.perf_counter() - t0) * 1000
        if rc == 0 and seq.digest in self._seqs:
            # In the KV cache now: rarely needed again, so the first to let go of. A chat
            # read from the start then tokenizes again only the images its own
            # tokenization let go of, not every one after them.
            self._seqs.move_to_end(seq.digest, last=False)
        log.debug("image %s: %d tokens in %.0f ms", seq.digest[:12], seq.n_tokens, self.encode_ms)
        return rc


def check_projector(config: LoadConfig, gguf: GgufInfo) -> ProjectorInfo | None:
    """The projector ``config.mmproj`` names, checked against the model ``gguf`` from
    their headers (None when none is named).

    Raises:
        ProjectorError: not a vision projector, or one made for another model.
    """
    if not config.mmproj:
        return None
    info = read_projector(config.mmproj)
    check_fits(info, gguf.n_embd, gguf.architecture, gguf.display_name)
    return info


def open_projector(config: LoadConfig, llm: Any, info: ProjectorInfo | None) -> Projector | None:
    """The checked projector ``info`` loaded for the model ``llm`` (None for none)."""
    if info is None:
        return None
    # A crash from here on is the projector's: the crash notice sets it aside (crashes.md).
    crash_record.add_to_load(PROJECTOR_KEY, str(info.path))
    return Projector(info.path, llm, config.threads(), use_gpu=config.n_gpu_layers != 0)
