"""Check a GGUF file as an embedding model before llama.cpp opens it.

The same checks as a chat model (``app.gguf.info``: header walk, tensor table, the
hyperparameters llama.cpp aborts on), with a BERT (WordPiece) vocabulary allowed, and
what an embedder load needs besides (``docs/notes/documents_plan.md`` §2.1): an
architecture llama.cpp embeds with, a pooling that yields one vector per text, and the
WordPiece special tokens and token types llama.cpp asserts on. A chat model picked as
an embedder is refused with a message that says so.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.gguf.header import INTS, SCALARS, STRING, Header, int_value, is_text, shown
from app.gguf.info import _check_model, _check_tensors, checked_header
from app.util.errors import EmbedderError, ModelFileError

ARCHITECTURES = frozenset({"bert", "nomic-bert", "jina-bert-v2", "modern-bert"})
POOLING = {1: "mean", 2: "cls", 3: "last"}  # llama_pooling_type; NONE/RANK give no vector
_BYTE_TOKEN = 6  # llama_token_type BYTE: WPM's token_to_byte aborts on it
# llama.cpp's WPM defaults, kept when the file's id is missing or out of range.
_WPM_SPECIAL = {"bos": 101, "seperator": 102, "unknown": 100}


@dataclass(frozen=True)
class EmbedderInfo:
    """What an embedding model's header says, once it passed the checks."""

    path: Path
    name: str
    architecture: str
    n_embd: int
    context_length: int
    pooling_type: int  # 1 mean, 2 cls, 3 last
    n_vocab: int
    size_bytes: int


def read_embedder_info(path: Path) -> EmbedderInfo:
    """Check that ``path`` is an embedding model llama.cpp can load, and read it.

    Raises:
        EmbedderError: a GGUF file that is not a usable embedding model.
        ModelFileError: a file that is missing, unreadable or not a sound GGUF.
    """
    p = Path(path)
    found: list[EmbedderInfo] = []

    def check(name: str, header: Header, buf: mmap.mmap) -> int:
        n_params = _check_tensors(name, header)
        _refuse_chat_model(name, header)
        _check_model(name, header, buf, allow_bert=True)
        found.append(_embedder(p, name, header, buf))
        return n_params

    try:
        checked_header(p, check, kind="embedding model")
    except EmbedderError:
        raise
    except ModelFileError as exc:
        text = str(exc)
        if "cannot be loaded" in text:  # a header value llama.cpp refuses: not an embedder
            raise EmbedderError(text) from exc
        raise
    return found[0]


def _refuse_chat_model(name: str, h: Header) -> None:
    arch = h.meta.get("general.architecture")
    template = h.meta.get("tokenizer.chat_template")
    causal = h.meta.get(f"{arch}.attention.causal", True)
    pools = h.types.get(f"{arch}.pooling_type") in INTS
    if causal is False:
        return
    if isinstance(template, str) and template.strip():
        what = "a chat model"
    elif arch not in ARCHITECTURES and not pools:
        what = "a text-generating model"
    else:
        return
    raise EmbedderError(
        f"{name} is {what}, not an embedding model; open it as a model, and choose an "
        "embedding model (such as the built-in all-MiniLM-L6-v2) for documents."
    )


def _embedder(p: Path, name: str, h: Header, buf: mmap.mmap) -> EmbedderInfo:
    meta, types = h.meta, h.types
    arch = str(meta["general.architecture"])

    def value(key: str) -> int | None:
        return int_value(meta.get(key)) if types.get(key) in INTS else None

    def refuse(reason: str) -> EmbedderError:
        return EmbedderError(f"{name} cannot be used as an embedding model: {reason}.")

    if arch not in ARCHITECTURES:
        known = ", ".join(sorted(ARCHITECTURES))
        raise refuse(f"its architecture {shown(arch)!r} is not one Lamplight embeds with ({known})")
    pooling = value(f"{arch}.pooling_type")
    if pooling not in POOLING:
        raise refuse("it does not pool its output into one vector (mean, CLS or last token)")
    n_embd = value(f"{arch}.embedding_length")
    context = value(f"{arch}.context_length")
    if not n_embd or not context:
        raise refuse("its header lacks the embedding or context length")
    n_vocab = int_value(meta.get("tokenizer.ggml.tokens#len")) or 0
    if n_vocab < 1:
        raise refuse("it has no vocabulary")
    if meta.get("tokenizer.ggml.model") == "bert":
        _check_wordpiece(h, buf, n_vocab, refuse)
    return EmbedderInfo(
        path=p,
        name=str(meta.get("general.name") or "") if is_text(h, "general.name") else "",
        architecture=arch,
        n_embd=n_embd,
        context_length=context,
        pooling_type=pooling,
        n_vocab=n_vocab,
        size_bytes=h.size,
    )


def _check_wordpiece(
    h: Header, buf: mmap.mmap, n_vocab: int, refuse: Callable[[str], EmbedderError]
) -> None:
    """What llama.cpp's WPM tokenizer asserts on: token types, special ids, byte tokens."""
    meta, types = h.meta, h.types
    count = int_value(meta.get("tokenizer.ggml.token_type_count"))
    if types.get("tokenizer.ggml.token_type_count") not in INTS or not count or count < 1:
        raise refuse("its tokenizer.ggml.token_type_count is missing or 0")
    for kind, default in _WPM_SPECIAL.items():
        key = f"tokenizer.ggml.{kind}_token_id"
        given = int_value(meta.get(key)) if types.get(key) in INTS else None
        token = given if given is not None and 0 <= given < n_vocab else default
        if token >= n_vocab:
            raise refuse(f"its {kind} token id {token} is outside its {n_vocab}-token vocabulary")
    span = h.arrays.get("tokenizer.ggml.token_type")
    if span is None:
        return
    itype, n, start, _end = span
    if itype == STRING or itype not in SCALARS or n != n_vocab:
        raise refuse("its token type list does not match its vocabulary")
    dtype = np.dtype(SCALARS[itype].format)
    # A copy, not a view: a view of the map would keep it from closing.
    kinds = np.frombuffer(buf[start : start + n * dtype.itemsize], dtype=dtype)
    if bool((kinds == _BYTE_TOKEN).any()):
        raise refuse("its WordPiece vocabulary has byte tokens, which llama.cpp cannot read")
