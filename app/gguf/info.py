"""Read a GGUF file's header, and refuse the files llama.cpp would crash on.

Model files are untrusted: anything in the models folder can be named ``*.gguf``.
The header walk is total: whatever the bytes, :func:`read_gguf_info` returns a
:class:`GgufInfo` or raises :class:`~app.util.errors.ModelFileError` with a
one-line reason, in bounded time and memory. No length read from the file is
used before it is checked against the bytes that remain and a sane cap; arrays
are walked without recursion, and arrays of arrays are refused, as llama.cpp
refuses them. Only regular files are opened (a FIFO would block the reader).
The walk itself is in ``app.gguf.header``; this module checks what it found.

llama.cpp trusts some header values and ends the whole process on a bad one
(``GGML_ASSERT``, ``std::bad_alloc``, a segfault in a compute kernel) or hangs.
:func:`read_gguf_info` checks those before llama.cpp sees the file. Each rule
below was found by loading mutated copies of the default model in a child
process; ``docs/notes/gguf.md`` lists what aborted and how.
"""

from __future__ import annotations

import errno
import math
import mmap
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.gguf.header import (
    FLOATS,
    INTS,
    STRING,
    U64,
    UINT32,
    Empty,
    Header,
    Malformed,
    NotGguf,
    NotRegular,
    int_value,
    is_split,
    is_text,
    mapped_file,
    parse_header,
    shown,
    walk_header,
)
from app.util.errors import ModelFileError

__all__ = ["GgufInfo", "_parse_header", "read_gguf_info"]

_parse_header = parse_header  # the old name, still imported by tests

GGML_MAX_NAME = 64  # gguf.cpp refuses tensor names this long or longer
TENSOR_ALIGNMENT = 32  # ggml-backend asserts a mapped weight buffer starts on this
LLAMA_MAX_LAYERS = 512  # llama.cpp asserts 0 < block_count <= this
INT64_MAX = (1 << 63) - 1

# What a real model can plausibly declare. The largest published context is 10M
# tokens (Llama 4 Scout); llama-cpp-python allocates context_length tokens for
# every tokenize call, so a 2^30 context is a MemoryError and 2^31 wraps negative.
MAX_CONTEXT = 1 << 24
MAX_WIDTH = 1 << 20  # embedding, feed-forward and head sizes
MAX_HEADS = 1 << 16
MAX_VOCAB = 1 << 21  # llama.cpp's token ids are int32; real vocabularies: up to 262k

# ggml types with no matrix-multiply or row-lookup kernel on the CPU: llama.cpp loads
# a weight of one of these and then segfaults or aborts at the first token.
_NO_KERNEL_TYPES = {9: "Q8_1", 15: "Q8_K", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64"}
_LAYER = re.compile(r"blk\.(\d+)\.")
_ROPE_SCALING = ("none", "linear", "yarn", "longrope")


@dataclass(frozen=True)
class GgufInfo:
    """What a GGUF file says about itself."""

    path: Path
    file_size: int
    architecture: str
    name: str
    context_length: int | None
    chat_template: str | None
    n_params: int
    n_layers: int | None
    file_type: str | None
    general_type: str | None
    n_embd_k_gqa: int | None = None  # K values per token per layer
    n_embd_v_gqa: int | None = None
    n_vocab: int | None = None
    adapter_type: str | None = None  # "lora" for LoRA adapters
    n_embd: int | None = None  # the width a vision projector must write
    # Next-token (MTP) blocks whose tensors the file holds: llama.cpp loads them only when
    # asked (``load_mtp``), and fails the load when asked for tensors the file lacks.
    mtp_layers: int = 0

    @property
    def display_name(self) -> str:
        return self.name or self.path.stem


def read_gguf_info(path: str | Path) -> GgufInfo:
    """Check that ``path`` is a complete GGUF file llama.cpp can load, and read it.

    Raises:
        ModelFileError: with a one-line reason a person can act on.
    """
    p = Path(path)

    def check(name: str, header: Header, buf: mmap.mmap) -> int:
        n_params = _check_tensors(name, header)
        _check_model(name, header, buf)
        return n_params

    header, n_params = checked_header(p, check)
    return _info(p, header, n_params)


def checked_header(
    p: Path, check: Callable[[str, Header, mmap.mmap], int], kind: str = "model"
) -> tuple[Header, int]:
    """``p``'s header and what ``check`` (run on the mapped file) returns; every way a
    file can fail to be read is a ``ModelFileError`` naming ``kind`` ("model",
    "projector").
    """
    name = shown(p.name)
    try:
        with mapped_file(p) as buf:
            header = walk_header(buf)
            return header, check(name, header, buf)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise ModelFileError(f"{kind.capitalize()} file not found: {shown(str(p))}") from exc
    except PermissionError as exc:
        raise ModelFileError(f"{name} cannot be read: permission denied.") from exc
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise ModelFileError(f"The path of {name} is too long for the file system.") from exc
        reason = shown(exc.strerror or str(exc))
        raise ModelFileError(f"{name} cannot be read: {reason}.") from exc
    except NotRegular as exc:
        raise ModelFileError(f"Not a file: {shown(str(p))} is {exc}.") from exc
    except Empty as exc:
        raise ModelFileError(f"{name} is empty (0 bytes); an interrupted download?") from exc
    except NotGguf as exc:
        raise ModelFileError(
            f"{name} is not a GGUF {kind} file (it starts with {exc.magic!r}, not b'GGUF')."
        ) from exc
    except Malformed as exc:
        raise ModelFileError(f"{name} is a damaged GGUF file: {exc}.") from exc
    except (ValueError, OverflowError, MemoryError, RecursionError, struct.error) as exc:
        # Not reached by any input the tests found; kept so a missed case is still a
        # refusal. tests/model/test_hostile_gguf.py fails if this message ever appears.
        raise ModelFileError(
            f"{name} is a damaged GGUF file (unexpected {type(exc).__name__})."
        ) from exc


def _info(p: Path, header: Header, n_params: int) -> GgufInfo:
    meta = header.meta
    arch = str(meta["general.architecture"])
    ctx = int_value(meta.get(f"{arch}.context_length"))
    layers = int_value(meta.get(f"{arch}.block_count"))
    ftype = int_value(meta.get("general.file_type"))
    template = meta.get("tokenizer.chat_template")
    n_embd = int_value(meta.get(f"{arch}.embedding_length"))
    n_head = int_value(meta.get(f"{arch}.attention.head_count"))
    n_head_kv = int_value(meta.get(f"{arch}.attention.head_count_kv")) or n_head
    head_dim = n_embd // n_head if n_embd and n_head else None
    key_len = int_value(meta.get(f"{arch}.attention.key_length")) or head_dim
    value_len = int_value(meta.get(f"{arch}.attention.value_length")) or head_dim
    general_type = meta.get("general.type")
    adapter_type = meta.get("adapter.type")
    return GgufInfo(
        path=p,
        file_size=header.size,
        architecture=arch,
        name=str(meta.get("general.name") or "") if is_text(header, "general.name") else "",
        context_length=ctx,
        chat_template=str(template) if isinstance(template, str) and template.strip() else None,
        n_params=n_params,
        n_layers=layers,
        file_type=_file_type_name(ftype) if ftype is not None else None,
        general_type=general_type if isinstance(general_type, str) else None,
        n_embd_k_gqa=key_len * n_head_kv if key_len and n_head_kv else None,
        n_embd_v_gqa=value_len * n_head_kv if value_len and n_head_kv else None,
        n_vocab=int_value(meta.get("tokenizer.ggml.tokens#len")),
        adapter_type=adapter_type if isinstance(adapter_type, str) else None,
        n_embd=n_embd,
        mtp_layers=_mtp_layers(header, arch),
    )


def _mtp_layers(header: Header, arch: str) -> int:
    """How many next-token blocks the metadata declares and the tensors carry (their
    ``nextn.eh_proj``, which every MTP graph in llama.cpp requires)."""
    declared = int_value(header.meta.get(f"{arch}.nextn_predict_layers")) or 0
    present = sum(1 for name, *_ in header.tensors if name.endswith(".nextn.eh_proj.weight"))
    return min(declared, present)


# ---------------------------------------------------------------------------------
# What llama.cpp does not check


def _check_tensors(name: str, h: Header) -> int:
    """gguf.cpp's tensor-table rules, and the types llama.cpp has kernels for.

    Returns:
        The number of parameters.

    Raises:
        ModelFileError, Malformed.
    """
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    if "general.alignment" in h.types:
        a = h.meta.get("general.alignment")
        if h.types["general.alignment"] != UINT32 or not isinstance(a, int) or a <= 0:
            raise Malformed("general.alignment is not a 32-bit unsigned integer")
        if a & (a - 1):
            raise Malformed(f"its alignment {a} is not a power of two")
    if h.tensors and h.data_start % TENSOR_ALIGNMENT:
        raise Malformed(
            f"its tensor data starts at byte {h.data_start:,}, which llama.cpp cannot map "
            f"(it needs a multiple of {TENSOR_ALIGNMENT})"
        )
    seen: set[str] = set()
    expected = 0
    data_end = h.data_start
    n_params = 0
    for tname, dims, ttype, offset in h.tensors:
        what = shown(tname)
        if len(tname.encode("utf-8")) >= GGML_MAX_NAME:
            raise Malformed(f"the tensor name {what} is too long")
        if tname in seen:
            raise Malformed(f"the tensor {what} appears twice")
        seen.add(tname)
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
        except (ValueError, KeyError) as exc:
            raise ModelFileError(f"{name} uses an unknown tensor type {ttype}.") from exc
        n = math.prod(dims)
        if any(d < 1 for d in dims) or n > INT64_MAX:
            raise Malformed(f"tensor {what} has shape {dims}")
        if dims and dims[0] % block:
            raise Malformed(f"tensor {what} has rows of {dims[0]}, not whole blocks of its type")
        if offset != expected:
            raise Malformed(f"tensor {what} is not where the tensor table says")
        nbytes = n // block * type_size
        expected += -(-nbytes // h.alignment) * h.alignment
        data_end = max(data_end, h.data_start + offset + nbytes)
        n_params += n
    if data_end > h.size:
        raise ModelFileError(
            f"{name} is truncated: its tensors need {data_end:,} bytes but the file has "
            f"{h.size:,}. Download it again."
        )
    # gguf-split --no-tensor-first-split leaves the first part without tensors.
    if not h.tensors and not is_split(h):
        raise ModelFileError(f"{name} holds no tensors; it is not a usable model.")
    return n_params


_Value = Callable[[str], "int | None"]  # an integer hyperparameter by key suffix
_Refuse = Callable[[str], ModelFileError]


def _check_model(name: str, h: Header, buf: mmap.mmap, allow_bert: bool = False) -> None:
    """Refuse the header values that make llama.cpp abort, crash or hang; ``allow_bert``
    lets a BERT (WordPiece) vocabulary through, for embedding models.

    Raises:
        ModelFileError: naming the value and what it should be.
    """
    meta, types = h.meta, h.types
    arch = meta.get("general.architecture")
    if types.get("general.architecture") != STRING or not arch:
        raise ModelFileError(f"{name} does not name its architecture (general.architecture).")
    if arch == "clip":
        raise ModelFileError(
            f"{name} is a vision projector (mmproj), not a model; open the model it belongs "
            "to (a projector in the model's folder is paired with it)."
        )

    def value(suffix: str) -> int | None:
        key = f"{arch}.{suffix}"
        return int_value(meta.get(key)) if types.get(key) in INTS else None

    def refuse(reason: str) -> ModelFileError:
        return ModelFileError(f"{name} cannot be loaded: {reason}.")

    _check_tensor_types(h, refuse)
    _check_layers(h, value, refuse)
    _check_sizes(h, str(arch), value, refuse)
    _check_floats(h, str(arch), refuse)
    _check_experts(h, value, refuse)
    _check_vocab(h, str(arch), buf, refuse, allow_bert)


def _check_tensor_types(h: Header, refuse: _Refuse) -> None:
    """Tensors: types llama.cpp computes with."""
    for tname, dims, ttype, _offset in h.tensors:
        vector = len(dims) <= 1 or tname.endswith("_norm.weight")
        if vector and ttype != 0:
            # ggml's CPU kernels take norm weights and biases in F32 only (GGML_ASSERT).
            raise refuse(f"the vector {shown(tname)} is not stored as F32")
        if not vector and ttype in _NO_KERNEL_TYPES:
            raise refuse(
                f"the weight {shown(tname)} is stored as {_NO_KERNEL_TYPES[ttype]}, "
                "which llama.cpp cannot multiply"
            )


def _check_layers(h: Header, value: _Value, refuse: _Refuse) -> None:
    """Layers: llama.cpp asserts 0 < block_count <= 512."""
    layers = value("block_count")
    if layers is None:
        return
    if not 0 < layers <= LLAMA_MAX_LAYERS:
        raise refuse(f"its header says {layers:,} layers; llama.cpp takes 1 to {LLAMA_MAX_LAYERS}")
    nextn = value("nextn_predict_layers") or 0
    if nextn > layers:
        raise refuse(f"it predicts with {nextn} extra layers but has only {layers}")
    # An adapter changes some layers; one part of a split model holds some of them.
    partial = h.meta.get("general.type") == "adapter" or is_split(h)
    held = {int(m.group(1)) for t, *_ in h.tensors if (m := _LAYER.match(t))}
    if held and not partial and max(held) + 1 not in (layers, layers - nextn):
        raise refuse(f"its header says {layers:,} layers but it holds {max(held) + 1}")


def _check_sizes(h: Header, arch: str, value: _Value, refuse: _Refuse) -> None:
    """Sizes llama.cpp allocates from, and the rotary embedding."""
    context = value("context_length")
    if context is not None and not 0 < context <= MAX_CONTEXT:
        raise refuse(f"its context length {context:,} is not between 1 and {MAX_CONTEXT:,}")
    window = value("attention.sliding_window")
    if window is not None and window > MAX_CONTEXT:
        raise refuse(f"its sliding window of {window:,} tokens is larger than {MAX_CONTEXT:,}")
    embd = value("embedding_length")
    if embd is not None and not 0 < embd <= MAX_WIDTH:
        raise refuse(f"its embedding length {embd:,} is not between 1 and {MAX_WIDTH:,}")
    for suffix in ("feed_forward_length", "attention.key_length", "attention.value_length"):
        size = value(suffix)
        if size is not None and size > MAX_WIDTH:
            raise refuse(f"its {suffix} of {size:,} is larger than {MAX_WIDTH:,}")
    for suffix in ("attention.head_count", "attention.head_count_kv"):
        key = f"{arch}.{suffix}"
        counts = h.small_arrays.get(key, ()) if key in h.arrays else (value(suffix),)
        if any(c is not None and not 0 <= c <= MAX_HEADS for c in counts):
            raise refuse(f"its {suffix} is not between 0 and {MAX_HEADS:,}")

    # Rotary embedding: n_rot 0 hangs the first decode; odd or wider than a head aborts.
    n_head = value("attention.head_count")
    head_dim = value("attention.key_length") or (embd // n_head if embd and n_head else None)
    for suffix in ("rope.dimension_count", "rope.dimension_count_swa"):
        n_rot = value(suffix)
        if n_rot is not None and (n_rot < 2 or n_rot % 2 or (head_dim and n_rot > head_dim)):
            limit = f" up to the head size {head_dim}" if head_dim else ""
            raise refuse(f"its {suffix} is {n_rot:,}; it must be an even number from 2{limit}")
    scaling_key = f"{arch}.rope.scaling.type"
    scaling = h.meta.get(scaling_key)
    if h.types.get(scaling_key) == STRING and scaling not in _ROPE_SCALING:
        raise refuse(f"its rope scaling type {shown(str(scaling))!r} is unknown")


def _check_floats(h: Header, arch: str, refuse: _Refuse) -> None:
    """NaN or infinity anywhere in the hyperparameters; epsilons must be > 0 (ggml
    asserts eps >= 0, and NaN fails that too)."""
    for key, vtype in h.types.items():
        if vtype not in FLOATS or not key.startswith(f"{arch}."):
            continue
        x = h.meta[key]
        if not math.isfinite(x):
            raise refuse(f"{shown(key)} is {x}")
        if ("epsilon" in key or key.endswith("_eps")) and x <= 0:
            raise refuse(f"{shown(key)} is {x}; it must be greater than 0")


def _check_experts(h: Header, value: _Value, refuse: _Refuse) -> None:
    """llama.cpp's GGML_ASSERTs on mixture-of-experts counts (load_hparams)."""
    arch = h.meta["general.architecture"]
    n_expert = value("expert_count") or 0
    used_key = f"{arch}.expert_used_count"
    used_all = (
        h.small_arrays.get(used_key, ()) if used_key in h.arrays else (value("expert_used_count"),)
    )
    used = max((u for u in used_all if u is not None), default=0)
    groups = value("expert_group_count") or 0
    group_used = value("expert_group_used_count") or 0
    if n_expert == 0:
        if used or groups:
            raise refuse(f"it uses {used} experts per token but has none")
        return
    if not 0 < used <= n_expert:
        raise refuse(f"it uses {used} of its {n_expert} experts per token")
    if groups >= n_expert:
        raise refuse(f"it has {groups} expert groups for {n_expert} experts")
    if groups > 1 and (n_expert % groups or not 0 < group_used < groups):
        raise refuse(f"its {n_expert} experts do not divide into {groups} groups as declared")


def _check_vocab(
    h: Header, arch: str, buf: mmap.mmap, refuse: _Refuse, allow_bert: bool = False
) -> None:
    """Vocabularies llama.cpp aborts on while loading them."""
    model_key = "tokenizer.ggml.model"
    tokenizer = h.meta.get(model_key) if h.types.get(model_key) == STRING else None
    if tokenizer == "bert" and not allow_bert:
        raise refuse("it is a BERT-style embedding model; Lamplight needs a model that writes text")
    if tokenizer == "rwkv" and "rwkv" not in arch:
        raise refuse(f"its RWKV tokenizer does not belong to the {shown(arch)} architecture")
    span = h.arrays.get("tokenizer.ggml.tokens")
    if span is None or span[0] != STRING:
        return
    # llama.cpp maps text -> id and asserts the map is as long as the list. It reads each
    # text as a C string, so a NUL ends it: "a\0b" and "a" are the same token.
    _itype, count, pos, _end = span
    if count > MAX_VOCAB:
        raise refuse(f"its vocabulary of {count:,} tokens is larger than {MAX_VOCAB:,}")
    texts: list[bytes] = []
    append = texts.append
    unpack = U64.unpack_from
    for _ in range(count):
        n = unpack(buf, pos)[0]
        pos += 8
        append(buf[pos : pos + n].partition(b"\0")[0])
        pos += n
    if len(set(texts)) == count:
        return
    seen: set[bytes] = set()
    for index, text in enumerate(texts):
        if text in seen:
            word = shown(text.decode("utf-8", errors="replace"), 40)
            raise refuse(f"its vocabulary lists the token {word!r} twice (again at {index})")
        seen.add(text)


def _file_type_name(value: int) -> str:
    try:
        from gguf import LlamaFileType

        return str(LlamaFileType(value).name).removeprefix("MOSTLY_")
    except ValueError:
        return str(value)
