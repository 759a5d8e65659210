"""Can one model draft for another? Compare their vocabularies from GGUF headers.

A draft model proposes token ids that the target model verifies, so both must
mean the same thing by every id: the same tokenizer model, the same token list
(text and type of every token) and the same special tokens. The architecture and
the sizes do not matter. :func:`draft_problem` answers from the files' headers
only, never loading a model: each file is first checked by
:func:`~app.gguf.info.read_gguf_info` (bounded, total), then its token list and
token types are hashed from their raw bytes, so comparing two 262k-token
vocabularies takes a fraction of a second.

llama.cpp's speculative example tolerates vocabularies that differ in size by up
to 128 padding tokens (Qwen 2.5's sizes do); Lamplight asks for equal sizes, so
the draft can never propose an id the target does not have.
"""

from __future__ import annotations

import hashlib
import mmap
from dataclasses import dataclass
from pathlib import Path

from app.gguf.header import (
    ARRAY,
    BOOL,
    INTS,
    SCALARS,
    STRING,
    U64,
    Header,
    mapped_file,
    shown,
    walk_header,
)
from app.gguf.info import read_gguf_info
from app.util.errors import ModelFileError

# Special tokens, by metadata key suffix, with the words a message uses for them.
SPECIAL_TOKENS = (
    ("bos_token_id", "beginning-of-sequence token"),
    ("eos_token_id", "end-of-sequence token"),
    ("eot_token_id", "end-of-turn token"),
    ("padding_token_id", "padding token"),
    ("unknown_token_id", "unknown-text token"),
)
ADD_FLAGS = (
    ("add_bos_token", "a beginning-of-sequence token"),
    ("add_eos_token", "an end-of-sequence token"),
)
_TOKENIZERS = {
    "llama": "SentencePiece (llama)",
    "gpt2": "byte-level BPE (gpt2)",
    "bert": "WordPiece (bert)",
    "t5": "Unigram (t5)",
    "rwkv": "RWKV",
    "plamo2": "PLaMo-2",
    "no_vocab": "none",
    "none": "none",
}
_TOKEN_TYPES = {
    1: "normal text",
    2: "unknown",
    3: "a control token",
    4: "user-defined",
    5: "unused",
    6: "a byte",
}


@dataclass(frozen=True)
class VocabSignature:
    """What a draft must share with its target, read from a GGUF header."""

    tokenizer: str | None  # tokenizer.ggml.model
    n_vocab: int  # length of tokenizer.ggml.tokens (0: none)
    tokens_digest: str  # sha256 of the token list's bytes
    types_digest: str  # sha256 of the token types' bytes ("" when absent)
    special: tuple[int | None, ...]  # ids, in SPECIAL_TOKENS order
    add: tuple[bool | None, ...]  # flags, in ADD_FLAGS order


def vocab_signature(path: str | Path) -> VocabSignature:
    """The vocabulary signature of the GGUF file at ``path``.

    Raises:
        ModelFileError: the file is not a GGUF model llama.cpp could load.
    """
    p = Path(path)
    read_gguf_info(p)  # the whole file checked: a refusal names the problem
    try:
        with mapped_file(p) as buf:
            return _signature(walk_header(buf), buf)
    except (OSError, ValueError) as exc:  # changed since the check above
        raise ModelFileError(f"{shown(p.name)} cannot be read: {exc}.") from exc


def draft_problem(target: str | Path, draft: str | Path) -> str:
    """Why ``draft`` cannot draft for ``target``, in one sentence; "" when it can.

    Never raises: an unreadable or damaged file is a reason too.
    """
    try:
        want = vocab_signature(target)
    except ModelFileError as exc:
        return f"The model cannot be checked: {_sentence(exc)}"
    try:
        have = vocab_signature(draft)
    except ModelFileError as exc:
        return f"The draft model cannot be used: {_sentence(exc)}"
    if want == have:
        return ""
    try:
        return _difference(Path(target), Path(draft), want, have)
    except (OSError, ValueError) as exc:  # a file changed between the reads
        return f"The draft model cannot be compared with the model: {shown(str(exc))}."


def _sentence(exc: Exception) -> str:
    text = str(exc).strip()
    return text if text.endswith((".", "?", "!")) else f"{text}."


def _signature(h: Header, buf: mmap.mmap) -> VocabSignature:
    tokenizer = _text(h, "tokenizer.ggml.model")
    tokens = h.arrays.get("tokenizer.ggml.tokens")
    n_vocab = tokens[1] if tokens is not None and tokens[0] == STRING else 0
    return VocabSignature(
        tokenizer=tokenizer,
        n_vocab=n_vocab,
        tokens_digest=_digest(h, buf, "tokenizer.ggml.tokens") if n_vocab else "",
        types_digest=_digest(h, buf, "tokenizer.ggml.token_type"),
        special=tuple(_id(h, f"tokenizer.ggml.{key}") for key, _ in SPECIAL_TOKENS),
        add=tuple(_flag(h, f"tokenizer.ggml.{key}") for key, _ in ADD_FLAGS),
    )


def _digest(h: Header, buf: mmap.mmap, key: str) -> str:
    """sha256 of an array's element type, count and bytes ("" when the key is absent)."""
    span = h.arrays.get(key)
    if span is None or h.types.get(key) != ARRAY:
        return ""
    itype, count, start, end = span
    digest = hashlib.sha256(f"{itype}:{count}:".encode())
    digest.update(memoryview(buf)[start:end])
    return digest.hexdigest()


def _text(h: Header, key: str) -> str | None:
    value = h.meta.get(key)
    return value if h.types.get(key) == STRING and isinstance(value, str) else None


def _id(h: Header, key: str) -> int | None:
    value = h.meta.get(key)
    if h.types.get(key) not in INTS or not isinstance(value, int):
        return None
    return value


def _flag(h: Header, key: str) -> bool | None:
    value = h.meta.get(key)
    return bool(value) if h.types.get(key) == BOOL else None


def _difference(target: Path, draft: Path, want: VocabSignature, have: VocabSignature) -> str:
    """The first difference between two signatures, as a sentence."""
    if want.tokenizer != have.tokenizer:
        return (
            f"The draft's tokenizer is {_tokenizer(have.tokenizer)}; "
            f"the model's is {_tokenizer(want.tokenizer)}."
        )
    if not want.n_vocab:
        return "The model has no token list, so no draft can be checked against it."
    if not have.n_vocab:
        return "The draft model has no token list (tokenizer.ggml.tokens)."
    if want.n_vocab != have.n_vocab:
        return (
            f"The draft's vocabulary has {have.n_vocab:,} tokens; the model's has {want.n_vocab:,}."
        )
    if want.tokens_digest != have.tokens_digest:
        index, mine, theirs = _first_difference(target, draft)
        return (
            f"The draft's vocabulary differs from the model's at token {index:,} "
            f"({theirs!r} in the draft, {mine!r} in the model)."
        )
    if want.types_digest != have.types_digest:
        return _type_difference(target, draft)
    for (_key, words), mine_id, theirs_id in zip(
        SPECIAL_TOKENS, want.special, have.special, strict=True
    ):
        if mine_id != theirs_id:
            return (
                f"The draft's {words} is {_token(draft, theirs_id)}; "
                f"the model's is {_token(target, mine_id)}."
            )
    for (_key, words), mine_flag, theirs_flag in zip(ADD_FLAGS, want.add, have.add, strict=True):
        if bool(mine_flag) != bool(theirs_flag):
            return (
                f"The draft {'adds' if theirs_flag else 'does not add'} {words} to its "
                f"input; the model {'does' if mine_flag else 'does not'}."
            )
    return ""  # flags unset in one and false in the other: the same behaviour


def _tokenizer(name: str | None) -> str:
    if name is None:
        return "not named"
    return _TOKENIZERS.get(name) or repr(shown(name, 40))


def _strings(path: Path) -> list[bytes]:
    """The token list of a file read_gguf_info accepted (bounded by its checks)."""
    with mapped_file(path) as buf:
        h = walk_header(buf)
        span = h.arrays.get("tokenizer.ggml.tokens")
        if span is None or span[0] != STRING:
            return []
        _itype, count, pos, end = span
        out: list[bytes] = []
        unpack = U64.unpack_from
        for _ in range(count):
            n = unpack(buf, pos)[0]
            pos += 8
            if pos + n > end:
                raise ValueError("the token list runs past its end")
            out.append(buf[pos : pos + n])
            pos += n
        return out


def _word(raw: bytes) -> str:
    return shown(raw.decode("utf-8", errors="replace"), 40)


def _first_difference(target: Path, draft: Path) -> tuple[int, str, str]:
    mine, theirs = _strings(target), _strings(draft)
    for index, (a, b) in enumerate(zip(mine, theirs, strict=True)):
        if a != b:
            return index, _word(a), _word(b)
    raise ValueError("the token lists changed while they were compared")


def _types(path: Path) -> tuple[int, ...] | None:
    with mapped_file(path) as buf:
        h = walk_header(buf)
        span = h.arrays.get("tokenizer.ggml.token_type")
        if span is None or span[0] not in INTS:
            return None
        itype, _count, start, end = span
        return tuple(int(v) for (v,) in SCALARS[itype].iter_unpack(buf[start:end]))


def _type_difference(target: Path, draft: Path) -> str:
    mine, theirs = _types(target), _types(draft)
    if mine is None or theirs is None:
        side = "The draft" if theirs is None else "The model"
        return f"{side} does not say which tokens are special (tokenizer.ggml.token_type)."
    if len(mine) != len(theirs):
        return "The draft's token types do not cover the same tokens as the model's."
    for index, (a, b) in enumerate(zip(mine, theirs, strict=True)):
        if a != b:
            text = _word(_strings(target)[index])
            return (
                f"The draft treats token {index:,} ({text!r}) as {_kind(b)}; "
                f"the model treats it as {_kind(a)}."
            )
    return "The draft's token types are stored differently from the model's."


def _kind(token_type: int) -> str:
    return _TOKEN_TYPES.get(token_type, f"type {token_type}")


def _token(path: Path, token_id: int | None) -> str:
    """``id 1 ('<eos>')``, or "not set"."""
    if token_id is None:
        return "not set"
    strings = _strings(path)
    if 0 <= token_id < len(strings):
        return f"id {token_id:,} ({_word(strings[token_id])!r})"
    return f"id {token_id:,} (not in its vocabulary)"
